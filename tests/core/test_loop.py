"""`deadlines._loop.running`: the running loop, remembered per thread, never a stale one."""

from __future__ import annotations

import asyncio
import os
import threading

import pytest

from deadlines import _loop


def test_outside_a_loop_there_is_none() -> None:
    """No loop runs: None, also right after one ran in this thread."""
    assert _loop.running() is None

    async def inside() -> asyncio.AbstractEventLoop | None:
        return _loop.running()

    loop = asyncio.new_event_loop()
    try:
        assert loop.run_until_complete(inside()) is loop
    finally:
        loop.close()
    assert _loop.running() is None  # remembered, but no longer running


def test_each_thread_sees_its_own_loop() -> None:
    """Two threads running two loops at once each get their own."""
    seen: dict[str, bool] = {}
    barrier = threading.Barrier(2)

    def worker(name: str) -> None:
        async def main() -> None:
            loop = asyncio.get_running_loop()
            barrier.wait(5)  # both loops run now
            for _ in range(3):
                assert _loop.running() is loop
                await asyncio.sleep(0.01)
            seen[name] = True

        asyncio.run(main())

    threads = [threading.Thread(target=worker, args=(n,)) for n in "ab"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert seen == {"a": True, "b": True}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
def test_a_forked_child_forgets_the_parents_loop() -> None:
    """After fork inside a running loop, the child does not see the parent's loop."""

    async def main() -> int:
        assert _loop.running() is asyncio.get_running_loop()
        pid = os.fork()
        if pid == 0:  # the child: report through the exit status
            os._exit(0 if _loop.running() is None else 1)
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)

    assert asyncio.run(main()) == 0


def test_current_task_is_asyncios() -> None:
    """The task running on the loop, as asyncio says; None from a loop callback."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert _loop.current_task(loop) is asyncio.current_task()
        seen: list[object] = []

        async def inner() -> None:
            seen.append(_loop.current_task(loop))

        task = asyncio.create_task(inner())
        await task
        assert seen == [task]
        from_callback = loop.create_future()
        loop.call_soon(lambda: from_callback.set_result(_loop.current_task(loop)))
        assert await from_callback is None

    asyncio.run(main())
