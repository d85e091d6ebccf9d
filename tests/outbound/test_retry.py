"""deadlines.retry: retries inside the budget, by phase and method, on real servers."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator

import anyio
import pytest
import tenacity
from outbound_helpers import LATE, eventually

import deadlines
import deadlines.aiohttp as daiohttp
import deadlines.httpx as dhttpx
from deadlines import ConnectTimeout, DeadlineExceeded, Dependency, HeadersTimeout, Retry, retry
from deadlines.lab.servers import HealthyServer, SilentServer, TLSNeverServer
from deadlines.testing import FakeClock

pytestmark = pytest.mark.realtime

FAST = Retry(attempts=3, backoff=0.01, jitter=False)
DEP = Dependency("t", connect=0.15, headers=0.15, total=2, retry=FAST)


# The rule, without I/O.


@pytest.mark.parametrize(
    ("method", "sent", "key", "allowed"),
    [
        ("POST", False, False, True),
        ("POST", True, False, False),
        ("POST", True, True, True),
        ("GET", True, False, True),
        ("put", True, False, True),
        ("PATCH", True, False, False),
    ],
)
def test_may_retry_by_method_and_phase(method: str, sent: bool, key: bool, allowed: bool) -> None:
    """Unsent failures retry for any method; sent ones only if idempotent or keyed."""
    assert retry.may_retry(method, request_sent=sent, idempotency_key=key) is allowed


def test_deadline_errors_are_never_retried() -> None:
    """A spent budget is not a transient failure."""
    assert retry.request_sent(DeadlineExceeded()) is None
    assert retry.request_sent(ConnectTimeout(limit=1, elapsed=1)) is False
    assert retry.request_sent(HeadersTimeout(limit=1, elapsed=1)) is True
    assert retry.request_sent(ValueError()) is None


def test_run_async_stops_when_the_next_attempt_would_not_fit() -> None:
    """Exactly: a retry only while time left > expected + backoff; sleeps end in time."""
    policy = Retry(attempts=10, backoff=0.05, jitter=False, expected=0.2)
    clock = FakeClock()
    calls: list[float] = []

    async def attempt() -> None:
        calls.append(clock.now())
        await asyncio.sleep(0.01)  # the attempt's own time
        raise ConnectTimeout(limit=0.01, elapsed=0.01)

    async def main() -> None:
        async with deadlines.scope(0.4):
            await retry.run_async(attempt, policy=policy, method="POST")

    with pytest.raises(ConnectTimeout):
        clock.run(main())
    start = calls[0]
    # Fails at 0.01 with 0.39 left > 0.2 + 0.05: sleep 0.05. Fails at 0.07 with 0.33 left
    # > 0.2 + 0.1: sleep 0.1. Fails at 0.18 with 0.22 left < 0.2 + 0.2: gives up there.
    assert [round(t - start, 3) for t in calls] == [0.0, 0.06, 0.17]
    assert clock.now() - start == pytest.approx(0.18)


def test_run_sync_retries_a_result_then_returns_the_last() -> None:
    """A retryable result (a 503) is retried; when no retry is left it is returned."""
    results = iter([503, 503, 200])
    released: list[int] = []
    got = retry.run_sync(
        lambda: next(results),
        policy=FAST,
        retry_response=lambda status: status == 503,
        discard=released.append,
    )
    assert got == 200
    assert released == [503, 503]


# httpx, against real servers.


def test_post_failing_in_connect_is_retried() -> None:
    """A POST that never reached the server (TLS never completed) is tried again."""
    with TLSNeverServer() as server, dhttpx.Client(DEP, verify=False) as client:
        with pytest.raises(ConnectTimeout):
            client.post(server.url, content=b"charge")
        assert server.wait_opened(3)
        assert server.opened == 3


def test_post_timing_out_in_headers_is_not_retried() -> None:
    """A POST that was sent has an unknown outcome: never sent twice."""
    with SilentServer() as server, dhttpx.Client(DEP) as client:
        with pytest.raises(HeadersTimeout):
            client.post(server.url, content=b"charge")
        assert server.wait_requests(1)
        time.sleep(0.2)  # a second attempt, if any, would have arrived by now
        assert len(server.requests) == 1


def test_post_with_idempotency_key_is_retried_after_headers_timeout() -> None:
    """An Idempotency-Key makes a sent POST safe to try again."""
    with SilentServer() as server, dhttpx.Client(DEP) as client:
        with pytest.raises(HeadersTimeout):
            client.post(server.url, content=b"charge", headers={"Idempotency-Key": "k1"})
        assert server.wait_requests(3)
        assert [r.headers["idempotency-key"] for r in server.requests] == ["k1"] * 3


def test_post_with_a_streamed_body_is_not_replayed() -> None:
    """A body that cannot be sent twice (a generator) is not retried after sending."""

    def body() -> Iterator[bytes]:
        yield b"charge"

    with SilentServer() as server, dhttpx.Client(DEP) as client:
        with pytest.raises(HeadersTimeout):
            client.post(server.url, content=body(), headers={"Idempotency-Key": "k1"})
        assert server.wait_requests(1)
        time.sleep(0.2)  # a replay, if any, would have arrived by now
        assert len(server.requests) == 1


@pytest.mark.anyio
async def test_async_get_timing_out_in_headers_is_retried() -> None:
    """GET is idempotent: retried after a headers timeout, each attempt its own limits."""
    with SilentServer() as server:
        async with dhttpx.AsyncClient(DEP) as client:
            start = time.monotonic()
            with pytest.raises(HeadersTimeout):
                await client.get(server.url)
            assert 0.45 - 0.03 <= time.monotonic() - start <= 0.45 + LATE
            assert len(server.requests) == 3


@pytest.mark.anyio
async def test_retries_never_outlive_the_deadline() -> None:
    """Ten attempts allowed, 0.5 s of budget: the call ends inside the deadline."""
    dep = Dependency(
        "t", connect=0.2, retry=Retry(attempts=10, backoff=0.01, jitter=False, expected=0.2)
    )
    with TLSNeverServer() as server:
        async with dhttpx.AsyncClient(dep, verify=False) as client:
            start = time.monotonic()
            with pytest.raises((ConnectTimeout, DeadlineExceeded)):
                async with deadlines.scope(0.5):
                    await client.get(server.url)
            assert time.monotonic() - start <= 0.5 + LATE
            assert server.opened < 10


def test_sync_retries_never_outlive_the_deadline() -> None:
    """The blocking client's retries end inside the deadline too."""
    dep = Dependency("t", connect=0.2, retry=Retry(attempts=10, backoff=0.01, jitter=False))
    with TLSNeverServer() as server, dhttpx.Client(dep, verify=False) as client:
        start = time.monotonic()
        with deadlines.scope(0.5), pytest.raises((ConnectTimeout, DeadlineExceeded)):
            client.get(server.url)
        assert time.monotonic() - start <= 0.5 + LATE
        assert server.opened <= 3


