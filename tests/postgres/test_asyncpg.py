"""deadlines.asyncpg against the real Postgres: limits from the budget, server-side cancel."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import psycopg
import pytest
from pgtest_support import Proxy, cancelled_after, running, wait_running

import deadlines
from deadlines import postgres
from deadlines.asyncpg import transaction
from testservers import Postgres

pytestmark = [pytest.mark.postgres, pytest.mark.realtime, pytest.mark.anyio]

Admin = psycopg.Connection[tuple[object, ...]]


async def make_pool(pg: Postgres, app: str, *, size: int = 2, min_size: int = 0) -> Any:
    return await asyncpg.create_pool(
        pg.url(),
        min_size=min_size,
        max_size=size,
        ssl=False,  # asyncpg leaks an unretrieved error when a TLS probe is cancelled
        server_settings={"application_name": app},
    )


@pytest.fixture
async def pool(pg_server: Postgres, app_name: str) -> AsyncIterator[Any]:
    """A two-connection asyncpg pool named `app_name`, terminated after the test."""
    p = await make_pool(pg_server, app_name)
    yield p
    try:
        await asyncio.wait_for(p.close(), 3)
    except TimeoutError:
        p.terminate()


def all_free(pool: Any) -> bool:
    return bool(pool.get_idle_size() == pool.get_size())


async def test_pg_sleep_cancelled_at_the_budget(pool: Any, admin: Admin, app_name: str) -> None:
    """pg_sleep(5) under a 0.5 s budget is cancelled by Postgres at the budget."""
    start = time.monotonic()
    with pytest.raises(deadlines.DeadlineExceeded) as info:
        async with deadlines.scope(0.5), transaction(pool) as conn:
            await conn.execute("SELECT pg_sleep(5)")
    elapsed = time.monotonic() - start
    assert 0.45 <= elapsed <= 1.0
    # Postgres cancels first (reserve); on a loaded host the scope may fire first and
    # the query is then cancelled from the client side. Either way nothing keeps running.
    if info.value.phase is not None:
        assert info.value.phase == "headers" and info.value.request_sent is True
        assert info.value.dependency == "postgres"
        assert isinstance(info.value.__cause__, asyncpg.QueryCanceledError)
    assert running(admin, app_name) == []
    assert all_free(pool)


async def test_limits_are_set_locally_from_the_budget(pool: Any) -> None:
    """statement_timeout and lock_timeout come from the budget, and reset after commit."""
    async with deadlines.scope(2.0), transaction(pool, lock_timeout=0.25) as conn:
        statement = await conn.fetchval("SELECT current_setting('statement_timeout')")
        lock = await conn.fetchval("SELECT current_setting('lock_timeout')")
    assert statement.endswith("ms")
    ms = int(statement.removesuffix("ms"))
    assert 1800 <= ms <= 2000
    assert lock == "250ms"
    async with pool.acquire() as conn:
        assert await conn.fetchval("SHOW statement_timeout") == "0"


async def test_statement_cap_says_which_limit_fired(pool: Any) -> None:
    """Without a deadline the dependency's statement cap fires: StatementTimeout, not a deadline."""
    dep = deadlines.Dependency("orders-db", headers=0.3)
    with pytest.raises(postgres.StatementTimeout) as info:
        async with transaction(pool, dependency=dep) as conn:
            await conn.execute("SELECT pg_sleep(5)")
    assert not isinstance(info.value, deadlines.DeadlineExceeded)
    assert info.value.kind == "statement" and info.value.limit == 0.3
    assert "orders-db" in str(info.value) and "statement timeout" in str(info.value)


async def test_lock_wait_is_cut_by_lock_timeout(pool: Any, admin: Admin, table: str) -> None:
    """A statement waiting for a lock another session holds fails at lock_timeout."""
    with admin.transaction():
        admin.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        start = time.monotonic()
        with pytest.raises(postgres.LockTimeout) as info:
            async with deadlines.scope(5.0), transaction(pool, lock_timeout=0.2) as conn:
                await conn.execute(f"UPDATE {table} SET note = 'x' WHERE id = 1")
        elapsed = time.monotonic() - start
    assert 0.15 <= elapsed <= 0.9
    assert info.value.kind == "lock" and info.value.limit == 0.2
    assert isinstance(info.value.__cause__, asyncpg.LockNotAvailableError)


