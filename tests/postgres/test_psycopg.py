"""deadlines.psycopg against the real Postgres: async and sync, with psycopg_pool."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
from pgtest_support import Proxy, cancelled_after, running, wait_running
from psycopg_pool import AsyncConnectionPool, ConnectionPool

import deadlines
from deadlines import postgres
from deadlines.psycopg import audit_async, transaction, transaction_sync

pytestmark = [pytest.mark.postgres, pytest.mark.realtime]

Admin = psycopg.Connection[tuple[object, ...]]


async def make_apool(dsn: str, app: str, *, size: int = 2, min_size: int = 1) -> Any:
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        dsn, min_size=min_size, max_size=size, open=False, kwargs={"application_name": app}
    )
    await pool.open(wait=min_size > 0, timeout=5)
    return pool


@pytest.fixture
async def apool(server: str, app_name: str) -> AsyncIterator[Any]:
    """A two-connection AsyncConnectionPool named `app_name`."""
    pool = await make_apool(server, app_name)
    yield pool
    await pool.close(timeout=3)


@pytest.fixture
def pool(server: str, app_name: str) -> Iterator[ConnectionPool[Any]]:
    """A two-connection sync ConnectionPool named `app_name`."""
    p: ConnectionPool[Any] = ConnectionPool(
        server, min_size=2, max_size=2, open=False, kwargs={"application_name": app_name}
    )
    p.open(wait=True, timeout=5)
    yield p
    p.close(timeout=3)


def in_use(pool: Any) -> int:
    stats = pool.get_stats()
    return int(stats.get("pool_size", 0) - stats.get("pool_available", 0))


# Async


@pytest.mark.anyio
async def test_async_pg_sleep_cancelled_at_the_budget(
    apool: Any, admin: Admin, app_name: str
) -> None:
    """pg_sleep(5) under a 0.5 s budget is cancelled by Postgres at the budget."""
    start = time.monotonic()
    with pytest.raises(deadlines.DeadlineExceeded) as info:
        async with deadlines.scope(0.5), transaction(apool) as conn:
            await conn.execute("SELECT pg_sleep(5)")
    assert 0.45 <= time.monotonic() - start <= 1.0
    # Postgres cancels first (reserve); on a loaded host the scope may fire first and
    # the query is then cancelled from the client side. Either way nothing keeps running.
    if info.value.phase is not None:
        assert info.value.phase == "headers" and info.value.request_sent is True
        assert isinstance(info.value.__cause__, psycopg.errors.QueryCanceled)
    assert running(admin, app_name) == []
    assert in_use(apool) == 0


@pytest.mark.anyio
async def test_async_lock_wait_is_cut_by_lock_timeout(apool: Any, admin: Admin, table: str) -> None:
    """A lock wait fails with LockTimeout at lock_timeout, well inside the budget."""
    with admin.transaction():
        admin.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        start = time.monotonic()
        with pytest.raises(postgres.LockTimeout):
            async with deadlines.scope(5.0), transaction(apool, lock_timeout=0.2) as conn:
                await conn.execute(f"SELECT * FROM {table}")
        assert 0.15 <= time.monotonic() - start <= 0.9


@pytest.mark.anyio
async def test_async_pool_wait_is_bounded(apool: Any) -> None:
    """With both connections held by hung queries, the acquire fails at the budget."""
    started = [asyncio.Event(), asyncio.Event()]

    async def hold(event: asyncio.Event) -> None:
        async with transaction(apool) as conn:
            event.set()
            await conn.execute("SELECT pg_sleep(30)")

    holders = [asyncio.create_task(hold(e)) for e in started]
    try:
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 5)
        start = time.monotonic()
        with pytest.raises(deadlines.DeadlineExceeded) as info:
            async with deadlines.scope(0.3), transaction(apool):
                pass
        assert 0.25 <= time.monotonic() - start <= 0.8
        # The pool wait ends `reserve` before the deadline so its own error wins; only a
        # loop stalled past the reserve lets the scope's cancellation win instead.
        assert info.value.phase in ("pool", None)
        assert info.value.phase is None or info.value.retry_safe
    finally:
        for task in holders:
            task.cancel()
        await asyncio.gather(*holders, return_exceptions=True)
    assert in_use(apool) == 0


@pytest.mark.anyio
async def test_async_caller_leaving_cancels_on_the_server(
    apool: Any, admin: Admin, app_name: str
) -> None:
    """Cancelling the caller's task cancels the statement in Postgres before it returns."""

    async def handler() -> None:
        async with deadlines.scope(10.0), transaction(apool) as conn:
            await conn.execute("SELECT pg_sleep(20)")

    task = asyncio.create_task(handler())
    await asyncio.to_thread(wait_running, admin, app_name)
    assert await cancelled_after(task) < 0.5
    assert running(admin, app_name) == []
    assert in_use(apool) == 0