def test_backoff_longer_than_the_time_left_means_no_retry() -> None:
    """A retry whose backoff would not fit before the deadline is not attempted."""
    dep = Dependency("t", connect=0.15, retry=Retry(attempts=3, backoff=2.0, jitter=False))
    with TLSNeverServer() as server, dhttpx.Client(dep, verify=False) as client:
        start = time.monotonic()
        with deadlines.scope(1.0), pytest.raises(ConnectTimeout):
            client.get(server.url)
        assert time.monotonic() - start < 0.15 + LATE
        assert server.opened == 1


def test_503_is_retried_for_get_and_returned_at_the_end() -> None:
    """A 503 to a GET is retried; the last response is returned, not raised."""
    with HealthyServer(status=503) as server, dhttpx.Client(DEP) as client:
        assert client.get(server.url).status_code == 503
        assert len(server.requests) == 3
        assert client.post(server.url, content=b"x").status_code == 503
        assert len(server.requests) == 4  # a POST was not retried


# aiohttp, against real servers.


@pytest.mark.anyio
async def test_aiohttp_post_connect_failure_retried_headers_failure_not() -> None:
    """aiohttp: an unsent POST is retried, a sent one is not, a keyed one is."""
    with TLSNeverServer() as tls, SilentServer() as silent:
        async with daiohttp.session(DEP, ssl=False) as http:
            with pytest.raises(ConnectTimeout):
                await http.post(tls.url, data=b"charge")
            assert await eventually(lambda: tls.opened == 3)
            with pytest.raises(HeadersTimeout):
                await http.post(silent.url, data=b"charge")
            # Every attempt happened before the call raised; the server may record late.
            assert await eventually(lambda: len(silent.requests) >= 1)
            await anyio.sleep(0.2)
            assert len(silent.requests) == 1
            with pytest.raises(HeadersTimeout):
                await http.post(silent.url, data=b"charge", headers={"Idempotency-Key": "k"})
            assert await eventually(lambda: len(silent.requests) == 4)


