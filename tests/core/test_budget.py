"""CallBudget: the one place where per-call limits and their errors are decided."""

from __future__ import annotations

import math

import pytest

import deadlines
from deadlines import (
    BudgetExhausted,
    CallBudget,
    CallFinished,
    CallStarted,
    ConnectTimeout,
    DeadlineExceeded,
    Dependency,
    HeadersTimeout,
    IdleTimeout,
    PoolTimeout,
    TotalTimeout,
)
from deadlines.testing import FakeClock

DEP = Dependency("pricing", connect=1, headers=2, idle=0.5, total=5, pool_wait=0.3, min_useful=0.04)


@pytest.fixture
def clock() -> FakeClock:
    """Exact time for every test here."""
    with FakeClock() as fake:
        yield fake


def test_without_deadline_caps_apply(clock: FakeClock) -> None:
    """With no request deadline every phase gets its own cap."""
    b = CallBudget(DEP)
    assert b.budget == math.inf
    assert b.limit("pool") == pytest.approx(0.3)
    assert b.limit("connect") == pytest.approx(1)
    assert b.limit("headers") == pytest.approx(2)
    assert b.limit("idle") == pytest.approx(0.5)
    assert b.limit("total") == pytest.approx(5)
    assert isinstance(b.timeout("connect"), ConnectTimeout)
    assert isinstance(b.timeout("pool"), PoolTimeout)
    assert isinstance(b.timeout("headers"), HeadersTimeout)
    assert isinstance(b.timeout("idle"), IdleTimeout)


def test_deadline_binds_when_shorter(clock: FakeClock) -> None:
    """A request deadline shorter than the cap becomes the limit and the error."""
    with deadlines.scope(1.5):
        b = CallBudget(DEP)
        assert b.limit("headers") == pytest.approx(1.5)
        err = b.timeout("headers")
    assert type(err) is DeadlineExceeded
    assert err.phase == "headers" and err.request_sent is True
    assert err.limit == pytest.approx(1.5)


def test_pool_time_counts_toward_total(clock: FakeClock) -> None:
    """Time spent in the pool is taken out of the total: a 5 s call stays a 5 s call."""
    b = CallBudget(DEP)
    clock.advance(0.3)  # waited in the pool
    clock.advance(3.0)  # connected and sent
    assert b.limit("headers") == pytest.approx(1.7)
    err = b.timeout("headers")
    assert type(err) is TotalTimeout
    assert err.phase == "headers"
    assert err.limit == 5


def test_fail_fast_below_min_useful(clock: FakeClock) -> None:
    """Less budget than the call needs raises before anything is sent."""
    seen: list[object] = []
    unsubscribe = deadlines.observe(seen.append)
    try:
        with deadlines.scope(0.03), pytest.raises(BudgetExhausted) as info:
            CallBudget(DEP)
    finally:
        unsubscribe()
    assert info.value.remaining == pytest.approx(0.03)
    assert info.value.min_useful == 0.04
    assert [type(e) for e in seen] == [CallFinished]
    assert isinstance(seen[0], CallFinished) and seen[0].outcome == "budget_exhausted"


def test_expired_deadline_fails_fast_even_without_min_useful(clock: FakeClock) -> None:
    """A zero budget never starts a call."""
    with deadlines.scope(0), pytest.raises(BudgetExhausted):
        CallBudget(Dependency("x"))


def test_header_is_time_to_the_calls_end(clock: FakeClock) -> None:
    """The next hop is told the smaller of the deadline and the call's own total."""
    with deadlines.scope(10):
        assert CallBudget(DEP).header_ms() == "5000"
    with deadlines.scope(1.4509):
        assert CallBudget(DEP).header_ms() == "1450"


def test_events_report_start_and_outcome(clock: FakeClock) -> None:
    """Observers see the call start and finish with its phase and pool wait."""
    seen: list[deadlines.Event] = []
    unsubscribe = deadlines.observe(seen.append)
    try:
        with pytest.raises(HeadersTimeout), CallBudget(DEP) as b:
            b.pool_wait = 0.12
            b.limit("headers")
            clock.advance(2)
            raise b.timeout("headers")
        with CallBudget(DEP):
            clock.advance(0.01)
    finally:
        unsubscribe()
    started, failed, _, ok = seen
    assert isinstance(started, CallStarted) and started.dependency == "pricing"
    assert isinstance(failed, CallFinished)
    assert (failed.outcome, failed.phase, failed.pool_wait) == ("timeout", "headers", 0.12)
    assert failed.duration == pytest.approx(2)
    assert isinstance(ok, CallFinished) and ok.outcome == "ok"


def test_observer_errors_are_isolated(clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken observer never fails the call; the error goes to sys.unraisablehook."""
    import sys

    reported: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", reported.append)

    def broken(event: deadlines.Event) -> None:
        raise RuntimeError("exporter bug")

    unsubscribe = deadlines.observe(broken)
    try:
        with CallBudget(DEP):
            pass
    finally:
        unsubscribe()
    assert len(reported) == 2


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_scope_expiry_names_the_call_it_cut() -> None:
    """When the request's scope cancels a call, its DeadlineExceeded names the call's phase."""
    import anyio

    with pytest.raises(DeadlineExceeded) as info:
        async with deadlines.scope(0.05):
            with CallBudget(Dependency("pricing")) as budget:
                budget.limit("headers")
                budget.request_sent = True
                await anyio.sleep(10)
    err = info.value
    assert err.dependency == "pricing"
    assert err.phase == "headers"
    assert err.request_sent is True
    assert "pricing: deadline exceeded during headers" in str(err)


@pytest.mark.anyio
async def test_foreign_cancellation_leaves_no_note() -> None:
    """A call cancelled by something other than the deadline does not label a later expiry."""
    import anyio

    with pytest.raises(DeadlineExceeded) as info:
        async with deadlines.scope(0.2):
            with anyio.move_on_after(0.01), CallBudget(Dependency("recs")):
                await anyio.sleep(10)
            await anyio.sleep(10)
    assert info.value.dependency is None
    assert info.value.phase is None
