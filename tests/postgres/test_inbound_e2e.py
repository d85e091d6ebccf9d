"""End to end: a real HTTP request whose caller disconnects stops its Postgres query."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import asyncpg
import psycopg
import pytest
import uvicorn
from pgtest_support import running, wait_running

from deadlines.asgi import DeadlineMiddleware
from deadlines.asyncpg import transaction
from testservers import Postgres

pytestmark = [pytest.mark.postgres, pytest.mark.realtime, pytest.mark.anyio]


async def test_caller_disconnecting_cancels_the_query_on_the_server(
    pg_server: Postgres, admin: psycopg.Connection[tuple[object, ...]], app_name: str
) -> None:
    """uvicorn + DeadlineMiddleware: when the HTTP client hangs up mid-query, the
    handler is cancelled and Postgres stops running the statement."""
    pool = await asyncpg.create_pool(
        pg_server.url(),
        min_size=1,
        max_size=1,
        ssl=False,
        server_settings={"application_name": app_name},
    )
    finished: list[str] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            async with transaction(pool) as conn:
                await conn.execute("SELECT pg_sleep(20)")
        except BaseException as exc:
            finished.append(type(exc).__name__)
            raise
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})

    config = uvicorn.Config(
        DeadlineMiddleware(app, default=10.0, maximum=10.0),
        host="127.0.0.1",
        port=0,
        lifespan="off",
        ws="none",
        log_level="critical",
    )
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve())
    try:
        while not server.started:
            await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nhost: test\r\nx-request-timeout-ms: 8000\r\n\r\n")
        await writer.drain()
        await asyncio.to_thread(wait_running, admin, app_name)
        left = time.monotonic()
        writer.close()  # the caller leaves
        await writer.wait_closed()
        while (running(admin, app_name) or not finished) and time.monotonic() - left < 2.0:
            await asyncio.sleep(0.02)
        stopped_after = time.monotonic() - left
        print(f"query stopped {stopped_after * 1000:.0f} ms after the caller left")
        assert running(admin, app_name) == []
        assert stopped_after < 1.0
        assert finished == ["CancelledError"]
        assert pool.get_idle_size() == pool.get_size()
    finally:
        server.should_exit = True
        await asyncio.wait_for(serving, 5)
        await pool.close()
