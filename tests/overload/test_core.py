"""The overload building blocks, without I/O: on a fake clock, exactly."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

import deadlines
from deadlines import (
    AdaptiveLimit,
    Admission,
    CoDel,
    Hedge,
    LatencyEstimate,
    RetryBudget,
    Throttle,
)
from deadlines.testing import FakeClock


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    """A fake clock installed for the test."""
    with FakeClock() as fake:
        yield fake


# LatencyEstimate


def test_latency_estimate_is_none_until_enough_samples() -> None:
    """No quantile before min_samples: a guess would be worse than none."""
    estimate = LatencyEstimate(10, min_samples=3)
    estimate.add(0.1)
    estimate.add(0.2)
    assert estimate.quantile(0.5) is None
    estimate.add(0.3)
    assert estimate.quantile(0.5) == pytest.approx(0.2)


def test_latency_estimate_keeps_only_the_last_samples() -> None:
    """Memory is bounded: the ring holds `size` samples and follows the service."""
    estimate = LatencyEstimate(100, min_samples=1)
    for _ in range(1000):
        estimate.add(1.0)
    for _ in range(100):
        estimate.add(0.01)
    assert estimate.count == 100
    assert estimate.quantile(0.99) == pytest.approx(0.01)


def test_latency_estimate_quantiles() -> None:
    """p50 and p95 of 1..100 ms."""
    estimate = LatencyEstimate(100, min_samples=1)
    for ms in range(1, 101):
        estimate.add(ms / 1000)
    assert estimate.quantile(0.5) == pytest.approx(0.051)
    assert estimate.quantile(0.95) == pytest.approx(0.096)
    assert estimate.quantile(1.0) == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"size": 0}, ValueError, "size must be between 1"),
        ({"size": 10, "min_samples": 11}, ValueError, "min_samples must be between 1 and 10"),
        ({"size": 1.5}, TypeError, "size must be an int"),
    ],
)
def test_latency_estimate_validates(kwargs: dict[str, object], error: type, message: str) -> None:
    """Bad sizes are refused with a message naming the argument."""
    with pytest.raises(error, match=message):
        LatencyEstimate(**kwargs)  # type: ignore[arg-type]


# RetryBudget


def test_retry_budget_allows_the_floor_then_a_share_of_calls(clock: FakeClock) -> None:
    """Floor: min_per_second * window retries; then percent of the calls in the window."""
    budget = RetryBudget(percent=0.1, min_per_second=0.5, window=10)
    assert [budget.withdraw() for _ in range(6)] == [True] * 5 + [False]  # floor: 5
    for _ in range(100):
        budget.deposit()
    # 100 calls: 10 more retries on top of the floor of 5.
    assert sum(budget.withdraw() for _ in range(20)) == 10


def test_retry_budget_forgets_after_the_window(clock: FakeClock) -> None:
    """Retries and calls older than the window no longer count."""
    budget = RetryBudget(percent=0.0, min_per_second=0.1, window=10)  # floor: 1
    assert budget.withdraw()
    assert not budget.withdraw()
    clock.advance(5)
    assert not budget.withdraw()
    clock.advance(6)
    assert budget.withdraw()


def test_retry_budget_validates() -> None:
    """A share outside [0, 1], a negative floor, a zero window: refused."""
    with pytest.raises(ValueError, match=r"percent must be in \[0, 1\]"):
        RetryBudget(percent=1.5)
    with pytest.raises(ValueError, match="min_per_second must be between 0"):
        RetryBudget(min_per_second=-1)
    with pytest.raises(ValueError, match="window must be > 0"):
        RetryBudget(window=0)


# Throttle


def test_throttle_refuses_nothing_while_the_dependency_accepts(clock: FakeClock) -> None:
    """A healthy dependency: probability 0, every call admitted."""
    throttle = Throttle(rand=lambda: 0.0)
    for _ in range(100):
        assert throttle.admit()
        throttle.record(True)
    assert throttle.probability() == 0.0


def test_throttle_probability_follows_the_sre_formula(clock: FakeClock) -> None:
    """(requests - k * accepts) / (requests + 1), over the window."""
    throttle = Throttle(k=2.0, window=60)
    for accepted in [True] * 10 + [False] * 90:
        throttle.record(accepted)
    assert throttle.probability() == pytest.approx((100 - 2 * 10) / 101)
    clock.advance(61)
    assert throttle.probability() == 0.0


def test_throttle_refusals_count_as_requests(clock: FakeClock) -> None:
    """A call refused locally is still a request: refusals keep the rate from rising back."""
    draws = itertools.cycle([0.0, 0.99])
    throttle = Throttle(k=1.0, rand=lambda: next(draws))
    for _ in range(10):
        throttle.record(False)
    before = throttle.probability()
    assert not throttle.admit()  # draw 0.0 < p
    assert throttle.probability() > before
    assert throttle.admit()  # draw 0.99 >= p (10 + 1 requests, 0 accepts: 11/12)


def test_throttle_validates() -> None:
    """k below 1 would refuse a healthy dependency."""
    with pytest.raises(ValueError, match="k must be between 1 and 100"):
        Throttle(k=0.5)


# AdaptiveLimit


def _saturate(limit: AdaptiveLimit, latency: float, rounds: int) -> None:
    """Run `rounds` rounds of as many calls as the limit allows, each taking `latency`."""
    for _ in range(rounds):
        held = 0
        while limit.acquire():
            held += 1
        for _ in range(held):
            limit.release(latency)


def test_adaptive_limit_grows_while_latency_holds() -> None:
    """Steady latency at full use: the limit rises, up to max_limit."""
    limit = AdaptiveLimit(initial=10, max_limit=50)
    _saturate(limit, 0.01, 50)
    assert limit.limit == 50


def test_adaptive_limit_shrinks_when_latency_rises() -> None:
    """Latency several times its long-run level: the limit comes down, toward min_limit."""
    limit = AdaptiveLimit(initial=40, min_limit=2, max_limit=40)
    _saturate(limit, 0.01, 20)
    assert limit.limit == 40
    _saturate(limit, 0.2, 40)
    assert limit.limit <= 10


def test_adaptive_limit_cut_by_failures_and_refuses_above_it() -> None:
    """A failed call cuts the limit by 10 %; over the limit, acquire says no."""
    limit = AdaptiveLimit(initial=10)
    assert all(limit.acquire() for _ in range(10))
    assert not limit.acquire()
    assert limit.release(None, failed=True) == 9
    assert limit.in_flight == 9
    assert not limit.acquire()


def test_adaptive_limit_ignores_an_idle_limit() -> None:
    """With less than half the places used, a sample moves nothing."""
    limit = AdaptiveLimit(initial=20)
    for _ in range(100):
        assert limit.acquire()
        assert limit.release(5.0) is None
    assert limit.limit == 20


def test_adaptive_limit_cancelled_call_says_nothing() -> None:
    """No latency and no failure (cancelled): the place is given back, the limit kept."""
    limit = AdaptiveLimit(initial=4)
    assert limit.acquire()
    assert limit.release(None) is None
    assert (limit.limit, limit.in_flight) == (4, 0)


def test_adaptive_limit_validates() -> None:
    """initial outside [min_limit, max_limit] is refused."""
    with pytest.raises(ValueError, match="initial must be between min_limit"):
        AdaptiveLimit(initial=5, min_limit=10, max_limit=20)


# Hedge


def test_hedge_waits_for_samples_then_uses_the_quantile(clock: FakeClock) -> None:
    """No backup before min_samples; then one at the p95, if it fits the deadline."""
    hedge = Hedge(min_samples=20, percent=1.0)
    assert hedge.delay(10.0) is None
    for ms in range(1, 101):
        hedge.latency.add(ms / 1000)
    assert hedge.delay(10.0) == pytest.approx(0.096)
    # The backup must have the median (51 ms) left after its p95 start.
    assert hedge.delay(0.14) is None
    assert hedge.delay(float("inf")) == pytest.approx(0.096)


def test_hedge_rate_is_capped(clock: FakeClock) -> None:
    """Backups at most `percent` of the calls in the window (no floor)."""
    hedge = Hedge(percent=0.1, min_per_second=0.0, min_samples=1)
    hedge.latency.add(0.01)
    for _ in range(50):
        hedge.delay(1.0)
    assert sum(hedge.allow() for _ in range(20)) == 5


def test_hedge_floor_lets_a_quiet_dependency_hedge(clock: FakeClock) -> None:
    """5 calls in 10 s earn no backup at 5 %; the floor (0.2/s: 2 per 10 s) allows two,
    and two more once the window has moved on."""
    quiet, floored = (
        Hedge(percent=0.05, min_per_second=floor, window=10, min_samples=1) for floor in (0.0, 0.2)
    )
    for hedge in (quiet, floored):
        hedge.latency.add(0.01)
        for _ in range(5):
            hedge.delay(1.0)
    assert not quiet.allow()
    assert [floored.allow() for _ in range(3)] == [True, True, False]
    clock.advance(11)
    assert [floored.allow() for _ in range(3)] == [True, True, False]


def test_hedge_floor_adds_to_the_share(clock: FakeClock) -> None:
    """The default floor, one a second: 10 per 10 s on top of 5 % of the calls."""
    hedge = Hedge(min_samples=1)
    assert (hedge.percent, hedge.min_per_second) == (0.05, 1.0)
    for _ in range(100):
        hedge.delay(1.0)
    assert sum(hedge.allow() for _ in range(30)) == 15  # 5 % of 100, plus 10


def test_hedge_validates() -> None:
    """A share outside [0, 1] or a negative floor is refused, naming the argument."""
    with pytest.raises(ValueError, match=r"percent must be in \[0, 1\]"):
        Hedge(percent=2.0)
    with pytest.raises(ValueError, match="min_per_second must be between 0"):
        Hedge(min_per_second=-1.0)


# Admission


def test_admission_admits_until_the_route_is_learned(clock: FakeClock) -> None:
    """No estimate yet: every request with time left is admitted."""
    admission = Admission(min_samples=5)
    assert admission.decide("/a", 0.001) == "admit"
    assert admission.expected("/a") is None


def test_admission_tells_late_from_shed(clock: FakeClock) -> None:
    """Expired on arrival: late (504). Less than the service time left: shed (503)."""
    admission = Admission(min_samples=5, rejection_budget=1.0)
    for _ in range(5):
        admission.observe("/a", 0.2)
    assert admission.decide("/a", 0.0) == "late"
    assert admission.decide("/a", 0.1) == "shed"
    assert admission.decide("/a", 0.3) == "admit"
    assert admission.decide("/b", 0.1) == "admit"  # another route, not learned
    assert admission.retry_after("/a") == 1


def test_admission_keeps_rejections_within_the_budget(clock: FakeClock) -> None:
    """At most rejection_budget of the requests are refused; the rest are admitted."""
    admission = Admission(min_samples=1, rejection_budget=0.2)
    admission.observe("/a", 1.0)
    decisions = [admission.decide("/a", 0.5) for _ in range(100)]
    assert decisions.count("shed") == 20
    assert decisions.count("admit") == 80


def test_admission_memory_is_bounded_in_routes() -> None:
    """Routes past max_routes are not learned (and so always admitted)."""
    admission = Admission(min_samples=1, max_routes=2, rejection_budget=1.0)
    for route in ("/a", "/b", "/c"):
        admission.observe(route, 1.0)
    assert admission.expected("/b") == 1.0
    assert admission.expected("/c") is None
    assert admission.decide("/c", 0.5) == "admit"


# CoDel


def test_codel_sheds_nothing_on_a_burst_that_drains(clock: FakeClock) -> None:
    """Short of a standing queue, only waits above `interval` are shed."""
    codel = CoDel(target=0.005, interval=0.1)
    assert not codel.shed(0.05)
    assert not codel.shed(0.001)  # the queue drained inside the interval
    clock.advance(0.1)
    assert not codel.shed(0.05)
    assert not codel.overloaded
    assert codel.shed(0.2)  # longer than the interval: shed anyway


def test_codel_cuts_a_standing_queue_to_target(clock: FakeClock) -> None:
    """Every wait above target for a whole interval: then anything above target is shed."""
    codel = CoDel(target=0.005, interval=0.1)
    for _ in range(10):
        assert not codel.shed(0.05)
        clock.advance(0.011)
    assert codel.shed(0.05)
    assert codel.overloaded
    assert not codel.shed(0.004)
    clock.advance(0.1)
    assert not codel.shed(0.05)  # the interval with a 4 ms wait had no standing queue
    assert not codel.overloaded


def test_codel_validates() -> None:
    """target must be shorter than interval."""
    with pytest.raises(ValueError, match="must be shorter than interval"):
        CoDel(target=0.2, interval=0.1)


def test_call_refused_is_a_deadlines_error_that_says_nothing_was_sent() -> None:
    """The error names the dependency and why, and is never a timeout."""
    exc = deadlines.CallRefused(reason="limit", dependency="pricing")
    assert isinstance(exc, deadlines.DeadlinesError)
    assert not isinstance(exc, TimeoutError)
    assert exc.request_sent is False
    assert str(exc) == "pricing: call refused, its concurrency limit is reached; nothing was sent"


def test_codel_an_idle_interval_is_no_standing_queue(clock: FakeClock) -> None:
    """After an interval with no request at all, a burst is not taken for a standing queue."""
    codel = CoDel(target=0.005, interval=0.1)
    clock.advance(1.0)
    assert not codel.shed(0.05)
    assert not codel.overloaded
