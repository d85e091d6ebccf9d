"""The ASGI middleware frees each request by reference counting: no cyclic garbage.

A reference cycle per request would leave every request's objects to the cyclic
collector, whose runs cost more under load than the middleware's own work. The app is
called directly (the object graph is under test, not the server), with the messages an
ASGI server sends.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import MutableMapping
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

import deadlines
from deadlines.asgi import DeadlineMiddleware


async def _home(request: Request) -> PlainTextResponse:
    assert deadlines.current() is not None
    return PlainTextResponse("ok")


async def _echo(request: Request) -> JSONResponse:
    return JSONResponse({"size": len(await request.body())})


APP = DeadlineMiddleware(
    Starlette(routes=[Route("/", _home), Route("/echo", _echo, methods=["POST"])]),
    default=2.0,
    maximum=10.0,
)


async def _request(method: str, path: str, body: bytes = b"") -> int:
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"test"), (b"x-request-timeout-ms", b"1500")],
        "client": ("127.0.0.1", 40000),
        "server": ("127.0.0.1", 8000),
    }
    chunks = [body[:3], body[3:]]
    statuses: list[int] = []

    async def receive() -> dict[str, Any]:
        if chunks:
            chunk = chunks.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}
        await asyncio.sleep(3600)  # a client that stays: never http.disconnect
        raise AssertionError("unreachable")

    async def send(message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    await APP(scope, receive, send)
    return statuses[0]


@pytest.mark.anyio
async def test_requests_leave_no_cyclic_garbage() -> None:
    """GETs and POSTs with a body, each in its own task as servers run them."""

    async def one_round() -> None:
        for _ in range(25):
            assert await asyncio.create_task(_request("GET", "/")) == 200
            assert await asyncio.create_task(_request("POST", "/echo", b"hello body")) == 200

    await one_round()  # warm: route cache, per-loop timers, first-use caches
    gc.collect()
    gc.disable()
    try:
        await one_round()
        found = gc.collect()
    finally:
        gc.enable()
    assert found == 0
