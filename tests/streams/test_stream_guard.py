"""`streams.guard`: the three limits, the errors they raise, and closing the source."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from datetime import timedelta

import anyio
import pytest

import deadlines
from deadlines import streams
from deadlines.testing import FakeClock


class Source:
    """An async stream whose items arrive after the given delays, then (maybe) forever never."""

    def __init__(self, delays: list[float], *, then_stall: bool = False) -> None:
        self.delays = list(delays)
        self.then_stall = then_stall
        self.sent = 0
        self.closed = False

    def __aiter__(self) -> Source:
        return self

    async def __anext__(self) -> int:
        if not self.delays:
            if self.then_stall:
                await anyio.sleep(math.inf)
            raise StopAsyncIteration
        await anyio.sleep(self.delays.pop(0))
        self.sent += 1
        return self.sent

    async def aclose(self) -> None:
        self.closed = True


async def collect(stream: AsyncIterator[int]) -> list[int]:
    return [item async for item in stream]


def test_healthy_stream_yields_every_item_and_closes() -> None:
    """A stream within its limits yields all items in order and is closed at the end."""
    source = Source([0.5, 1.0, 1.0])
    got = FakeClock().run(collect(streams.guard(source, first=1, idle=2, total=10)))
    assert got == [1, 2, 3]
    assert source.closed


def test_first_item_timeout_fires_exactly_and_closes() -> None:
    """No first item within `first` raises FirstItemTimeout at that instant and closes."""
    clock = FakeClock()
    source = Source([10.0])
    with pytest.raises(streams.FirstItemTimeout) as info:
        clock.run(collect(streams.guard(source, first=2.5, idle=5, total=60, name="llm")))
    assert clock.now() == pytest.approx(1002.5)
    assert source.closed and source.sent == 0
    exc = info.value
    assert isinstance(exc, deadlines.HeadersTimeout | deadlines.CallTimeout | TimeoutError)
    assert (exc.phase, exc.kind, exc.limit, exc.dependency) == ("headers", "first item", 2.5, "llm")
    assert exc.request_sent is True and not exc.retry_safe
    assert "llm: first item timeout" in str(exc)


def test_idle_gap_raises_stream_idle_timeout() -> None:
    """A gap longer than `idle` after some items raises StreamIdleTimeout in phase body."""
    clock = FakeClock()
    source = Source([0.1, 0.1], then_stall=True)
    seen: list[int] = []

    async def main() -> None:
        async for item in streams.guard(source, first=1, idle=timedelta(seconds=3), total=60):
            seen.append(item)

    with pytest.raises(streams.StreamIdleTimeout) as info:
        clock.run(main())
    assert seen == [1, 2]
    assert clock.now() == pytest.approx(1000.2 + 3)
    assert info.value.phase == "body" and info.value.kind == "idle"
    assert isinstance(info.value, deadlines.IdleTimeout)
    assert source.closed


def test_trickle_is_caught_only_by_total() -> None:
    """Items that keep coming inside `idle` are stopped by `total` (TotalTimeout)."""
    clock = FakeClock()
    source = Source([0.5] * 1000)
    with pytest.raises(deadlines.TotalTimeout) as info:
        clock.run(collect(streams.guard(source, first=1, idle=1, total=7)))
    assert clock.now() == pytest.approx(1007.0)
    assert type(info.value) is deadlines.TotalTimeout and info.value.limit == 7
    assert source.closed and source.sent == 13


def test_request_deadline_binds_as_deadline_exceeded() -> None:
    """When the request's deadline comes before `total`, the guard raises DeadlineExceeded."""
    clock = FakeClock()
    source = Source([0.5] * 1000)

    async def main() -> None:
        # The sync form only sets the deadline: the guard alone enforces it here.
        with deadlines.scope(4.2):
            await collect(streams.guard(source, first=1, idle=1, total=60))

    with pytest.raises(deadlines.DeadlineExceeded) as info:
        clock.run(main())
    assert clock.now() == pytest.approx(1004.2)
    assert info.value.phase == "body" and info.value.request_sent is True
    assert info.value.limit == pytest.approx(4.2)
    assert source.closed


def test_enclosing_async_scope_and_guard_agree() -> None:
    """Under `async with scope()`, the deadline firing mid-stream ends it as DeadlineExceeded."""
    clock = FakeClock()
    source = Source([0.5] * 1000)

    async def main() -> None:
        async with deadlines.scope(4.2):
            await collect(streams.guard(source, first=1, idle=1, total=60))

    with pytest.raises(deadlines.DeadlineExceeded):
        clock.run(main())
    assert clock.now() == pytest.approx(1004.2)
    assert source.closed


def test_consumer_time_counts_toward_total() -> None:
    """Time the consumer spends between items counts: past `total`, the next ask fails at once."""
    clock = FakeClock()
    source = Source([0.1] * 100)

    async def main() -> None:
        async for _ in streams.guard(source, first=1, idle=1, total=3):
            await asyncio.sleep(1.0)

    with pytest.raises(deadlines.TotalTimeout):
        clock.run(main())
    # Items at 0.1, 1.2, 2.3; the consumer's own work ends at 3.3, then no wait at all.
    assert clock.now() == pytest.approx(1003.3)


def test_break_closes_the_source() -> None:
    """Stopping early with `break` closes the source (aclosing makes it immediate)."""
    source = Source([0.1] * 10)

    async def main() -> None:
        async with contextlib.aclosing(streams.guard(source, first=1, idle=1, total=9)) as items:
            async for item in items:
                if item == 2:
                    break
        assert source.closed

    FakeClock().run(main())
    assert source.sent == 2


