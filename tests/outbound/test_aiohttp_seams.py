"""deadlines.aiohttp's reliance on aiohttp's connector: pinned so an upgrade fails loudly.

`deadlines.aiohttp` learns when a call leaves the pool and starts connecting by
overriding two private steps of `aiohttp.BaseConnector.connect` (the places where
aiohttp sends its own ``connection_queued_*`` and ``connection_create_*`` trace
events), because a `TraceConfig` makes aiohttp build and await all of its trace events
for every request. If aiohttp renames or reshapes them, these tests fail, before a
connect timeout could be reported as a pool timeout.
"""

from __future__ import annotations

import asyncio
import inspect
import time

import aiohttp
import pytest
from outbound_helpers import fired_at

import deadlines
import deadlines.aiohttp as daiohttp
from deadlines import ConnectTimeout, Dependency, PoolTimeout
from deadlines.aiohttp._aiohttp import SEAMS
from deadlines.lab.servers import BlackholeServer, HealthyServer, SlowServer

pytestmark = [pytest.mark.realtime, pytest.mark.anyio]


def _parameters(function: object) -> list[str]:
    return list(inspect.signature(function).parameters)  # type: ignore[arg-type]


def test_the_connector_steps_we_override_keep_their_shape() -> None:
    """aiohttp's connect still calls the two private steps, with the arguments we pass on."""
    connector = aiohttp.BaseConnector
    for name in SEAMS["BaseConnector"]:
        assert hasattr(connector, name), name
    assert _parameters(connector.connect) == ["self", "req", "traces", "timeout"]
    assert _parameters(connector._create_connection) == ["self", "req", "traces", "timeout"]
    assert _parameters(aiohttp.TCPConnector._create_connection) == [
        "self",
        "req",
        "traces",
        "timeout",
    ]
    assert _parameters(connector._wait_for_available_connection) == ["self", "key", "traces"]
    source = inspect.getsource(connector.connect)
    assert "self._create_connection(req, traces, timeout)" in source
    assert "self._wait_for_available_connection(key, traces)" in source


def test_the_protocols_read_timer_is_there() -> None:
    """The body's idle timer is started through the connection's protocol, as pinned."""
    from aiohttp.client_proto import ResponseHandler

    for name in SEAMS["ResponseHandler"]:
        assert hasattr(ResponseHandler, name), name
    assert isinstance(inspect.getattr_static(ResponseHandler, "read_timeout"), property)
    assert inspect.getattr_static(ResponseHandler, "read_timeout").fset is not None
    assert _parameters(ResponseHandler.start_timeout) == ["self"]


async def test_the_session_uses_no_trace_config() -> None:
    """Without the caller's own trace configs, aiohttp sends no trace events at all."""
    async with daiohttp.session(Dependency("t")) as session:
        assert session.trace_configs == []
        assert isinstance(session.connector, aiohttp.TCPConnector)


async def test_a_new_connection_is_bounded_by_connect_not_pool_wait() -> None:
    """Connecting is its own phase: a blackhole fails as ConnectTimeout at `connect`."""
    dep = Dependency("t", connect=0.3, pool_wait=2, headers=2, total=3)
    with BlackholeServer() as server:
        async with daiohttp.session(dep) as http:
            start = time.monotonic()
            with pytest.raises(ConnectTimeout) as caught:
                await http.get(server.url)
            assert fired_at(time.monotonic() - start, 0.3)
            assert caught.value.pool_wait == 0.0
            assert caught.value.request_sent is False


async def test_a_queued_call_reports_its_pool_wait_and_the_time_left() -> None:
    """A call that waited for a pooled connection reports the wait; the header excludes it."""
    dep = Dependency("t", headers=5, total=5, pool_size=1, pool_wait=5)
    with SlowServer(0.3) as server:
        async with daiohttp.session(dep) as http:

            async def hold() -> None:
                async with http.get(server.url) as response:
                    await response.read()

            holder = asyncio.create_task(hold())
            assert await asyncio.to_thread(server.wait_requests, 1)
            async with deadlines.scope(3.0), http.get(server.url) as response:
                await response.read()
            await holder
            assert response.pool_wait is not None
            assert 0.1 < response.pool_wait < 2.0
            sent = int(server.requests[-1].headers["x-request-timeout-ms"])
            assert sent <= 3000 - 1000 * response.pool_wait + 50
        assert server.opened == 1


async def test_a_caller_trace_config_still_sees_its_events() -> None:
    """The caller's own TraceConfig is passed on and hears aiohttp's events."""
    seen: list[str] = []

    async def on_start(session: object, context: object, params: object) -> None:
        seen.append("start")

    config = aiohttp.TraceConfig()
    config.on_request_start.append(on_start)
    with HealthyServer() as server:
        async with (
            daiohttp.session(Dependency("t"), trace_configs=[config]) as http,
            http.get(server.url) as response,
        ):
            assert response.status == 200
    assert seen == ["start"]


async def test_a_slow_caller_middleware_is_bounded_too() -> None:
    """Time in the caller's middleware before connecting counts (as the pool phase)."""

    async def slow(
        request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        await asyncio.sleep(5)
        return await handler(request)

    dep = Dependency("t", pool_wait=0.2, headers=2, total=3)
    with HealthyServer() as server:
        async with daiohttp.session(dep, middlewares=(slow,)) as http:
            start = time.monotonic()
            with pytest.raises(PoolTimeout):
                await http.get(server.url)
            assert fired_at(time.monotonic() - start, 0.2)
        assert server.opened == 0
