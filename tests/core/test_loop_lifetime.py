"""Event loops that are closed and dropped are freed, whatever `_alarms` left in them.

A process that runs ``asyncio.run`` again and again (a loop per test, Starlette's
TestClient, CLI tools) must not keep every loop that ever entered a deadline. The
registry of per-loop clocks may keep the most recent loop until another one comes
along, so each check runs one more loop after the ones it looks at.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

import deadlines
from deadlines import _alarms
from deadlines._alarms import Timeout


async def _left_early() -> None:
    """A deadline scope and a bare Timeout, both left long before they fire."""
    async with deadlines.scope(5.0):
        await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    async with Timeout(loop.time() + 5.0):
        await asyncio.sleep(0)


async def _fired() -> None:
    """A Timeout that fires: the loop timer ran, nothing is pending afterwards."""
    loop = asyncio.get_running_loop()
    with pytest.raises(TimeoutError):
        async with Timeout(loop.time()):
            await asyncio.sleep(10)


def _run(main: Callable[[], Coroutine[Any, Any, None]]) -> weakref.ref[asyncio.AbstractEventLoop]:
    """`asyncio.run(main())`; a weak reference to the loop it ran on."""
    seen: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def body() -> None:
        seen.append(weakref.ref(asyncio.get_running_loop()))
        await main()

    asyncio.run(body())
    return seen[0]


def _alive(refs: list[weakref.ref[asyncio.AbstractEventLoop]]) -> int:
    gc.collect()
    return sum(ref() is not None for ref in refs)


def test_loops_are_freed_whether_timeouts_were_left_or_fired() -> None:
    """Four asyncio.run loops, timeouts left early (timer pending) or fired: all freed."""
    refs = [_run(main) for main in (_left_early, _fired, _left_early, _left_early)]
    _run(_fired)  # the most recent loop may stay until another comes along
    assert _alive(refs) == 0


def test_a_loop_closed_inside_a_timeout_block_is_freed() -> None:
    """A loop closed while a task is still inside a block (its entry live) is freed."""
    refs: list[weakref.ref[asyncio.AbstractEventLoop]] = []
    for _ in range(3):
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(lambda loop, context: None)  # "Task was destroyed ..."
        refs.append(weakref.ref(loop))

        async def stuck(loop: asyncio.AbstractEventLoop = loop) -> None:
            async with Timeout(loop.time() + 5.0):
                await loop.create_future()

        task = loop.create_task(stuck())
        loop.run_until_complete(asyncio.sleep(0))
        assert not task.done()
        loop.close()
        del loop, stuck, task
    _run(_left_early)
    assert _alive(refs) == 0


def test_a_running_loop_keeps_its_clock_while_closed_loops_are_forgotten() -> None:
    """A loop running in another thread keeps its clock, and it still fires, while the
    main thread's asyncio.run loops come and go and are forgotten."""
    other = asyncio.new_event_loop()
    thread = threading.Thread(target=other.run_forever, daemon=True)
    thread.start()
    try:
        refs = _main_loops_while_running(other)
    finally:
        other.call_soon_threadsafe(other.stop)
        thread.join(5)
        other.close()
    refs.append(weakref.ref(other))
    del other
    _run(_left_early)  # the first new loop after `other` closed lets it go too
    assert _alive(refs) == 0


def _main_loops_while_running(
    other: asyncio.AbstractEventLoop,
) -> list[weakref.ref[asyncio.AbstractEventLoop]]:
    """asyncio.run loops in this thread while `other` runs a block armed far ahead."""
    release = threading.Event()

    async def hold() -> None:
        # Across the whole test: a live entry, and a timer pending in `other`.
        async with Timeout(asyncio.get_running_loop().time() + 60.0):
            while not release.is_set():
                await asyncio.sleep(0.005)

    async def clock() -> _alarms.LoopClock:
        return _alarms.clock_for(asyncio.get_running_loop())

    async def fire() -> _alarms.LoopClock:
        loop = asyncio.get_running_loop()
        with pytest.raises(TimeoutError):
            async with Timeout(loop.time() + 0.01):
                await asyncio.sleep(10)
        return _alarms.clock_for(loop)

    held = asyncio.run_coroutine_threadsafe(hold(), other)
    before = asyncio.run_coroutine_threadsafe(clock(), other).result(5)
    refs = [_run(main) for main in (_left_early, _fired, _left_early)]
    assert _alive(refs[:-1]) == 0  # forgotten while `other` runs with a pending timer
    assert asyncio.run_coroutine_threadsafe(fire(), other).result(5) is before
    release.set()
    held.result(5)  # left without firing
    return refs