def test_cancelling_the_consumer_closes_the_source() -> None:
    """A consumer cancelled from outside closes the source and stays cancelled."""
    source = Source([0.1], then_stall=True)

    async def main() -> None:
        task = asyncio.create_task(collect(streams.guard(source, first=1, idle=60, total=90)))
        await asyncio.sleep(5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert source.closed

    FakeClock().run(main())


def test_awaitable_source_counts_opening_toward_first() -> None:
    """An awaitable that opens the stream is awaited under the first-item limit."""
    clock = FakeClock()
    source = Source([0.2, 0.2])

    async def slow_open(delay: float) -> Source:
        await asyncio.sleep(delay)
        return source

    assert clock.run(collect(streams.guard(slow_open(0.5), first=1, idle=1, total=9))) == [1, 2]
    with pytest.raises(streams.FirstItemTimeout):
        clock.run(collect(streams.guard(slow_open(5), first=1, idle=1, total=9)))


def test_source_error_propagates_and_closes() -> None:
    """An error raised by the source reaches the consumer unchanged, the source closed."""

    class Broken(Source):
        async def __anext__(self) -> int:
            raise ConnectionResetError("peer reset")

    source = Broken([])
    with pytest.raises(ConnectionResetError):
        FakeClock().run(collect(streams.guard(source, first=1, idle=1, total=9)))
    assert source.closed


def test_no_budget_left_fails_fast_and_closes() -> None:
    """With the deadline already passed nothing is awaited: BudgetExhausted, source closed."""
    source = Source([0.1])

    async def main() -> None:
        async with deadlines.scope(1):
            with deadlines.scope(0):
                await collect(streams.guard(source, first=1, idle=1, total=9))

    with pytest.raises(deadlines.BudgetExhausted):
        FakeClock().run(main())
    assert source.closed and source.sent == 0


def test_close_callback_runs_after_the_stream_closes() -> None:
    """The `close` callback (sync or async) runs once the stream ends, however it ends."""
    calls: list[str] = []

    async def aclose() -> None:
        calls.append("async")

    FakeClock().run(collect(streams.guard(Source([0.1]), first=1, idle=1, total=9, close=aclose)))
    with pytest.raises(streams.FirstItemTimeout):
        FakeClock().run(
            collect(
                streams.guard(
                    Source([9]), first=1, idle=1, total=9, close=lambda: calls.append("sync")
                )
            )
        )
    assert calls == ["async", "sync"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"first": 0, "idle": 1, "total": 1}, "first must be > 0 seconds"),
        ({"first": 1, "idle": -1, "total": 1}, "idle must be > 0 seconds"),
        ({"first": 1, "idle": 1, "total": math.nan}, "total must be a number of seconds, not NaN"),
        ({"first": 1, "idle": 1, "total": math.inf}, "total must be finite"),
    ],
)
def test_invalid_limits_are_rejected_at_call_time(kwargs: dict[str, float], message: str) -> None:
    """Bad limits raise ValueError when guard() is called, and an opener is closed unawaited."""

    async def opener() -> Source:  # pragma: no cover - must never run
        return Source([])

    coroutine = opener()
    with pytest.raises(ValueError, match=message):
        streams.guard(coroutine, **kwargs)  # type: ignore[arg-type]
    assert coroutine.cr_frame is None  # closed, so no "never awaited" warning


def test_timeouts_are_reported_to_observers() -> None:
    """A guard timeout reports CallStarted and CallFinished(outcome timeout, phase headers)."""
    events: list[deadlines.Event] = []
    unsubscribe = deadlines.observe(events.append)
    try:
        with pytest.raises(streams.FirstItemTimeout):
            FakeClock().run(collect(streams.guard(Source([5]), first=1, idle=1, total=9, name="x")))
    finally:
        unsubscribe()
    finished = [e for e in events if isinstance(e, deadlines.CallFinished)]
    assert [type(e).__name__ for e in events] == ["CallStarted", "CallFinished"]
    assert (finished[0].dependency, finished[0].outcome, finished[0].phase) == (
        "x",
        "timeout",
        "headers",
    )


@pytest.mark.anyio
@pytest.mark.realtime
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_limits_cancel_the_wait_under_both_backends(anyio_backend: str) -> None:
    """Under asyncio and trio, a stalled wait is cancelled at the limit and the source closed."""
    stalled = Source([], then_stall=True)
    started = anyio.current_time()
    with pytest.raises(streams.FirstItemTimeout):
        await collect(streams.guard(stalled, first=0.2, idle=1, total=9))
    assert 0.19 <= anyio.current_time() - started <= 0.7
    assert stalled.closed

    trickle = Source([0.02] * 1000)
    with pytest.raises(deadlines.DeadlineExceeded):
        async with deadlines.scope(0.3):
            await collect(streams.guard(trickle, first=1, idle=1, total=9))
    assert trickle.closed and 3 <= trickle.sent <= 15


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_outer_cancellation_closes_under_both_backends(anyio_backend: str) -> None:
    """A cancel scope around the consumer that fires still lets the source close (shielded)."""
    source = Source([0.01], then_stall=True)
    with anyio.move_on_after(0.2):
        await collect(streams.guard(source, first=1, idle=60, total=90))
    assert source.closed and source.sent == 1


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_break_inside_aclosing_closes_at_once(anyio_backend: str) -> None:
    """With aclosing() (the portable form, the one trio asks for) the break closes at once."""
    source = Source([0.01] * 10)
    async with contextlib.aclosing(streams.guard(source, first=1, idle=1, total=9)) as items:
        async for item in items:
            if item == 2:
                break
        assert not source.closed  # still open inside the block...
    assert source.closed  # ...closed as the block exits, not whenever GC runs