async def hold(pool: Any, started: asyncio.Event) -> None:
    async with transaction(pool) as conn:
        started.set()
        await conn.execute("SELECT pg_sleep(30)")


async def test_pool_wait_is_bounded_when_hung_queries_hold_it(pool: Any, admin: Admin) -> None:
    """With every pooled connection held by hung queries, acquire gives up at the budget."""
    events = [asyncio.Event(), asyncio.Event()]
    holders = [asyncio.create_task(hold(pool, e)) for e in events]
    try:
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), 5)
        start = time.monotonic()
        with pytest.raises(deadlines.DeadlineExceeded) as info:
            async with deadlines.scope(0.3), transaction(pool):
                pass
        elapsed = time.monotonic() - start
        assert 0.25 <= elapsed <= 0.8
        # The pool wait ends `reserve` before the deadline so its own error wins; only a
        # loop stalled past the reserve lets the scope's cancellation win instead.
        assert info.value.phase in ("pool", None)
        assert info.value.phase is None or info.value.retry_safe
        dep = deadlines.Dependency("postgres", pool_wait=0.2)
        with pytest.raises(deadlines.PoolTimeout) as cap:
            async with deadlines.scope(5.0), transaction(pool, dependency=dep):
                pass
        assert cap.value.limit == 0.2 and cap.value.pool_wait is not None
        assert cap.value.pool_wait >= 0.15
    finally:
        for task in holders:
            task.cancel()
        await asyncio.gather(*holders, return_exceptions=True)
    assert all_free(pool)


async def test_caller_leaving_cancels_the_query_on_the_server(
    pool: Any, admin: Admin, app_name: str
) -> None:
    """Cancelling the caller's task cancels the running statement in Postgres at once."""

    async def handler() -> None:
        async with deadlines.scope(10.0), transaction(pool) as conn:
            await conn.execute("SELECT pg_sleep(20)")

    task = asyncio.create_task(handler())
    await asyncio.to_thread(wait_running, admin, app_name)
    assert await cancelled_after(task) < 0.5
    assert running(admin, app_name) == []  # nothing of ours still running, right away
    assert all_free(pool)


async def test_deadline_inside_a_multi_statement_transaction(
    pool: Any, admin: Admin, app_name: str, table: str
) -> None:
    """A later statement that outlives the deadline is cancelled by the scope, on the server."""
    start = time.monotonic()
    with pytest.raises(deadlines.DeadlineExceeded):
        async with deadlines.scope(0.6), transaction(pool) as conn:
            await conn.execute(f"UPDATE {table} SET note = 'changed' WHERE id = 1")
            await asyncio.sleep(0.3)  # statement_timeout was fixed at the start
            await conn.execute("SELECT pg_sleep(5)")
    assert time.monotonic() - start <= 0.6 + postgres.DEFAULT_CLEANUP + 0.4
    assert running(admin, app_name) == []
    assert admin.execute(f"SELECT note FROM {table} WHERE id = 1").fetchone() == ("seed",)


async def test_nothing_committed_when_the_deadline_passed_before_commit(
    pool: Any, admin: Admin, table: str
) -> None:
    """A body that ends after the deadline rolls back: the caller gave up, nothing commits."""
    # The sync form of scope sets the deadline but cancels nothing.
    with pytest.raises(deadlines.DeadlineExceeded), deadlines.scope(0.2):
        async with transaction(pool) as conn:
            await conn.execute(f"INSERT INTO {table} VALUES (2, 'late')")
            time.sleep(0.3)  # the deadline passes with no await to cancel
    with pytest.raises(deadlines.DeadlineExceeded):
        async with deadlines.scope(0.2), transaction(pool) as conn:
            await conn.execute(f"INSERT INTO {table} VALUES (3, 'late')")
            await asyncio.sleep(1)
    rows = admin.execute(f"SELECT id FROM {table} ORDER BY id").fetchall()
    assert rows == [(1,)]
    async with deadlines.scope(2.0), transaction(pool) as conn:
        await conn.execute(f"INSERT INTO {table} VALUES (4, 'in time')")
    assert admin.execute(f"SELECT count(*) FROM {table}").fetchone() == (2,)


