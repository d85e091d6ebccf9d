"""deadlines.aiohttp as a drop-in: the session is aiohttp's own, its whole API at work.

WebSockets, cookies, redirects, a connector or response class of the user's, the
middleware on a session of the user's, and a request that leaves the middleware out:
each against a real aiohttp.web server (or a misbehaving one) on loopback.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from outbound_helpers import finished_events, fired_at

import deadlines
import deadlines.aiohttp as daiohttp
from deadlines import Dependency, HeadersTimeout, TotalTimeout
from deadlines.lab.servers import SilentServer

pytestmark = [pytest.mark.realtime, pytest.mark.anyio]

DEP = Dependency("d", connect=0.5, headers=0.4, idle=0.4, total=0.8, pool_size=2, pool_wait=0.2)


async def _echo(request: web.Request) -> web.WebSocketResponse:
    ws = web.WebSocketResponse()
    await ws.prepare(request)
    async for message in ws:
        await ws.send_str(f"echo {message.data}")
    return ws


async def _cookie(request: web.Request) -> web.Response:
    response = web.Response(text=request.cookies.get("seen", "none"))
    response.set_cookie("seen", "yes")
    return response


async def _redirect(request: web.Request) -> web.Response:
    raise web.HTTPFound("/landed")


async def _landed(request: web.Request) -> web.Response:
    return web.Response(text="landed " + request.headers.get("x-request-timeout-ms", "-"))


@pytest.fixture
async def server() -> AsyncIterator[str]:
    """An aiohttp.web app on loopback: a WebSocket echo, a cookie, a redirect."""
    app = web.Application()
    app.router.add_get("/ws", _echo)
    app.router.add_get("/cookie", _cookie)
    app.router.add_get("/redirect", _redirect)
    app.router.add_get("/landed", _landed)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_a_websocket_outlives_the_total_once_open(server: str) -> None:
    """ws_connect works; the call ends at the handshake, so the socket lives past total."""
    with finished_events() as seen:
        async with daiohttp.session(DEP) as http, http.ws_connect(server + "/ws") as ws:
            await ws.send_str("one")
            assert (await ws.receive_str()) == "echo one"
            await asyncio.sleep(DEP.total + 0.2)
            await ws.send_str("two")
            assert (await ws.receive_str()) == "echo two"
    assert [(e.outcome, e.phase) for e in seen] == [("ok", None)]


async def test_a_websocket_handshake_is_bounded() -> None:
    """A server that never answers the upgrade: HeadersTimeout at the headers cap."""
    with SilentServer() as silent:
        async with daiohttp.session(DEP) as http:
            start = time.monotonic()
            with pytest.raises(HeadersTimeout) as caught:
                await http.ws_connect(silent.url + "/ws")
            assert fired_at(time.monotonic() - start, DEP.headers)
            assert isinstance(caught.value, aiohttp.ServerTimeoutError)


async def test_cookies_and_redirects(server: str) -> None:
    """The cookie jar keeps cookies; each redirect hop is a call of its own, with the header."""
    with finished_events() as seen:
        jar = aiohttp.CookieJar(unsafe=True)  # cookies for an IP address, as on loopback
        async with daiohttp.session(DEP, cookie_jar=jar) as http, deadlines.scope(0.7):
            async with http.get(server + "/cookie") as first:
                assert await first.text() == "none"
            async with http.get(server + "/cookie") as second:
                assert await second.text() == "yes"
            assert any(cookie.key == "seen" for cookie in http.cookie_jar)
            async with http.get(server + "/redirect") as landed:
                text = await landed.text()
    assert text.startswith("landed ") and 0 < int(text.split()[1]) <= 700
    assert [e.outcome for e in seen] == ["ok"] * 4  # two cookies, the redirect, its target


async def test_a_request_without_the_middleware_is_refused(server: str) -> None:
    """A request's middlewares= replaces the session's: refused, never unbounded."""
    async with daiohttp.session(DEP) as http:
        with pytest.raises(RuntimeError, match="without its middleware"):
            await http.get(server + "/landed", middlewares=())
        async with http.get(
            server + "/landed", middlewares=(daiohttp.middleware(DEP),)
        ) as response:
            assert response.status == 200


async def test_the_middleware_bounds_a_session_of_the_users() -> None:
    """middleware(dep) on the user's own session and connector: the head within the total."""
    with SilentServer() as silent:
        async with aiohttp.ClientSession(
            middlewares=[daiohttp.middleware(DEP)], response_class=daiohttp.Response
        ) as http:
            start = time.monotonic()
            with pytest.raises(TotalTimeout) as caught:
                await http.get(silent.url)
            assert fired_at(time.monotonic() - start, DEP.total)
            assert caught.value.phase == "headers"
            assert isinstance(caught.value, aiohttp.SocketTimeoutError)
            assert silent.requests[0].headers["x-request-timeout-ms"]


async def test_a_connector_or_response_class_of_the_users(server: str) -> None:
    """connector= and response_class= are taken: bounded still, the call reported at release."""

    class Mine(aiohttp.ClientResponse):
        mine = True

    with finished_events() as seen:
        connector = aiohttp.TCPConnector(limit=5)
        async with daiohttp.session(DEP, connector=connector, response_class=Mine) as http:
            async with http.get(server + "/landed") as response:
                assert isinstance(response, Mine) and response.mine
                assert isinstance(response, daiohttp.Response)
                assert not seen  # not yet: the response is still open
            assert [e.outcome for e in seen] == ["ok"]
    with pytest.raises(TypeError, match="with connector= of your own"):
        daiohttp.session(DEP, connector=aiohttp.TCPConnector(), ssl=False)
