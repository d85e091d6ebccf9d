"""psycopg 3: transactions limited by the request's budget, async and sync, with pools.

    async with deadlines.scope(1.5):
        async with deadlines.psycopg.transaction(apool) as conn:    # AsyncConnectionPool
            await conn.execute("UPDATE ...")

    with deadlines.scope(1.5):
        with deadlines.psycopg.transaction_sync(pool) as conn:      # ConnectionPool
            conn.execute("UPDATE ...")

Both take a connection within min(pool cap, time left), then ``SET LOCAL``
`statement_timeout` and `lock_timeout` (and `transaction_timeout` on Postgres 17+)
from what is left. Async: a statement running when the deadline fires or the caller
leaves is cancelled on the server, and psycopg's own cancel wait (up to 10 s) is cut
short after `cleanup`. Sync code cannot be interrupted, so `statement_timeout` bounds
each statement and a timer cancels a statement still running when the budget ends
(``conn.cancel_safe()``): a transaction of several statements stays inside the budget.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from datetime import timedelta
from typing import Any

from ._extras import missing

try:
    import psycopg
    from psycopg import pq
except ImportError as exc:  # pragma: no cover - depends on the install
    raise missing("deadlines.psycopg", "psycopg 3", "psycopg") from exc

from . import _clock, _validate
from ._budget import CallBudget
from ._dependency import Dependency
from .postgres import (
    AUDIT_SQL,
    DEFAULT_CHECK_INTERVAL,
    DEFAULT_CLEANUP,
    DEFAULT_RESERVE,
    IDENTITY_SQL,
    POSTGRES,
    Finding,
    TransactionLimits,
    budget_error,
    expired,
    findings,
    transaction_limits,
    translate,
)
from .postgres._driver import Overrun, acquire_within, guarded, within

__all__ = ["audit_async", "transaction", "transaction_sync"]

AnyAsyncConnection = psycopg.AsyncConnection[Any]
AnyConnection = psycopg.Connection[Any]


def _pool_classes() -> tuple[type[Any], type[Any]]:
    """(AsyncConnectionPool, ConnectionPool), or classes nothing is an instance of."""
    try:
        from psycopg_pool import AsyncConnectionPool, ConnectionPool
    except ImportError:  # pragma: no cover - psycopg_pool is optional
        return (type("NoAsyncPool", (), {}), type("NoPool", (), {}))
    return (AsyncConnectionPool, ConnectionPool)


def _plan(
    conn: AnyConnection | AnyAsyncConnection,
    budget: CallBudget,
    lock_timeout: float | timedelta | None,
    reserve: float,
    check_interval: float | timedelta | None,
) -> TransactionLimits:
    return transaction_limits(
        budget,
        server_version=conn.info.server_version,
        lock_timeout=lock_timeout,
        reserve=reserve,
        check_interval=check_interval,
    )


def _pool_limit(budget: CallBudget, reserve: float) -> float:
    limit = budget.limit("pool")
    return max(0.0, limit - reserve) if budget.binding("pool") == "deadline" else limit


# Async


@asynccontextmanager
async def transaction(
    conn_or_pool: Any,
    *,
    dependency: Dependency = POSTGRES,
    lock_timeout: float | timedelta | None = None,
    reserve: float | timedelta = DEFAULT_RESERVE,
    cleanup: float | timedelta = DEFAULT_CLEANUP,
    check_interval: float | timedelta | None = DEFAULT_CHECK_INTERVAL,
) -> AsyncIterator[AnyAsyncConnection]:
    """A transaction on a `psycopg_pool.AsyncConnectionPool` or `psycopg.AsyncConnection`.

    Same contract as `deadlines.asyncpg.transaction`: fails fast below `min_useful`
    without taking a connection, limits the pool wait, sets the limits with
    ``SET LOCAL``, translates Postgres timeouts (`DeadlineExceeded` when the budget
    was binding, else `StatementTimeout`/`LockTimeout`), never commits after the
    deadline, and never holds the caller more than `cleanup` seconds on the cancel path.
    """
    grace = _validate.seconds(cleanup, "cleanup")
    reserve_s = _validate.seconds(reserve, "reserve")
    async_pool, _ = _pool_classes()
    budget = CallBudget(dependency)  # fails fast, before a connection is taken
    with budget:
        pool = conn_or_pool if isinstance(conn_or_pool, async_pool) else None
        if pool is not None:
            conn = await acquire_within(pool.getconn, pool.putconn, budget, reserve=reserve_s)
        else:
            conn = conn_or_pool
        try:
            limits = await _abegin(conn, budget, lock_timeout, reserve_s, check_interval, grace)
            async with guarded(
                limits, grace, commit=conn.commit, rollback=lambda: _arollback(conn, grace)
            ):
                yield conn
        finally:
            if pool is not None:
                await within(lambda: pool.putconn(conn), grace, conn.close)


async def _abegin(
    conn: AnyAsyncConnection,
    budget: CallBudget,
    lock_timeout: float | timedelta | None,
    reserve: float,
    check_interval: float | timedelta | None,
    grace: float,
) -> TransactionLimits:
    # psycopg answers a cancelled statement by waiting up to 5 s for its cancel request:
    # watched, as the body is, so that a cancel request that hangs costs ~2 x `grace`.
    watch = Overrun(budget.end, grace)
    try:
        if conn.autocommit:
            await conn.execute("BEGIN")
        limits = _plan(conn, budget, lock_timeout, reserve, check_interval)
        budget.request_sent = True
        await conn.execute(limits.sql())  # without autocommit, psycopg sends BEGIN first
    except BaseException:
        watch.disarm()
        await _arollback(conn, grace)
        raise
    watch.disarm()
    return limits


async def _arollback(conn: AnyAsyncConnection, grace: float) -> None:
    """Roll back within `grace`, else close the connection (Postgres ends the rest)."""

    async def rollback() -> None:
        if conn.closed:
            return
        if conn.info.transaction_status == pq.TransactionStatus.ACTIVE:
            raise RuntimeError("a statement is still running")  # close instead
        await conn.rollback()

    await within(rollback, grace, conn.close)


async def audit_async(conn: AnyAsyncConnection) -> list[Finding]:
    """`deadlines.postgres.audit` for a `psycopg.AsyncConnection`."""
    cur = await conn.execute(IDENTITY_SQL)
    row = await cur.fetchone()
    assert row is not None
    cur = await conn.execute(AUDIT_SQL)
    rows = await cur.fetchall()
    return findings(
        [tuple(str(v) for v in r) for r in rows], role=str(row[0]), database=str(row[1])
    )


# Sync


@contextmanager
def transaction_sync(
    conn_or_pool: Any,
    *,
    dependency: Dependency = POSTGRES,
    lock_timeout: float | timedelta | None = None,
    reserve: float | timedelta = DEFAULT_RESERVE,
    cleanup: float | timedelta = DEFAULT_CLEANUP,
    check_interval: float | timedelta | None = DEFAULT_CHECK_INTERVAL,
) -> Iterator[AnyConnection]:
    """A transaction on a `psycopg_pool.ConnectionPool` or `psycopg.Connection`.

    Use it under the sync form of `deadlines.scope` (or an inbound WSGI middleware).
    Each statement is bounded by `statement_timeout`; a statement still running when
    the budget ends is cancelled from a timer thread with ``conn.cancel_safe()``
    (waiting at most `cleanup` seconds for the cancel request). A block that ends
    after the deadline is rolled back and raises `DeadlineExceeded`.
    """
    grace = _validate.seconds(cleanup, "cleanup")
    reserve_s = _validate.seconds(reserve, "reserve")
    _, sync_pool = _pool_classes()
    budget = CallBudget(dependency)  # fails fast, before a connection is taken
    with budget:
        pool = conn_or_pool if isinstance(conn_or_pool, sync_pool) else None
        conn = _getconn(pool, budget, reserve_s) if pool is not None else conn_or_pool
        try:
            limits = _begin(conn, budget, lock_timeout, reserve_s, check_interval)
            with _guarded(conn, limits, grace):
                yield conn
        finally:
            if pool is not None:
                pool.putconn(conn)


def _getconn(pool: Any, budget: CallBudget, reserve: float) -> AnyConnection:
    from psycopg_pool import PoolTimeout

    started = _clock.now()
    try:
        conn: AnyConnection = pool.getconn(timeout=_pool_limit(budget, reserve))
    except PoolTimeout as exc:
        budget.pool_wait = _clock.now() - started
        raise budget.timeout("pool") from exc
    budget.pool_wait = _clock.now() - started
    return conn


def _begin(
    conn: AnyConnection,
    budget: CallBudget,
    lock_timeout: float | timedelta | None,
    reserve: float,
    check_interval: float | timedelta | None,
) -> TransactionLimits:
    try:
        if conn.autocommit:
            conn.execute("BEGIN")
        limits = _plan(conn, budget, lock_timeout, reserve, check_interval)
        budget.request_sent = True
        conn.execute(limits.sql())
    except BaseException:
        _rollback(conn)
        raise
    return limits


@contextmanager
def _guarded(conn: AnyConnection, limits: TransactionLimits, grace: float) -> Iterator[None]:
    budget = limits.budget
    watchdog = _Watchdog(conn, budget, grace)
    try:
        yield
    except Exception as exc:
        watchdog.stop()
        _rollback(conn)
        mapped = translate(exc, limits)
        if mapped is not None:
            raise mapped from exc
        raise
    except BaseException:  # KeyboardInterrupt, SystemExit
        watchdog.stop()
        _rollback(conn)
        raise
    watchdog.stop()
    if expired(budget):  # the caller has given up: commit nothing
        _rollback(conn)
        raise budget_error(budget)
    try:
        conn.commit()
    except Exception as exc:
        _rollback(conn)
        mapped = translate(exc, limits)
        if mapped is not None:
            raise mapped from exc
        raise


def _rollback(conn: AnyConnection) -> None:
    if conn.closed:
        return
    try:
        conn.rollback()
    except psycopg.Error:  # broken connection: the pool discards it
        conn.close()


class _Watchdog:
    """Cancels the statement still running when the budget ends (sync code only)."""

    __slots__ = ("_conn", "_grace", "_timer")

    def __init__(self, conn: AnyConnection, budget: CallBudget, grace: float) -> None:
        self._conn = conn
        self._grace = grace
        self._timer = threading.Timer(budget.left(), self._fire)
        self._timer.daemon = True
        self._timer.start()

    def _fire(self) -> None:
        conn = self._conn
        if conn.closed or conn.info.transaction_status != pq.TransactionStatus.ACTIVE:
            return
        # If the cancel request cannot get through, statement_timeout (from the
        # budget) still ends the statement on the server.
        with contextlib.suppress(psycopg.Error, OSError):
            conn.cancel_safe(timeout=max(self._grace, 0.001))

    def stop(self) -> None:
        self._timer.cancel()