@pytest.mark.anyio
async def test_async_nothing_committed_after_the_deadline(
    apool: Any, admin: Admin, table: str
) -> None:
    """A block cancelled at the deadline after its INSERT commits nothing."""
    with pytest.raises(deadlines.DeadlineExceeded):
        async with deadlines.scope(0.3), transaction(apool) as conn:
            await conn.execute(f"INSERT INTO {table} VALUES (2, 'late')")
            await asyncio.sleep(1)
    assert admin.execute(f"SELECT count(*) FROM {table}").fetchone() == (1,)


@pytest.mark.anyio
async def test_async_cancel_path_is_bounded_when_the_cancel_request_hangs(
    proxy: Proxy, admin: Admin, app_name: str
) -> None:
    """psycopg waits up to 10 s for a cancel request that cannot get through; the
    caller is let go after about `cleanup` instead, and the pool stays usable."""
    apool = await make_apool(proxy.dsn(app_name), app_name, size=1)
    try:

        async def handler() -> None:
            async with deadlines.scope(10.0), transaction(apool, cleanup=0.2) as conn:
                await conn.execute("SELECT pg_sleep(20)")

        task = asyncio.create_task(handler())
        await asyncio.to_thread(wait_running, admin, app_name)
        proxy.freeze()
        assert await cancelled_after(task) <= 2 * 0.2 + 0.5
        assert proxy.held >= 1  # psycopg did try to send a cancel request
        end = time.monotonic() + 3
        while running(admin, app_name) and time.monotonic() < end:
            await asyncio.sleep(0.05)
        assert running(admin, app_name) == []
    finally:
        await apool.close(timeout=1)


@pytest.mark.anyio
async def test_async_cancel_during_begin_is_bounded_when_the_cancel_request_hangs(
    proxy: Proxy, app_name: str
) -> None:
    """A caller cancelled while BEGIN and SET LOCAL are unanswered is let go after about
    `cleanup` too: psycopg would hold it 5 s for a cancel request that hangs."""
    apool = await make_apool(proxy.dsn(app_name), app_name, size=1)
    try:
        proxy.stall()  # the pool's connection is open; nothing sent on it is answered

        async def handler() -> None:
            async with deadlines.scope(10.0), transaction(apool, cleanup=0.2) as conn:
                await conn.execute("SELECT 1")

        task = asyncio.create_task(handler())
        await proxy.wait_dropped()
        assert await cancelled_after(task) <= 2 * 0.2 + 0.5
        assert proxy.held >= 1  # psycopg did try to send a cancel request
    finally:
        await apool.close(timeout=1)


@pytest.mark.anyio
async def test_async_audit(apool: Any) -> None:
    """The async audit finds the unlimited statement_timeout of this server."""
    async with apool.connection() as conn:
        result = await audit_async(conn)
    assert postgres.audit_failed(result)


# Sync


def test_sync_pg_sleep_cancelled_at_the_budget(
    pool: ConnectionPool[Any], admin: Admin, app_name: str
) -> None:
    """Sync: statement_timeout from the budget stops pg_sleep(5) at 0.5 s."""
    start = time.monotonic()
    with (
        pytest.raises(deadlines.DeadlineExceeded) as info,
        deadlines.scope(0.5),
        transaction_sync(pool) as conn,
    ):
        conn.execute("SELECT pg_sleep(5)")
    assert 0.45 <= time.monotonic() - start <= 1.0
    assert info.value.request_sent is True
    assert running(admin, app_name) == []
    assert in_use(pool) == 0


def test_sync_statement_cap_and_lock_timeout(
    pool: ConnectionPool[Any], admin: Admin, table: str
) -> None:
    """Sync: the dependency's cap gives StatementTimeout, a lock wait LockTimeout."""
    dep = deadlines.Dependency("postgres", headers=0.3)
    with pytest.raises(postgres.StatementTimeout), transaction_sync(pool, dependency=dep) as conn:
        conn.execute("SELECT pg_sleep(5)")
    with admin.transaction():
        admin.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        start = time.monotonic()
        with (
            pytest.raises(postgres.LockTimeout),
            deadlines.scope(5.0),
            transaction_sync(pool, lock_timeout=0.2) as conn,
        ):
            conn.execute(f"SELECT * FROM {table}")
        assert 0.15 <= time.monotonic() - start <= 0.9


