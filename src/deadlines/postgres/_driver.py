"""Driver plumbing shared by `deadlines.asyncpg`, `deadlines.psycopg` and `deadlines.sqlalchemy`.

A pooled connection taken within the budget and never leaked (`acquire_within`), a
cleanup bounded in time (`within`), a driver that absorbs the first cancellation
cancelled again (`Overrun`), and a transaction's body ended by commit or rollback
(`guarded`). What to set and what an error means is the policy, `deadlines.postgres`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from .. import _clock
from .._budget import CallBudget
from . import DEFAULT_RESERVE, TransactionLimits, budget_error, expired, translate

T = TypeVar("T")

_log = logging.getLogger("deadlines.postgres")

_background: set[asyncio.Task[Any]] = set()


def keep(task: asyncio.Task[T]) -> asyncio.Task[T]:
    """Hold a strong reference to a background task until it ends."""
    _background.add(task)
    task.add_done_callback(_background.discard)
    return task


async def acquire_within(
    acquire: Callable[[], Awaitable[T]],
    release: Callable[[T], Awaitable[object]],
    budget: CallBudget,
    *,
    reserve: float = DEFAULT_RESERVE,
) -> T:
    """Take a pooled connection within min(pool cap, time left - reserve), never leaking one.

    Ending `reserve` before the deadline lets the pool wait fail with its own error
    (phase ``"pool"``, safe to retry) rather than racing the scope's cancellation.
    The acquire runs in its own task: when the wait times out or the caller is
    cancelled just as a connection is handed over, that connection is released in
    the background instead of staying marked in use.
    """
    limit = budget.limit("pool")
    if budget.binding("pool") == "deadline":
        limit = max(0.0, limit - reserve)
    started = _clock.now()

    async def run() -> T:
        return await acquire()

    task = keep(asyncio.ensure_future(run()))
    try:
        done, _ = await asyncio.wait({task}, timeout=limit)
    except BaseException:
        _abandon(task, release)
        raise
    finally:
        budget.pool_wait = _clock.now() - started
    if not done:
        _abandon(task, release)
        raise budget.timeout("pool")
    return task.result()


def _abandon(task: asyncio.Task[T], release: Callable[[T], Awaitable[object]]) -> None:
    def give_back(done: asyncio.Task[T]) -> None:
        if done.cancelled() or done.exception() is not None:
            return
        keep(asyncio.ensure_future(_release_quietly(release, done.result())))

    task.cancel()
    task.add_done_callback(give_back)


async def _release_quietly(release: Callable[[T], Awaitable[object]], conn: T) -> None:
    with contextlib.suppress(Exception):
        await release(conn)


async def within(
    work: Callable[[], Awaitable[object]],
    seconds: float,
    give_up: Callable[[], Awaitable[object] | None],
) -> bool:
    """Run `work` for at most `seconds`, then `give_up`; True when `work` finished in time.

    Runs in its own task, bounded by itself: a second cancellation of the caller stops
    the caller's wait at once, never the cleanup (which still ends within `seconds`).
    Errors of `work` count as not finished, and errors of `give_up` are logged (debug):
    neither may replace the error that the caller is handling.
    """

    async def bounded() -> bool:
        inner = asyncio.ensure_future(work())
        done, _ = await asyncio.wait({inner}, timeout=max(0.0, seconds))
        if not done:
            # psycopg answers a first cancellation by cancelling on the server and
            # waiting up to 10 s; a second one makes it close the connection.
            for _ in range(10):
                inner.cancel()
                done, _ = await asyncio.wait({inner}, timeout=0.01)
                if done:
                    break
            inner.add_done_callback(_consume)
        elif not inner.cancelled() and inner.exception() is None:
            return True
        try:  # timed out or failed: the connection's state is unknown
            result = give_up()
            if result is not None:
                await result
        except Exception:  # e.g. asyncpg's: the failed release already gave it back
            _log.debug("giving up the connection failed", exc_info=True)
        return False

    task = keep(asyncio.ensure_future(bounded()))
    task.add_done_callback(_consume)
    return await asyncio.shield(task)


def _consume(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


class Overrun:
    """Cancels a task a second time when its cancel path takes longer than `grace`.

    Drivers catch the first cancellation of a running query to cancel it on the
    server (psycopg waits up to 10 s for that, asyncpg's request has no limit); a
    second cancellation makes them give up and close the connection. This watcher
    looks every `grace` seconds: a task seen cancelling twice in a row, or still
    running past ``end + grace``, is cancelled again. It never starts a cancellation
    of a task that nobody cancelled.
    """

    __slots__ = ("_count", "_end", "_grace", "_handle", "_seen", "_task")

    def __init__(self, end: float, grace: float) -> None:
        self._task = asyncio.current_task()
        self._count = 0
        self._seen = False
        self._end = end
        self._grace = max(0.01, grace)
        self._handle = asyncio.get_running_loop().call_later(self._grace, self._look)

    @property
    def fired(self) -> bool:
        """Whether this watcher had to cancel the task again."""
        return self._count > 0

    def _look(self) -> None:
        task = self._task
        if task is None or task.done():
            return
        cancelling = task.cancelling() > self._count
        overdue = _clock.now() >= self._end + self._grace
        if cancelling and (self._seen or overdue):
            self._count += 1
            task.cancel()
        self._seen = cancelling
        self._handle = asyncio.get_running_loop().call_later(self._grace, self._look)

    def disarm(self) -> None:
        """Stop watching; undo this watcher's own cancellation requests on the task."""
        self._handle.cancel()
        task = self._task
        while self._count and task is not None and task.cancelling():
            task.uncancel()
            self._count -= 1


@asynccontextmanager
async def guarded(
    limits: TransactionLimits,
    grace: float,
    *,
    commit: Callable[[], Awaitable[object]],
    rollback: Callable[[], Awaitable[None]],
) -> AsyncIterator[None]:
    """Run a transaction's body: commit at the end, or roll back and say why.

    The body's Postgres errors are translated to the taxonomy; a cancellation (the
    deadline fired or the caller left) rolls back and propagates; a body that ends
    after the deadline commits nothing. `rollback` must itself be bounded by `grace`.
    """
    budget = limits.budget
    watch = Overrun(budget.end, grace)
    try:
        yield
    except BaseException as exc:
        watch.disarm()
        await rollback()
        mapped = translate(exc, limits) if isinstance(exc, Exception) else None
        if mapped is not None:
            raise mapped from exc
        raise
    watch.disarm()
    if expired(budget):  # the caller has given up: commit nothing
        await rollback()
        raise budget_error(budget)
    try:
        await commit()
    except BaseException as exc:
        await rollback()
        mapped = translate(exc, limits) if isinstance(exc, Exception) else None
        if mapped is not None:
            raise mapped from exc
        raise
