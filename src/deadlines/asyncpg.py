"""asyncpg: transactions limited by the request's budget and cancelled on the server.

    async with deadlines.scope(1.5):
        async with deadlines.asyncpg.transaction(pool) as conn:
            await conn.execute("UPDATE ...")

`transaction` takes a connection from `pool` within min(pool cap, time left), then sets
`statement_timeout` and `lock_timeout` (and `transaction_timeout` on Postgres 17+)
with ``SET LOCAL`` from what is left. A statement running at the deadline, or when the
caller goes away, is cancelled on the server; if the cancel request cannot get
through, the connection is closed after `cleanup` seconds instead of hanging the
caller (asyncpg's own cancel request has no time limit).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

from ._extras import missing

try:
    import asyncpg
except ImportError as exc:  # pragma: no cover - depends on the install
    raise missing("deadlines.asyncpg", "asyncpg", "asyncpg") from exc

from . import _validate
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
    findings,
    transaction_limits,
)
from .postgres._driver import acquire_within, guarded, within

__all__ = ["audit", "server_version", "transaction"]


def server_version(conn: Any) -> int:
    """The server's version as ``server_version_num`` (e.g. 150004)."""
    version = conn.get_server_version()
    return int(version.major) * 10000 + int(version.minor)


@asynccontextmanager
async def transaction(
    conn_or_pool: Any,
    *,
    dependency: Dependency = POSTGRES,
    lock_timeout: float | timedelta | None = None,
    reserve: float | timedelta = DEFAULT_RESERVE,
    cleanup: float | timedelta = DEFAULT_CLEANUP,
    check_interval: float | timedelta | None = DEFAULT_CHECK_INTERVAL,
    isolation: str | None = None,
    readonly: bool = False,
    deferrable: bool = False,
) -> AsyncIterator[Any]:
    """A transaction on an `asyncpg.Pool` or `asyncpg.Connection`, bounded by the budget.

    Yields the connection. Commits when the block ends normally, unless the deadline
    has passed by then: then it rolls back and raises `DeadlineExceeded`, so nothing
    is committed for a caller that gave up.

    Args:
        conn_or_pool: An `asyncpg.Pool` (a connection is taken within the pool cap
            and the time left) or a connection.
        dependency: Caps and `min_useful`; below `min_useful` the call fails fast with
            `BudgetExhausted` before taking a connection.
        lock_timeout: A cap on lock waits, below the statement limit (e.g. for
            migrations). Default: the statement limit.
        reserve: Subtracted from the budget, so that Postgres cancels first.
        cleanup: Longest time the cancel path (server-side cancel and rollback) may
            take after a cancellation; then the connection is closed instead.
        check_interval: ``client_connection_check_interval`` for the transaction
            (Postgres 14+), so a closed connection stops its query; None to skip.
        isolation: As for `asyncpg.Connection.transaction`.
        readonly: As for `asyncpg.Connection.transaction`.
        deferrable: As for `asyncpg.Connection.transaction`.

    Raises:
        BudgetExhausted: Not enough budget to start; nothing was sent.
        PoolTimeout | DeadlineExceeded: No pooled connection in time.
        DeadlineExceeded: Postgres cancelled a statement at the request's deadline.
        StatementTimeout | LockTimeout: The dependency's own cap or `lock_timeout` fired.
    """
    grace = _validate.seconds(cleanup, "cleanup")
    reserve_s = _validate.seconds(reserve, "reserve")
    budget = CallBudget(dependency)  # fails fast, before a connection is taken
    with budget:
        pool = conn_or_pool if isinstance(conn_or_pool, asyncpg.Pool) else None
        if pool is not None:
            conn = await acquire_within(pool.acquire, pool.release, budget, reserve=reserve_s)
        else:
            conn = conn_or_pool
        try:
            begun = conn.transaction(isolation=isolation, readonly=readonly, deferrable=deferrable)
            tx = _Tx(conn, begun)
            limits = await _begin(tx, budget, lock_timeout, reserve_s, check_interval, grace)
            async with guarded(
                limits, grace, commit=tx.commit, rollback=lambda: _rollback(tx, grace)
            ):
                yield conn
        finally:
            if pool is not None:
                await _release(pool, conn, grace)


class _Tx:
    """Our transaction: asyncpg's object (so nested blocks become savepoints) and
    whether it is known to be open, so a failed BEGIN or COMMIT is never guessed at."""

    __slots__ = ("conn", "open", "tx")

    def __init__(self, conn: Any, tx: Any) -> None:
        self.conn = conn
        self.tx = tx
        self.open = False

    async def start(self) -> None:
        await self.tx.start()
        self.open = True

    async def commit(self) -> None:
        self.open = False  # whatever happens now, asyncpg considers it ended
        await self.tx.commit()

    async def rollback(self) -> None:
        """Roll back; raise when the state is unknown, so the caller closes the connection."""
        conn = self.conn
        if conn.is_closed() or not conn.is_in_transaction():
            return
        if not self.open:
            raise RuntimeError("transaction state unknown after a failed BEGIN or COMMIT")
        self.open = False
        await self.tx.rollback()  # first waits for asyncpg's pending cancel request


async def _begin(
    tx: _Tx,
    budget: CallBudget,
    lock_timeout: float | timedelta | None,
    reserve: float,
    check_interval: float | timedelta | None,
    grace: float,
) -> TransactionLimits:
    """BEGIN, then SET LOCAL the limits computed from what is left after BEGIN."""
    try:
        await tx.start()
        limits = transaction_limits(
            budget,
            server_version=server_version(tx.conn),
            lock_timeout=lock_timeout,
            reserve=reserve,
            check_interval=check_interval,
        )
        budget.request_sent = True
        await tx.conn.execute(limits.sql())
    except BaseException:
        await _rollback(tx, grace)
        raise
    return limits


async def _rollback(tx: _Tx, grace: float) -> None:
    """Roll back within `grace` (it first waits for a pending server-side cancel).

    When the cancel request cannot reach the server, the rollback does not finish in
    time, or the state is unknown, the connection is terminated: Postgres then ends
    the query itself (statement_timeout from the budget, or the connection check).
    """
    await within(tx.rollback, grace, tx.conn.terminate)


async def _release(pool: Any, conn: Any, grace: float) -> None:
    """Give the connection back within `grace`; terminate it if that cannot finish."""

    async def release() -> None:
        await pool.release(conn, timeout=grace)

    await within(release, grace, conn.terminate)


async def audit(conn: Any) -> list[Finding]:
    """`deadlines.postgres.audit` for an asyncpg connection."""
    role, database, _ = await conn.fetchrow(IDENTITY_SQL)
    rows = await conn.fetch(AUDIT_SQL)
    return findings(
        [tuple(str(v) for v in row) for row in rows], role=str(role), database=str(database)
    )
