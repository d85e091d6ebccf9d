"""deadlines.logs: one structured record per timeout, from real calls on loopback."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest

import deadlines
from deadlines import (
    CallFinished,
    ConnectTimeout,
    DeadlineExceeded,
    Dependency,
    HeadersTimeout,
    PoolTimeout,
    logs,
)
from deadlines._events import emit
from deadlines.httpx import AsyncClient
from deadlines.lab.servers import BlackholeServer, HealthyServer, SilentServer

pytestmark = pytest.mark.anyio


class Records(logging.Handler):
    """Keeps every record it handles."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def records() -> Iterator[list[logging.LogRecord]]:
    """Records reaching the "deadlines" logger while deadlines.logs is installed."""
    handler = Records()
    logger = logging.getLogger("deadlines")
    logger.addHandler(handler)
    try:
        with logs.install():
            yield handler.records
    finally:
        logger.removeHandler(handler)


@pytest.mark.realtime
async def test_headers_timeout_logs_one_structured_record(records: list[logging.LogRecord]) -> None:
    """A silent server: one WARNING naming dependency, phase, limit, elapsed, sent."""
    dep = Dependency("inventory", headers=0.3)
    with SilentServer() as server, pytest.raises(HeadersTimeout):
        async with AsyncClient(dep, base_url=server.url) as client:
            await client.get("/")
    (record,) = records
    assert record.name == "deadlines"
    assert record.levelno == logging.WARNING
    assert record.dependency == "inventory"  # type: ignore[attr-defined]
    assert record.outcome == "timeout"  # type: ignore[attr-defined]
    assert record.phase == "headers"  # type: ignore[attr-defined]
    assert record.limit == pytest.approx(0.3)  # type: ignore[attr-defined]
    assert 0.29 <= record.elapsed <= 0.8  # type: ignore[attr-defined]
    assert record.pool_wait is not None and record.pool_wait < 0.1  # type: ignore[attr-defined]
    assert record.request_sent is True  # type: ignore[attr-defined]
    message = record.getMessage()
    assert message.startswith("inventory: headers timeout after ")
    assert "(limit 300 ms, pool wait " in message
    assert message.endswith("; request sent, outcome unknown")


@pytest.mark.realtime
async def test_connect_and_pool_timeouts_say_nothing_was_sent(
    records: list[logging.LogRecord],
) -> None:
    """Connect and pool timeouts log request_sent=False; the pool one its long wait."""
    alone = Dependency("ledger", connect=0.2)
    one_slot = Dependency("ledger", connect=0.4, pool_size=1, pool_wait=0.15)
    with BlackholeServer() as hole:
        async with AsyncClient(alone, base_url=hole.url) as client:
            with pytest.raises(ConnectTimeout):
                await client.get("/")
        async with AsyncClient(one_slot, base_url=hole.url) as client:
            first = asyncio.create_task(client.get("/"))
            await asyncio.sleep(0.05)  # the first call holds the only slot, connecting
            with pytest.raises(PoolTimeout):
                await client.get("/")
            with pytest.raises(ConnectTimeout):
                await first
    connect, pool, connect_again = records
    assert connect.phase == "connect" and connect.request_sent is False  # type: ignore[attr-defined]
    assert pool.phase == "pool" and pool.request_sent is False  # type: ignore[attr-defined]
    assert 0.14 <= pool.pool_wait <= 0.6  # type: ignore[attr-defined]
    assert pool.getMessage().endswith("; request not sent, safe to retry")
    assert connect_again.phase == "connect"  # type: ignore[attr-defined]


@pytest.mark.realtime
async def test_request_deadline_logs_as_deadline(records: list[logging.LogRecord]) -> None:
    """A call stopped by the request's deadline logs once, as a deadline."""
    with SilentServer() as server, pytest.raises(DeadlineExceeded):
        async with (
            AsyncClient(Dependency("profile"), base_url=server.url) as client,
            deadlines.scope(0.2),
        ):
            await client.get("/")
    (record,) = records
    assert record.outcome == "deadline"  # type: ignore[attr-defined]
    assert "deadline exceeded" in record.getMessage()


async def test_successes_and_errors_are_not_logged(records: list[logging.LogRecord]) -> None:
    """Only timeouts log: a good call, an error or a fail-fast stays quiet."""
    with HealthyServer() as server:
        async with AsyncClient(Dependency("fine"), base_url=server.url) as client:
            assert (await client.get("/")).status_code == 200
    emit(CallFinished("x", "error", 0.1, 1.0, error=ValueError("boom")))
    emit(CallFinished("x", "budget_exhausted", 0.0, 0.01))
    emit(CallFinished("x", "cancelled", 0.1, 1.0))
    assert records == []


def test_level_logger_and_uninstall() -> None:
    """A chosen logger and level are used; below the logger's level, or uninstalled, quiet."""
    handler = Records()
    logger = logging.getLogger("test.deadlines.timeouts")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        with logs.install(logger, logging.ERROR) as handle:
            emit(CallFinished("x", "timeout", 0.1, 1.0, phase="connect", limit=0.1))
            assert handle.level == logging.ERROR
        emit(CallFinished("x", "timeout", 0.1, 1.0, phase="connect", limit=0.1))
        with logs.install(logger, logging.DEBUG):
            emit(CallFinished("x", "timeout", 0.1, 1.0, phase="connect", limit=0.1))
        assert [r.levelno for r in handler.records] == [logging.ERROR]
        with pytest.raises(TypeError, match="level"):
            logs.install(logger, "WARNING")  # type: ignore[arg-type]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)
