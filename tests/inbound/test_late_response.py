"""A response that starts after the request's deadline is a 504, whoever's timer fired first.

An outbound call bounded by the request's deadline has a timer of its own at the same
instant as the middleware's. When the call's fires first, its `DeadlineExceeded` is also
the client's timeout (`httpx.TimeoutException`), and a handler that falls back on a
timeout returns a late 200 that nobody waits for; when the middleware's fires first, the
handler is cancelled and the answer is 504. The answer must not depend on which timer
the loop runs first. Served by uvicorn on loopback, as the race showed there.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest
from aiohttp import web
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import deadlines
import deadlines.httpx
from deadlines.aiohttp_web import DeadlineMiddleware as AiohttpDeadlineMiddleware
from deadlines.asgi import DeadlineMiddleware
from deadlines.lab.servers import SilentServer

from .conftest import serve_aiohttp, serve_uvicorn

pytestmark = pytest.mark.realtime

DEP = deadlines.Dependency("silent", headers=5.0, total=5.0)
REQUESTS = 40


def _app(silent_url: str) -> DeadlineMiddleware:
    async def fallback_on_timeout(request: Request) -> JSONResponse:
        async with deadlines.httpx.AsyncClient(DEP) as client:
            try:
                await client.get(silent_url)
            except httpx.TimeoutException as exc:  # the user's fallback for "timed out"
                return JSONResponse({"fallback": type(exc).__name__})
        return JSONResponse({"answered": True})

    async def blocks_past_the_deadline(request: Request) -> JSONResponse:
        time.sleep(0.3)  # no checkpoint: no timer can cut it
        return JSONResponse({"late": True})

    routes = [Route("/fallback", fallback_on_timeout), Route("/blocks", blocks_past_the_deadline)]
    return DeadlineMiddleware(Starlette(routes=routes), default=2.0, maximum=10.0)


@pytest.fixture
def base() -> Iterator[str]:
    with SilentServer() as silent, serve_uvicorn(_app(silent.url)) as url:
        yield url


def test_a_fallback_returned_after_the_deadline_is_a_504(base: str) -> None:
    """The call's own timer and the middleware's at one instant: 504 every time."""
    headers = {"x-request-timeout-ms": "150"}
    with httpx.Client(base_url=base, timeout=5.0) as client:
        statuses = [client.get("/fallback", headers=headers).status_code for _ in range(REQUESTS)]
    assert statuses == [504] * REQUESTS, statuses


def test_a_response_started_after_the_deadline_is_a_504(base: str) -> None:
    """A handler that blocked past its deadline (no timer could run) still answers 504."""
    with httpx.Client(base_url=base, timeout=5.0) as client:
        response = client.get("/blocks", headers={"x-request-timeout-ms": "100"})
    assert response.status_code == 504
    assert response.json()["error"] == "deadline exceeded"


def test_aiohttp_web_answers_504_for_a_response_made_after_the_deadline() -> None:
    """aiohttp.web: the same rule for a handler that blocked past its deadline."""

    async def blocks(request: web.Request) -> web.Response:
        time.sleep(0.3)  # no checkpoint: no timer can cut it
        return web.json_response({"late": True})

    app = web.Application(middlewares=[AiohttpDeadlineMiddleware(default=2.0, maximum=10.0)])
    app.router.add_get("/blocks", blocks)
    with serve_aiohttp(app) as base, httpx.Client(base_url=base, timeout=5.0) as client:
        response = client.get("/blocks", headers={"x-request-timeout-ms": "100"})
    assert response.status_code == 504
    assert response.json()["error"] == "deadline exceeded"
