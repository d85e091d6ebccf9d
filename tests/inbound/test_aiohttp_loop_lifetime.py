"""One aiohttp.web DeadlineMiddleware serving loop after loop does not keep them alive.

An app factory with a module-level middleware, served under ``asyncio.run`` again and
again (a loop per test, CLI tools), must not keep every loop the middleware has seen:
neither through its per-loop pollers nor through the deadline timers of its requests.
The most recent loop may stay until another one comes along, so each check serves once
more after the loops it looks at.
"""

from __future__ import annotations

import asyncio
import gc
import weakref

import aiohttp
import httpx
from aiohttp import web, web_app

import deadlines
from deadlines.aiohttp_web import DeadlineMiddleware

from .conftest import free_socket, serve_aiohttp

LoopRef = weakref.ref[asyncio.AbstractEventLoop]


def build(middleware: DeadlineMiddleware, loops: list[LoopRef]) -> web.Application:
    """A fresh app around the shared middleware; its handler notes the serving loop."""

    async def info(request: web.Request) -> web.Response:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        return web.json_response({"remaining": deadlines.remaining()})

    app = web.Application(middlewares=[middleware])
    app.router.add_get("/info", info)
    return app


async def serve_once(middleware: DeadlineMiddleware, loops: list[LoopRef]) -> None:
    """Serve on this loop (loopback, port 0, as `serve_aiohttp` does), ask once, stop."""
    sock = free_socket()
    runner = web.AppRunner(build(middleware, loops), access_log=None)
    try:
        await runner.setup()
        await web.SockSite(runner, sock).start()
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{sock.getsockname()[1]}/info") as response,
        ):
            assert response.status == 200
            assert 0 < (await response.json())["remaining"] <= 5.0
    finally:
        await runner.cleanup()
        sock.close()


def _alive(loops: list[LoopRef]) -> int:
    # aiohttp's own cache of built middleware chains (up to 1024, keyed by handler and
    # app) keeps recent apps, and through `app._loop` their loops: not ours to free.
    web_app._cached_build_middleware.cache_clear()
    gc.collect()
    return sum(ref() is not None for ref in loops)


def test_asyncio_run_loops_are_freed() -> None:
    """Four asyncio.run calls, each serving a real request through one middleware."""
    middleware = DeadlineMiddleware(default=5.0, maximum=5.0)
    loops: list[LoopRef] = []
    for _ in range(4):
        asyncio.run(serve_once(middleware, loops))
    assert len(loops) == 4
    asyncio.run(serve_once(middleware, []))  # the most recent loop may stay until then
    assert _alive(loops) == 0


def test_loops_of_threaded_servers_are_freed() -> None:
    """The same with `serve_aiohttp`: a loop per server, in its own thread, closed after."""
    middleware = DeadlineMiddleware(default=5.0, maximum=5.0)
    loops: list[LoopRef] = []
    for _ in range(3):
        with serve_aiohttp(build(middleware, loops)) as url:
            assert httpx.get(f"{url}/info").status_code == 200
    with serve_aiohttp(build(middleware, [])) as url:
        assert httpx.get(f"{url}/info").status_code == 200
    assert len(loops) == 3
    assert _alive(loops) == 0
