"""scope(): the request's deadline in a context variable, enforced by cancellation."""

from __future__ import annotations

import asyncio
import contextvars
import math
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import anyio
import pytest

import deadlines
from deadlines import Deadline, DeadlineExceeded

pytestmark = pytest.mark.anyio

# Generous bounds: a loaded 2-core machine can be late by hundreds of milliseconds.
LATE = 0.5


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    """Scope behaviour is tested under asyncio and trio alike."""
    return str(request.param)


def test_no_deadline_outside_a_scope() -> None:
    """Without a scope there is no deadline and infinite time remains."""
    assert deadlines.current() is None
    assert deadlines.remaining() == math.inf
    deadlines.check()  # nothing to check: must not raise


def test_sync_scope_sets_and_restores() -> None:
    """The sync form sets the deadline for the block and restores the outer one after."""
    with deadlines.scope(5) as d:
        assert d is not None
        assert deadlines.current() is d
        assert 4.0 < deadlines.remaining() <= 5.0
    assert deadlines.current() is None


def test_nesting_only_shrinks() -> None:
    """An inner scope can shorten the deadline but never extend it."""
    with deadlines.scope(1) as outer:
        with deadlines.scope(10) as inner:
            assert inner is outer
        with deadlines.scope(0.5) as tighter:
            assert tighter is not None and outer is not None
            assert tighter < outer
        assert deadlines.current() is outer


def test_absolute_deadline_argument() -> None:
    """A Deadline can be given directly; the earlier of seconds and deadline wins."""
    d = Deadline.after(0.2)
    with deadlines.scope(10, deadline=d) as got:
        assert got is not None
        assert got.instant == d.instant
    with deadlines.scope(deadline=d):
        assert deadlines.current() == d


def test_empty_scope_inherits() -> None:
    """scope() with no arguments keeps the current deadline (or none)."""
    with deadlines.scope() as d:
        assert d is None
    with deadlines.scope(3) as outer, deadlines.scope() as inner:
        assert inner is outer


def test_check_raises_after_expiry() -> None:
    """check() raises DeadlineExceeded once the sync scope's deadline has passed."""
    with deadlines.scope(0.01):
        time.sleep(0.03)
        with pytest.raises(DeadlineExceeded, match=r"budget 10 ms"):
            deadlines.check()


def test_scope_is_single_use() -> None:
    """Entering one scope object twice is a programming error."""
    s = deadlines.scope(1)
    with s:
        pass
    with pytest.raises(RuntimeError, match="only once"), s:
        pass


def test_bad_arguments() -> None:
    """Bad budgets and deadline types are refused at construction."""
    with pytest.raises(ValueError, match="NaN"):
        deadlines.scope(float("nan"))
    with pytest.raises(TypeError, match="must be a Deadline"):
        deadlines.scope(deadline=1.0)  # type: ignore[arg-type]


@pytest.mark.realtime
async def test_async_scope_cancels_at_the_instant() -> None:
    """The body is cancelled when the deadline passes and DeadlineExceeded is raised."""
    started = time.monotonic()
    with pytest.raises(DeadlineExceeded) as info:
        async with deadlines.scope(0.2):
            await anyio.sleep(10)
    elapsed = time.monotonic() - started
    assert 0.19 <= elapsed < 0.2 + LATE
    assert info.value.limit == pytest.approx(0.2)


async def test_async_scope_finishing_in_time_returns_normally() -> None:
    """A body that finishes early is not disturbed and the deadline is restored."""
    async with deadlines.scope(5) as d:
        await anyio.sleep(0)
        assert deadlines.current() is d
    assert deadlines.current() is None


@pytest.mark.realtime
async def test_inner_expiry_is_reported_by_inner_scope() -> None:
    """When the inner deadline fires, the inner scope raises and the outer body goes on."""
    reached = False
    async with deadlines.scope(10):
        with pytest.raises(DeadlineExceeded) as info:
            async with deadlines.scope(0.05):
                await anyio.sleep(10)
        reached = True
        assert deadlines.remaining() > 5
    assert reached
    assert info.value.limit == pytest.approx(0.05)


