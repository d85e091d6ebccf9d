"""tenacity and stamina around a `Dependency`: their retries come out of its retry budget.

Real tenacity and stamina, a real loopback server answering 503, a blocking stdlib HTTP
call (urllib) as the user's attempt.
"""

from __future__ import annotations

import urllib.request
from urllib.error import HTTPError

import pytest
import tenacity

import deadlines
from deadlines import AttemptRefused, Dependency, Event, Retry, RetryBudget, retry
from deadlines.lab.servers import HealthyServer

QUICK = Retry(attempts=3, backoff=0.001, jitter=False)


def refusals(events: list[Event]) -> list[tuple[str, str]]:
    """(dependency, reason) of each `AttemptRefused` seen."""
    return [(e.dependency, e.reason) for e in events if isinstance(e, AttemptRefused)]


def fetch(url: str) -> bytes:
    """One GET; a 503 raises `HTTPError` (closed: the test keeps no socket open)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            body: bytes = response.read()
            return body
    except HTTPError as exc:
        exc.close()
        raise


def overloaded(exc: BaseException) -> bool | None:
    """The request was sent and refused with a 503: retryable (GET); anything else is not."""
    return True if isinstance(exc, HTTPError) and exc.code == 503 else None


def floor_of_two() -> Dependency:
    """Three attempts a call, but two retries in all over 10 s (the budget's floor)."""
    budget = RetryBudget(percent=0.0, min_per_second=0.2, window=10)
    return Dependency("flaky", retry=QUICK, retry_budget=budget)


def with_tenacity(url: str, dependency: Dependency) -> None:
    """One call to `url`, retried by tenacity with our options for `dependency`."""
    options = retry.tenacity_options(QUICK, request_sent=overloaded, dependency=dependency)
    for attempt in tenacity.Retrying(**options):
        with attempt:
            fetch(url)


def with_stamina(url: str, dependency: Dependency) -> None:
    """One call to `url`, retried by stamina with our context for `dependency`."""
    for attempt in retry.stamina_context(QUICK, request_sent=overloaded, dependency=dependency):
        with attempt:
            fetch(url)


@pytest.mark.parametrize("call", [with_tenacity, with_stamina], ids=["tenacity", "stamina"])
def test_retries_stay_within_the_dependencys_budget(call: object, events: list[Event]) -> None:
    """Five calls to a 503 server: 5 first attempts + the 2 retries the budget allows."""
    dependency = floor_of_two()
    with HealthyServer(status=503) as server:
        for _ in range(5):
            with pytest.raises(HTTPError) as raised:
                call(server.url, dependency)  # type: ignore[operator]
            assert raised.value.code == 503  # the last error, as run_async raises it
        assert len(server.requests) == 7
    assert refusals(events) == [("flaky", "retry_budget")] * 4  # calls 2 (its 3rd try) to 5


@pytest.mark.parametrize("call", [with_tenacity, with_stamina], ids=["tenacity", "stamina"])
def test_a_retry_storm_is_capped_by_the_budget(call: object) -> None:
    """100 calls to a dependency down for everybody, 3 attempts each: 1.2x its load with a
    20 % budget (3x without one), as with our own clients."""
    budget = RetryBudget(percent=0.2, min_per_second=0.0)
    dependency = Dependency("down", retry=QUICK, retry_budget=budget)
    with HealthyServer(status=503) as server:
        for _ in range(100):
            with pytest.raises(HTTPError):
                call(server.url, dependency)  # type: ignore[operator]
        assert len(server.requests) == 120


@pytest.mark.parametrize("call", [with_tenacity, with_stamina], ids=["tenacity", "stamina"])
def test_each_call_counts_toward_the_budget_even_a_success(call: object) -> None:
    """Calls answered at once earn retries too: at 50 %, a failing call after 4
    successes gets its 2 retries (0.5 x 5 calls); alone, it gets none (0.5 x 1)."""
    for successes, sent in ((4, 3), (0, 1)):
        budget = RetryBudget(percent=0.5, min_per_second=0.0)
        dependency = Dependency("mixed", retry=QUICK, retry_budget=budget)
        with HealthyServer() as healthy:
            for _ in range(successes):
                call(healthy.url, dependency)  # type: ignore[operator]
        with HealthyServer(status=503) as down, pytest.raises(HTTPError):
            call(down.url, dependency)  # type: ignore[operator]
        assert len(down.requests) == sent


@pytest.mark.anyio
async def test_async_adapters_share_the_budget(events: list[Event]) -> None:
    """tenacity's AsyncRetrying and stamina's ``async for`` draw from one budget."""
    dependency = floor_of_two()

    async def tenacity_call(url: str) -> None:
        options = retry.tenacity_options(QUICK, request_sent=overloaded, dependency=dependency)
        async for attempt in tenacity.AsyncRetrying(**options):
            with attempt:
                fetch(url)

    async def stamina_call(url: str) -> None:
        context = retry.stamina_context(QUICK, request_sent=overloaded, dependency=dependency)
        async for attempt in context:
            with attempt:
                fetch(url)

    with HealthyServer(status=503) as server:
        with pytest.raises(HTTPError):
            await tenacity_call(server.url)  # both retries of the floor
        with pytest.raises(HTTPError):
            await stamina_call(server.url)  # none left
        assert len(server.requests) == 4
    assert refusals(events) == [("flaky", "retry_budget")]


def test_a_decorated_function_counts_each_call() -> None:
    """``tenacity.retry(**options)`` reuses one set of options: each call still deposits."""
    budget = RetryBudget(percent=0.5, min_per_second=0.0)
    dependency = Dependency("decorated", retry=QUICK, retry_budget=budget)
    options = retry.tenacity_options(QUICK, request_sent=overloaded, dependency=dependency)
    get = tenacity.retry(**options)(fetch)
    with HealthyServer() as healthy:
        for _ in range(3):
            assert get(healthy.url) == b"ok"
    with HealthyServer(status=503) as down, pytest.raises(HTTPError):
        get(down.url)  # 4 calls at 50 %: 2 retries
    assert len(down.requests) == 3


def test_a_dependency_without_a_budget_retries_by_its_policy() -> None:
    """No ``retry_budget``: every call gets the attempts its policy allows."""
    dependency = Dependency("unbudgeted", retry=QUICK)
    with HealthyServer(status=503) as server:
        for call in (with_tenacity, with_stamina):
            with pytest.raises(HTTPError):
                call(server.url, dependency)
        assert len(server.requests) == 6


def test_the_dependencys_min_useful_bounds_a_retry() -> None:
    """No retry starts with less than ``min_useful`` left before the deadline."""
    for min_useful, sent in ((0.0, 3), (0.5, 1)):
        dependency = Dependency("careful", retry=QUICK, min_useful=min_useful)
        for call in (with_tenacity, with_stamina):
            with HealthyServer(status=503) as server:
                with deadlines.scope(0.4), pytest.raises(HTTPError):
                    call(server.url, dependency)
                assert len(server.requests) == sent


def test_adapters_refuse_what_is_not_a_dependency() -> None:
    """``dependency=`` takes a `Dependency`: a name alone has no budget to draw from."""
    with pytest.raises(TypeError, match="dependency must be a deadlines.Dependency"):
        retry.tenacity_options(QUICK, dependency="flaky")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="dependency must be a deadlines.Dependency"):
        retry.stamina_hook(QUICK, dependency="flaky")  # type: ignore[arg-type]