def test_sync_pool_wait_is_bounded(pool: ConnectionPool[Any]) -> None:
    """Sync: with the pool exhausted, the acquire gives up at the budget (nothing sent)."""
    held = [pool.getconn(), pool.getconn()]
    try:
        start = time.monotonic()
        with (
            pytest.raises(deadlines.DeadlineExceeded) as info,
            deadlines.scope(0.3),
            transaction_sync(pool),
        ):
            pass
        assert 0.25 <= time.monotonic() - start <= 0.8
        # The pool wait ends `reserve` before the deadline so its own error wins; only a
        # loop stalled past the reserve lets the scope's cancellation win instead.
        assert info.value.phase in ("pool", None)
        assert info.value.phase is None or info.value.retry_safe
        dep = deadlines.Dependency("postgres", pool_wait=0.1)
        with (
            pytest.raises(deadlines.PoolTimeout),
            deadlines.scope(5.0),
            transaction_sync(pool, dependency=dep),
        ):
            pass
    finally:
        for conn in held:
            pool.putconn(conn)


def test_sync_statements_after_the_first_stay_inside_the_budget(
    pool: ConnectionPool[Any], admin: Admin, app_name: str
) -> None:
    """statement_timeout is per statement; the watchdog cancels the one running at the end."""
    start = time.monotonic()
    with (
        pytest.raises(deadlines.DeadlineExceeded),
        deadlines.scope(0.6),
        transaction_sync(pool) as conn,
    ):
        conn.execute("SELECT pg_sleep(0.3)")
        conn.execute("SELECT pg_sleep(5)")  # alone it would run to 0.3 + 0.58 s
    assert 0.55 <= time.monotonic() - start <= 0.8
    assert running(admin, app_name) == []


def test_sync_nothing_committed_after_the_deadline(
    pool: ConnectionPool[Any], admin: Admin, table: str
) -> None:
    """Sync: a block that finishes after the deadline is rolled back."""
    with (
        pytest.raises(deadlines.DeadlineExceeded),
        deadlines.scope(0.2),
        transaction_sync(pool) as conn,
    ):
        conn.execute(f"INSERT INTO {table} VALUES (2, 'late')")
        time.sleep(0.3)
    assert admin.execute(f"SELECT count(*) FROM {table}").fetchone() == (1,)
    with deadlines.scope(2.0), transaction_sync(pool) as conn:
        conn.execute(f"INSERT INTO {table} VALUES (3, 'in time')")
    assert admin.execute(f"SELECT count(*) FROM {table}").fetchone() == (2,)


def test_sync_budget_below_min_useful_fails_fast(server: str, app_name: str) -> None:
    """Below min_useful nothing is sent and no connection is taken from the pool."""
    dep = deadlines.Dependency("postgres", min_useful=0.5)
    with psycopg.connect(server, application_name=app_name) as conn:
        with (
            pytest.raises(deadlines.BudgetExhausted),
            deadlines.scope(0.2),
            transaction_sync(conn, dependency=dep),
        ):
            pass
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_sync_plain_connection_and_threads(server: str, app_name: str) -> None:
    """A plain connection (autocommit too) gets the limits; watchdog threads end."""
    before = threading.active_count()
    with psycopg.connect(server, application_name=app_name, autocommit=True) as conn:
        with deadlines.scope(1.0), transaction_sync(conn) as c:
            value = c.execute("SHOW statement_timeout").fetchone()
        assert value is not None and str(value[0]).endswith("ms")
        assert conn.execute("SHOW statement_timeout").fetchone() == ("0",)
    time.sleep(0.05)
    assert threading.active_count() <= before


def test_sync_audit_and_cli(server: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`deadlines pg-audit DSN` prints the findings and exits 1 on unlimited settings."""
    from deadlines.__main__ import main

    assert main(["pg-audit", server]) == 1
    out = capsys.readouterr().out
    assert "statement_timeout = 0" in out and "ALTER ROLE" in out
    assert main(["pg-audit", "host=127.0.0.1 port=1 user=x", "--connect-timeout", "1"]) == 2
