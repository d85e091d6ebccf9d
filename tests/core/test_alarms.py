"""The shared per-loop timer behind `deadlines.scope` on asyncio (`deadlines._alarms`).

Exact instants come from a `FakeClock` loop (virtual time, autojump); the rest checks
the contract asyncio.Timeout has: which block raises, foreign cancellations untouched,
and that the loop holds one timer however many blocks are open.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref

import pytest

import deadlines
from deadlines._alarms import Timeout, clock_for
from deadlines.testing import FakeClock


def _fake(main: object) -> object:
    return FakeClock().run(main)  # type: ignore[arg-type]


def test_each_block_fires_at_its_own_instant() -> None:
    """Many blocks with scattered deadlines: each is cancelled exactly at its instant."""
    delays = [0.7, 0.1, 0.5, 0.3, 0.9, 0.2, 0.3, 0.05, 1.3, 0.6]

    async def one(delay: float, fired: dict[float, float]) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(TimeoutError):
            async with Timeout(start + delay):
                await asyncio.sleep(10)
        fired[delay] = loop.time() - start

    async def main() -> dict[float, float]:
        fired: dict[float, float] = {}
        async with asyncio.TaskGroup() as group:
            for delay in delays:
                group.create_task(one(delay, fired))
        return fired

    fired = _fake(main())
    assert isinstance(fired, dict)
    for delay in delays:
        assert fired[delay] == pytest.approx(delay, abs=1e-6)


def test_blocks_that_end_early_do_not_fire() -> None:
    """A block left before its instant is never cancelled, even when its entry lingers."""

    async def main() -> str:
        loop = asyncio.get_running_loop()
        async with Timeout(loop.time() + 0.1):
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # past the first instant: the loop timer ran and found it dead
        async with Timeout(loop.time() + 0.1):
            await asyncio.sleep(0.05)
        return "done"

    assert _fake(main()) == "done"


def test_reschedule_earlier_later_and_never() -> None:
    """Moving the instant works in every direction, as asyncio.Timeout.reschedule does."""

    async def main() -> list[float]:
        loop = asyncio.get_running_loop()
        results: list[float] = []
        start = loop.time()
        with pytest.raises(TimeoutError):
            async with Timeout(start + 5) as timeout:
                timeout.reschedule(start + 0.2)
                await asyncio.sleep(10)
        results.append(loop.time() - start)
        start = loop.time()
        with pytest.raises(TimeoutError):
            async with Timeout(start + 0.1) as timeout:
                timeout.reschedule(start + 0.4)
                await asyncio.sleep(10)
        results.append(loop.time() - start)
        start = loop.time()
        async with Timeout(start + 0.1) as timeout:
            timeout.reschedule(None)
            assert timeout.when() is None
            await asyncio.sleep(1)
        results.append(loop.time() - start)
        return results

    assert _fake(main()) == pytest.approx([0.2, 0.4, 1.0], abs=1e-6)


def test_already_past_fires_at_the_next_iteration() -> None:
    """An instant in the past cancels at the first await, not at once."""

    async def main() -> bool:
        loop = asyncio.get_running_loop()
        timeout = Timeout(loop.time() - 1)
        with pytest.raises(TimeoutError):
            async with timeout:
                assert not timeout.expired()  # nothing runs until the loop turns
                await asyncio.sleep(0)
        return timeout.expired()

    assert _fake(main()) is True


def test_inner_and_outer_report_their_own_expiry() -> None:
    """The block whose instant passed raises; the other one lets it through."""

    async def main() -> tuple[str, str]:
        loop = asyncio.get_running_loop()
        outcome: list[str] = []
        async with Timeout(loop.time() + 1) as outer:
            try:
                async with Timeout(loop.time() + 0.1):
                    await asyncio.sleep(10)
            except TimeoutError:
                outcome.append("inner")
        assert not outer.expired()
        try:
            async with Timeout(loop.time() + 0.1) as outer:
                try:
                    async with Timeout(loop.time() + 1) as inner:
                        await asyncio.sleep(10)
                except TimeoutError:
                    outcome.append("wrongly inner")
        except TimeoutError:
            assert outer.expired() and not inner.expired()
            outcome.append("outer")
        return outcome[0], outcome[1]

    assert _fake(main()) == ("inner", "outer")


def test_foreign_cancellation_passes_through() -> None:
    """A cancel from elsewhere is not turned into a timeout, even when both happen."""

    async def victim(when: float, started: asyncio.Event) -> None:
        async with Timeout(when):
            started.set()
            await asyncio.sleep(10)

    async def main() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        started = asyncio.Event()
        task = asyncio.create_task(victim(loop.time() + 0.2, started))
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # Both in the same turn of the loop: our timer and somebody else's cancel.
        started = asyncio.Event()
        when = loop.time() + 0.2
        both = asyncio.create_task(victim(when, started))
        await started.wait()
        loop.call_at(when, both.cancel)
        with pytest.raises(asyncio.CancelledError):
            await both
        return task.cancelled(), both.cancelled()

    assert _fake(main()) == (True, True)


def test_one_loop_timer_for_many_open_blocks() -> None:
    """A thousand open blocks arm one loop timer, not a thousand."""

    async def main() -> int:
        loop = asyncio.get_running_loop()
        release = asyncio.Event()

        async def hold(i: int) -> None:
            async with Timeout(loop.time() + 60 + i / 1000):
                await release.wait()

        tasks = [asyncio.create_task(hold(i)) for i in range(1000)]
        await asyncio.sleep(0.01)
        timers = len(loop._scheduled)  # type: ignore[attr-defined]
        release.set()
        await asyncio.gather(*tasks)
        return timers

    assert _fake(main()) == 1


def test_dead_entries_do_not_pile_up() -> None:
    """Short blocks behind a long one are swept: the heap stays near the live count."""

    async def main() -> int:
        loop = asyncio.get_running_loop()
        async with Timeout(loop.time() + 3600):  # holds the top of the heap
            for _ in range(10_000):
                async with Timeout(loop.time() + 30):
                    pass
            return len(clock_for(loop)._heap)

    size = _fake(main())
    assert isinstance(size, int) and size <= 256


def test_misuse_is_refused() -> None:
    """Entering twice, rescheduling outside the block, or no task: RuntimeError."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        timeout = Timeout(loop.time() + 1)
        with pytest.raises(RuntimeError, match="not|created"):
            timeout.reschedule(loop.time() + 2)
        async with timeout:
            pass
        with pytest.raises(RuntimeError, match="once"):
            async with timeout:
                pass
        with pytest.raises(RuntimeError, match="finished"):
            timeout.reschedule(None)

    _fake(main())
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(RuntimeError, match="inside a task"):
            Timeout(0).enter(loop)
    finally:
        loop.close()


