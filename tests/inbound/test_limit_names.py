"""The 504's "limit" names what set the budget, on all three HTTP middlewares.

A caller reading the 504 needs to know which number to look at: the header that
carried the smallest valid value (ours, a server's own stand-in for it, grpc-timeout,
Envoy's), the route's maximum when the caller asked for more, or the route's default.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

import deadlines

from .conftest import serve_aiohttp, serve_uvicorn, serve_waitress

pytestmark = pytest.mark.realtime

# Default 0.3 s, maximum 0.4 s: every case ends within half a second.
LIMITS = {"default": 0.3, "maximum": 0.4}


@contextlib.contextmanager
def asgi(header: str) -> Iterator[str]:
    """A do-nothing-but-wait ASGI app under uvicorn."""
    from deadlines.asgi import DeadlineMiddleware

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.sleep(5)

    with serve_uvicorn(DeadlineMiddleware(app, header=header, **LIMITS)) as url:
        yield url


@contextlib.contextmanager
def aiohttp_web(header: str) -> Iterator[str]:
    """The same, as an aiohttp.web handler."""
    from aiohttp import web

    from deadlines.aiohttp_web import DeadlineMiddleware

    async def wait(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response(text="late")

    app = web.Application(middlewares=[DeadlineMiddleware(header=header, **LIMITS)])
    app.router.add_get("/", wait)
    with serve_aiohttp(app) as url:
        yield url


@contextlib.contextmanager
def wsgi(header: str) -> Iterator[str]:
    """The same, as a WSGI app under waitress that checks its deadline as it waits."""
    from deadlines.wsgi import DeadlineMiddleware

    def app(environ: dict[str, Any], start_response: Any) -> list[bytes]:
        for _ in range(500):
            deadlines.check()
            time.sleep(0.01)
        start_response("200 OK", [])
        return [b"late"]

    with serve_waitress(DeadlineMiddleware(app, header=header, **LIMITS)) as url:
        yield url


SERVERS: dict[str, Callable[[str], contextlib.AbstractContextManager[str]]] = {
    "asgi": asgi,
    "aiohttp": aiohttp_web,
    "wsgi": wsgi,
}

# The request's headers, and the limit its 504 must name.
CASES = [
    ({"x-request-timeout-ms": "200"}, "x-request-timeout-ms"),
    ({"grpc-timeout": "200m"}, "grpc-timeout"),
    ({"x-envoy-expected-rq-timeout-ms": "200"}, "x-envoy-expected-rq-timeout-ms"),
    ({"x-request-timeout-ms": "900", "grpc-timeout": "200m"}, "grpc-timeout"),
    ({"x-request-timeout-ms": "200", "grpc-timeout": "900m"}, "x-request-timeout-ms"),
    ({"grpc-timeout": "0m"}, "grpc-timeout"),  # expired on arrival: the handler never runs
    ({"grpc-timeout": "garbage", "x-request-timeout-ms": "-5"}, "route default"),
    ({"x-envoy-expected-rq-timeout-ms": "99999"}, "route maximum"),
    ({}, "route default"),
]


@pytest.mark.parametrize("server", list(SERVERS))
def test_504_names_the_header_that_set_the_budget(server: str) -> None:
    """Each case's 504 names the header (or route limit) whose value bound the request."""
    with SERVERS[server]("x-request-timeout-ms") as url, httpx.Client(timeout=5.0) as client:
        named = [client.get(url, headers=headers).json()["limit"] for headers, _ in CASES]
    assert named == [expected for _, expected in CASES]


@pytest.mark.parametrize("server", list(SERVERS))
def test_504_names_the_servers_own_header(server: str) -> None:
    """A server reading its own header in place of ours names that one; ours is then
    not read at all."""
    cases = [
        ({"x-budget-ms": "200"}, "x-budget-ms"),
        ({"x-budget-ms": "200", "x-request-timeout-ms": "100"}, "x-budget-ms"),
        ({"x-budget-ms": "900", "grpc-timeout": "200m"}, "grpc-timeout"),
    ]
    with SERVERS[server]("X-Budget-Ms") as url, httpx.Client(timeout=5.0) as client:
        named = [client.get(url, headers=headers).json()["limit"] for headers, _ in cases]
    assert named == [expected for _, expected in cases]