@pytest.mark.anyio
async def test_aiohttp_503_is_retried_for_get() -> None:
    """aiohttp: a 503 to a GET is retried and the last response returned."""
    with HealthyServer(status=503) as server:
        async with daiohttp.session(DEP) as http, http.get(server.url) as response:
            assert response.status == 503
        assert len(server.requests) == 3


# tenacity and stamina, with the same rule.


def test_tenacity_options_stop_at_the_deadline() -> None:
    """tenacity with our options retries unsent failures and stops before the deadline."""
    calls: list[float] = []

    def charge() -> None:
        calls.append(time.monotonic())
        raise ConnectTimeout(limit=0.1, elapsed=0.1)

    policy = Retry(attempts=50, backoff=0.05, jitter=False, expected=0.05)
    start = time.monotonic()
    with deadlines.scope(0.4), pytest.raises(ConnectTimeout):
        for attempt in tenacity.Retrying(**retry.tenacity_options(policy, method="POST")):
            with attempt:
                charge()
    assert time.monotonic() - start <= 0.4 + 0.1
    assert 2 <= len(calls) < 50


def test_tenacity_options_do_not_retry_a_sent_post() -> None:
    """tenacity with our options does not resend a POST that may have been processed."""
    calls = 0

    def charge() -> None:
        nonlocal calls
        calls += 1
        raise HeadersTimeout(limit=0.1, elapsed=0.1)

    with pytest.raises(HeadersTimeout):
        tenacity.retry(**retry.tenacity_options(FAST, method="POST"))(charge)()
    assert calls == 1


def test_tenacity_wait_is_cut_at_the_deadline() -> None:
    """A tenacity wait never sleeps past the deadline."""
    wait = retry.wait_until_deadline(tenacity.wait_fixed(5))
    state = tenacity.RetryCallState(tenacity.Retrying(), None, (), {})
    with deadlines.scope(0.2):
        assert wait(state) <= 0.2


def test_stamina_context_stops_at_the_deadline() -> None:
    """stamina with our hook retries an unsent failure and never outlives the deadline."""
    calls = 0
    policy = Retry(attempts=50, backoff=0.05, jitter=False, expected=0.05)
    start = time.monotonic()
    with deadlines.scope(0.4), pytest.raises(ConnectTimeout):
        for attempt in retry.stamina_context(policy, method="POST"):
            with attempt:
                calls += 1
                raise ConnectTimeout(limit=0.1, elapsed=0.1)
    assert time.monotonic() - start <= 0.4 + 0.1
    assert 2 <= calls < 50


def test_missing_retry_library_says_what_to_install() -> None:
    """Without tenacity, asking for its condition names the extra to install."""
    code = (
        "import sys; sys.modules['tenacity'] = None\n"
        "import deadlines.retry\n"
        "deadlines.retry.stop_at_deadline()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode != 0
    assert "deadlines[retry]" in result.stderr