@pytest.mark.realtime
async def test_outer_expiry_passes_through_inner_scope() -> None:
    """When the outer deadline fires inside an inner scope, the outer one reports it."""
    inner_exited_with: list[type[BaseException]] = []
    with pytest.raises(DeadlineExceeded) as info:
        async with deadlines.scope(0.05):
            try:
                async with deadlines.scope(10):
                    await anyio.sleep(10)
            except BaseException as exc:
                inner_exited_with.append(type(exc))
                raise
    assert info.value.limit == pytest.approx(0.05)
    assert inner_exited_with and inner_exited_with[0] is not DeadlineExceeded


async def test_already_expired_scope_cancels_at_first_await() -> None:
    """A zero budget cancels the body at its first checkpoint."""
    with pytest.raises(DeadlineExceeded):
        async with deadlines.scope(0):
            await anyio.sleep(1)


async def test_foreign_cancellation_propagates_untouched() -> None:
    """A cancellation from elsewhere is not turned into DeadlineExceeded."""
    outcome: list[str] = []

    async def body() -> None:
        try:
            async with deadlines.scope(10):
                await anyio.sleep(10)
        except DeadlineExceeded:
            outcome.append("deadline")
            raise
        except anyio.get_cancelled_exc_class():
            outcome.append("cancelled")
            raise

    async with anyio.create_task_group() as tg:
        tg.start_soon(body)
        await anyio.sleep(0.05)
        tg.cancel_scope.cancel()
    assert outcome == ["cancelled"]


async def test_deadline_flows_into_child_tasks() -> None:
    """Tasks started inside the scope see the same deadline."""
    seen: list[Deadline | None] = []

    async def child() -> None:
        seen.append(deadlines.current())

    async with deadlines.scope(5) as d, anyio.create_task_group() as tg:
        tg.start_soon(child)
        tg.start_soon(child)
    assert seen == [d, d]


async def test_deadline_flows_into_threads() -> None:
    """anyio.to_thread (and asyncio.to_thread) copy the context, deadline included."""
    async with deadlines.scope(5) as d:
        got = await anyio.to_thread.run_sync(deadlines.current)
    assert got is d


async def test_child_task_is_cancelled_with_the_scope() -> None:
    """Work running in a task group under the scope is cancelled when it expires."""
    finished = []

    async def worker() -> None:
        await anyio.sleep(10)
        finished.append(True)

    with pytest.raises(DeadlineExceeded):
        async with deadlines.scope(0.05), anyio.create_task_group() as tg:
            tg.start_soon(worker)
    assert finished == []


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_asyncio_create_task_and_taskgroup_inherit() -> None:
    """asyncio.create_task and asyncio.TaskGroup copy the deadline into the new task."""
    async with deadlines.scope(5) as d:
        assert await asyncio.create_task(_current()) is d
        async with asyncio.TaskGroup() as tg:
            t = tg.create_task(_current())
        assert t.result() is d
        assert await asyncio.to_thread(deadlines.current) is d


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_run_in_executor_needs_carry() -> None:
    """run_in_executor does not copy the context; carry() makes it."""
    loop = asyncio.get_running_loop()
    with ThreadPoolExecutor(max_workers=1) as pool:
        async with deadlines.scope(5) as d:
            bare = await loop.run_in_executor(pool, deadlines.current)
            carried = await loop.run_in_executor(pool, deadlines.carry(deadlines.current))
    assert bare is None
    assert carried is d


def test_carry_into_a_plain_thread() -> None:
    """A threading.Thread target wrapped with carry() sees the caller's deadline."""
    got: list[Deadline | None] = []
    with deadlines.scope(5) as d:
        t = threading.Thread(target=deadlines.carry(lambda: got.append(deadlines.current())))
    t.start()
    t.join()
    assert got == [d]


def test_contexts_are_isolated() -> None:
    """A deadline set in one context does not leak into another."""
    ctx = contextvars.copy_context()
    with deadlines.scope(1):
        assert ctx.run(deadlines.current) is None


async def _current() -> Deadline | None:
    return deadlines.current()
