"""Bad deadline headers, as raw bytes over real sockets, against every inbound middleware.

Whatever a caller sends, the middleware never fails the request and never grants more
than the route's maximum (2.0 s here, 1.95 s after the reserve).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack
from typing import Any

import httpx
import pytest
from aiohttp import web
from flask import Flask, jsonify
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import deadlines
from deadlines import aiohttp_web, asgi, wsgi

from .conftest import raw_request, serve_aiohttp, serve_hypercorn, serve_uvicorn, serve_waitress

pytestmark = pytest.mark.realtime

LIMITS: dict[str, Any] = {"default": 1.0, "maximum": 2.0, "reserve": 0.05}
MOST = 1.95  # maximum - reserve
DEFAULT = 0.95

BAD_VALUES: list[bytes] = [
    b"abc",
    b"-5",
    b"-0",
    b"+500",
    b"1e3",
    b"0x10",
    b"1.5",
    b"500ms",
    b"NaN",
    b"inf",
    b"",
    b",,,",
    b"99999999999999999999999999",
    b"9" * 4000,
    "١٢٣".encode(),  # Arabic-Indic digits: isdigit() would accept them
    "²".encode(),
    b"\xff\xfe\x80",
    b"5 00",
    b"500;q=1",
]
HUGE_VALUES: list[bytes] = [b"600000", b"999999999999", b"50000, 60000"]


def starlette() -> Any:
    """A Starlette app reporting its deadline."""

    async def info(request: Request) -> JSONResponse:
        return JSONResponse({"remaining": deadlines.remaining()})

    return asgi.DeadlineMiddleware(Starlette(routes=[Route("/info", info)]), **LIMITS)


def aiohttp_app() -> web.Application:
    """An aiohttp app reporting its deadline."""

    async def info(request: web.Request) -> web.Response:
        return web.json_response({"remaining": deadlines.remaining()})

    app = web.Application(middlewares=[aiohttp_web.DeadlineMiddleware(**LIMITS)])
    app.router.add_get("/info", info)
    return app


def flask_app() -> Flask:
    """A Flask app reporting its deadline."""
    app = Flask(__name__)

    @app.get("/info")
    def info() -> Any:
        return jsonify(remaining=deadlines.remaining())

    app.wsgi_app = wsgi.DeadlineMiddleware(app.wsgi_app, **LIMITS)  # type: ignore[method-assign]
    return app


SERVERS: dict[str, Callable[[], AbstractContextManager[str]]] = {
    "uvicorn": lambda: serve_uvicorn(starlette()),
    "uvicorn-h11": lambda: serve_uvicorn(starlette(), http="h11"),
    "hypercorn": lambda: serve_hypercorn(starlette()),
    "aiohttp": lambda: serve_aiohttp(aiohttp_app()),
    "waitress": lambda: serve_waitress(flask_app()),
}


@pytest.fixture(scope="module")
def ports() -> Iterator[dict[str, int]]:
    """One server of each kind, by name, for the whole module."""
    with ExitStack() as stack:
        found: dict[str, int] = {}
        for name, start in SERVERS.items():
            port = httpx.URL(stack.enter_context(start())).port
            assert port is not None
            found[name] = port
        yield found


def ask(port: int, headers: list[tuple[bytes, bytes]]) -> tuple[int, float | None]:
    """GET /info with raw header lines; the status and the remaining time seen, if any."""
    lines = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
    answer = raw_request(
        port, b"GET /info HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + lines + b"\r\n"
    )
    status = int(answer.split(b" ", 2)[1])
    if status != 200:
        return status, None
    return status, json.loads(answer.partition(b"\r\n\r\n")[2])["remaining"]


HEADERS = [b"x-request-timeout-ms", b"grpc-timeout", b"x-envoy-expected-rq-timeout-ms"]


@pytest.mark.parametrize("server", list(SERVERS))
def test_garbage_values_fall_back_to_default(server: str, ports: dict[str, int]) -> None:
    """Garbage in any known header is ignored: the default applies, nothing fails."""
    port = ports[server]
    for value in BAD_VALUES:
        for name in HEADERS:
            status, left = ask(port, [(name, value)])
            # The HTTP parser itself may refuse odd bytes (400/431); the app never fails.
            assert status in (200, 400, 431), (name, value, status)
            if left is not None:
                assert DEFAULT - 0.2 < left <= DEFAULT, (name, value, left)
    assert ask(port, [])[0] == 200


@pytest.mark.parametrize("server", list(SERVERS))
def test_huge_and_repeated_values_never_exceed_maximum(server: str, ports: dict[str, int]) -> None:
    """Huge, repeated and mixed values are capped at the route maximum; the smallest wins."""
    port = ports[server]
    for value in HUGE_VALUES:
        status, left = ask(port, [(HEADERS[0], value)])
        assert status == 200
        assert left is not None
        assert MOST - 0.2 < left <= MOST, (value, left)
    repeated = [(HEADERS[0], b"abc"), (HEADERS[0], b"99999"), (HEADERS[0], b"700")]
    status, left = ask(port, repeated)
    assert left is not None
    assert 0.45 < left <= 0.65
    mixed = [(HEADERS[0], b"junk"), (HEADERS[1], b"800m"), (HEADERS[2], b"-1")]
    status, left = ask(port, mixed)
    assert left is not None
    assert 0.55 < left <= 0.75


@pytest.mark.parametrize("server", list(SERVERS))
def test_zero_among_garbage_is_expired(server: str, ports: dict[str, int]) -> None:
    """A valid 0 anywhere means the caller has no time left: 504 without running."""
    status, _ = ask(ports[server], [(HEADERS[0], b"abc"), (HEADERS[1], b"0m")])
    assert status == 504


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    value=st.binary(min_size=0, max_size=40).filter(
        lambda v: b"\r" not in v and b"\n" not in v and b"\x00" not in v
    ),
    name=st.sampled_from(HEADERS),
)
def test_any_header_bytes_never_fail_or_extend(
    ports: dict[str, int], value: bytes, name: bytes
) -> None:
    """Any bytes as a deadline header: never a server error, never above the maximum."""
    status, left = ask(ports["uvicorn"], [(name, value.strip())])
    assert status in (200, 400, 504)
    if left is not None:
        assert left <= MOST
