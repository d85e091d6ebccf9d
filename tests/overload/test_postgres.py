"""The adaptive limit on a dependency that is not HTTP: asyncpg transactions."""

from __future__ import annotations

import asyncpg
import pytest

from deadlines import AdaptiveLimit, CallRefused, Dependency
from deadlines.asyncpg import transaction
from testservers import Postgres

pytestmark = [pytest.mark.postgres, pytest.mark.anyio]


async def test_transactions_above_the_limit_are_refused_before_a_connection(
    pg_server: Postgres,
) -> None:
    """Limit 1: a second transaction while one is open is refused, nothing sent; the
    place comes back when the first ends."""
    limit = AdaptiveLimit(initial=1, max_limit=1)
    db = Dependency("db", limit=limit)
    pool = await asyncpg.create_pool(pg_server.url(), min_size=0, max_size=2, ssl=False)
    try:
        async with transaction(pool, dependency=db) as conn:
            assert await conn.fetchval("select 1") == 1
            with pytest.raises(CallRefused):
                async with transaction(pool, dependency=db):
                    pass
            assert pool.get_size() == 1  # the refused one took no connection
        async with transaction(pool, dependency=db) as conn:
            assert await conn.fetchval("select 2") == 2
        assert limit.in_flight == 0
    finally:
        await pool.close()