async def test_budget_below_min_useful_fails_fast_without_a_connection(
    pg_server: Postgres, app_name: str
) -> None:
    """Below min_useful nothing is sent and no connection is even opened."""
    pool = await make_pool(pg_server, app_name, min_size=0)
    try:
        dep = deadlines.Dependency("postgres", min_useful=0.5)
        start = time.monotonic()
        with pytest.raises(deadlines.BudgetExhausted) as info:
            async with deadlines.scope(0.2), transaction(pool, dependency=dep):
                pass
        assert time.monotonic() - start < 0.05
        assert info.value.request_sent is False
        assert pool.get_size() == 0
    finally:
        await pool.close()


async def test_cancelled_acquires_never_leak_a_connection(pool: Any) -> None:
    """Acquires cancelled or timed out at any instant leave no connection marked in use."""

    async def user(i: int) -> None:
        async with deadlines.scope(0.01 + (i % 7) * 0.007), transaction(pool) as conn:
            await conn.execute("SELECT pg_sleep(0.01)")

    for _ in range(3):
        tasks = [asyncio.create_task(user(i)) for i in range(24)]
        await asyncio.sleep(0.02)
        for task in tasks[::3]:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    await asyncio.sleep(0.2)  # background releases of late acquires
    assert all_free(pool)
    async with deadlines.scope(1.0), transaction(pool) as conn:
        assert await conn.fetchval("SELECT 1") == 1


async def test_cancel_path_is_bounded_when_the_cancel_request_hangs(
    proxy: Proxy, admin: Admin, app_name: str
) -> None:
    """A cancel request that cannot reach the server does not hold the caller: the
    connection is closed after `cleanup`, the pool stays usable, and Postgres stops
    the query itself."""
    pool = await make_pool(proxy.postgres, app_name, size=1)
    try:

        async def handler() -> None:
            async with deadlines.scope(10.0), transaction(pool, cleanup=0.2) as conn:
                await conn.execute("SELECT pg_sleep(20)")

        task = asyncio.create_task(handler())
        await asyncio.to_thread(wait_running, admin, app_name)
        proxy.freeze()
        assert await cancelled_after(task) <= 0.2 + 0.4
        assert proxy.held >= 1  # asyncpg did try to send a cancel request
        assert all_free(pool)
        # The connection was closed; the server notices (client_connection_check_interval).
        end = time.monotonic() + 3
        while running(admin, app_name) and time.monotonic() < end:
            await asyncio.sleep(0.05)
        assert running(admin, app_name) == []
    finally:
        pool.terminate()


async def test_cancel_during_begin_is_bounded_when_the_cancel_request_hangs(
    proxy: Proxy, app_name: str
) -> None:
    """A caller cancelled while BEGIN is unanswered is let go within about `cleanup`,
    and the pool stays usable."""
    pool = await make_pool(proxy.postgres, app_name, size=1, min_size=1)
    try:
        proxy.stall()  # the pool's connection is open; nothing sent on it is answered

        async def handler() -> None:
            async with deadlines.scope(10.0), transaction(pool, cleanup=0.2) as conn:
                await conn.execute("SELECT 1")

        task = asyncio.create_task(handler())
        await proxy.wait_dropped()
        assert await cancelled_after(task) <= 0.2 + 0.4
        assert all_free(pool)
    finally:
        pool.terminate()


async def test_plain_asyncpg_hangs_when_the_cancel_request_hangs(
    proxy: Proxy, admin: Admin, app_name: str
) -> None:
    """The failure bounded above: without the helper, a rollback after a cancelled
    query waits for asyncpg's cancel request, which never completes."""
    conn = await asyncpg.connect(
        proxy.postgres.url(),
        server_settings={"application_name": app_name},
    )
    try:
        tx = conn.transaction()
        await tx.start()
        query = asyncio.create_task(conn.execute("SELECT pg_sleep(20)"))
        await asyncio.to_thread(wait_running, admin, app_name)
        proxy.freeze()
        query.cancel()
        with pytest.raises(asyncio.CancelledError):
            await query
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(tx.rollback(), 1.0)
    finally:
        conn.terminate()


async def test_audit_reports_unlimited_settings(pool: Any) -> None:
    """The server here runs with no statement_timeout: the audit says so and how to fix it."""
    async with pool.acquire() as conn:
        result = await deadlines.asyncpg.audit(conn)
    by_name = {f.setting: f for f in result}
    assert by_name["statement_timeout"].severity == "error"
    assert by_name["lock_timeout"].severity == "warning"
    assert "ALTER ROLE" in (by_name["statement_timeout"].fix or "")
    assert postgres.audit_failed(result)
