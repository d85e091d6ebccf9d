"""deadlines.sqlalchemy with an AsyncEngine (asyncpg) against the real Postgres.

SQLAlchemy's asyncio support needs greenlet, which the `sqlalchemy` extra installs
(`sqlalchemy[asyncio]`); a missing greenlet fails these tests rather than hiding them.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import psycopg
import pytest
from pgtest_support import running
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

import deadlines
from deadlines.sqlalchemy import install
from testservers import Postgres

pytestmark = [pytest.mark.postgres, pytest.mark.realtime, pytest.mark.anyio]

Admin = psycopg.Connection[tuple[object, ...]]


@pytest.fixture
async def aengine(pg_server: Postgres, app_name: str) -> AsyncIterator[AsyncEngine]:
    """An asyncpg-backed AsyncEngine with the hooks installed."""
    eng = create_async_engine(
        pg_server.url("postgresql+asyncpg"),
        pool_size=2,
        connect_args={"server_settings": {"application_name": app_name}, "ssl": False},
    )
    install(eng)
    yield eng
    await eng.dispose()


async def test_async_pg_sleep_cancelled_at_the_budget(
    aengine: AsyncEngine, admin: Admin, app_name: str
) -> None:
    """AsyncEngine: pg_sleep(5) under a 0.5 s budget ends at the budget."""
    start = time.monotonic()
    with pytest.raises(deadlines.DeadlineExceeded):
        async with deadlines.scope(0.5), aengine.begin() as conn:
            await conn.execute(text("SELECT pg_sleep(5)"))
    assert 0.45 <= time.monotonic() - start <= 1.0
    assert running(admin, app_name) == []


async def test_async_limits_only_inside_a_scope(aengine: AsyncEngine) -> None:
    """AsyncEngine: limits are set inside a scope and not outside."""
    async with deadlines.scope(2.0), aengine.begin() as conn:
        inside = str((await conn.execute(text("SHOW statement_timeout"))).scalar_one())
    async with aengine.begin() as conn:
        outside = str((await conn.execute(text("SHOW statement_timeout"))).scalar_one())
    assert inside.endswith("ms") and 1800 <= int(inside[:-2]) <= 2000
    assert outside == "0"