def test_loops_in_threads_have_their_own_clock_and_are_freed() -> None:
    """Two threads, two loops, two clocks; a closed loop is not kept alive by its clock."""
    refs: list[weakref.ref[asyncio.AbstractEventLoop]] = []
    errors: list[BaseException] = []

    def worker() -> None:
        async def main() -> None:
            loop = asyncio.get_running_loop()
            refs.append(weakref.ref(loop))
            with pytest.raises(TimeoutError):
                async with Timeout(loop.time() + 0.05):
                    await asyncio.sleep(5)

        try:
            asyncio.run(main())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert not errors
    gc.collect()
    assert len(refs) == 2 and all(ref() is None for ref in refs)


def test_an_async_scope_inside_an_older_sync_scope_fires_at_the_outer_instant() -> None:
    """The inner async scope arms the time *left* of the binding (outer) deadline.

    A sync scope sets a deadline without a timer; an async scope entered inside it
    later, with a larger budget, must cancel at the outer instant, not at the outer
    budget counted again from now.
    """

    async def main() -> float:
        loop = asyncio.get_running_loop()
        with deadlines.scope(1.0):
            await asyncio.sleep(0.6)
            start = loop.time()
            with pytest.raises(deadlines.DeadlineExceeded):
                async with deadlines.scope(5.0):
                    await asyncio.sleep(10)
            return loop.time() - start

    assert _fake(main()) == pytest.approx(0.4, abs=1e-6)
