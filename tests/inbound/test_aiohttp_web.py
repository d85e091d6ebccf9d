"""The aiohttp.web DeadlineMiddleware on a real aiohttp server on loopback."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import time
import uuid
from collections.abc import Iterator

import aiohttp
import httpx
import pytest
from aiohttp import web

import deadlines
from deadlines.aiohttp_web import DeadlineMiddleware, Limits, limits

from .apps import Record, sleep_recorded
from .conftest import Events, serve_aiohttp

pytestmark = pytest.mark.realtime


async def websocket_echo(request: web.Request) -> web.WebSocketResponse:
    """A WebSocket that answers each message with whether it runs without a deadline."""
    socket = web.WebSocketResponse()
    await socket.prepare(request)
    async for message in socket:
        await socket.send_str(f"{message.data}:{deadlines.current() is None}")
    return socket


def build(record: Record) -> web.Application:
    """An aiohttp app whose handlers report what they saw."""

    async def info(request: web.Request) -> web.Response:
        return web.json_response({"remaining": deadlines.remaining()})

    async def slow(request: web.Request) -> web.Response:
        await sleep_recorded(record, request.query["id"], 10.0)
        return web.Response(text="done")

    async def echo(request: web.Request) -> web.Response:
        body = await request.read()
        return web.json_response({"sha": hashlib.sha256(body).hexdigest()})

    async def stall(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b"first;")
        await sleep_recorded(record, request.query["id"], 10.0)
        return response

    async def finish(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b"whole")
        await response.write_eof()
        await sleep_recorded(record, request.query["id"], 10.0)  # cleanup, for nobody
        return response

    async def finish_own(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write_eof(b"whole")
        async with deadlines.scope(0.01):  # the handler's own limit, not the request's
            await asyncio.sleep(1)
        return response

    @limits(default=5.0, maximum=8.0)
    async def report(request: web.Request) -> web.Response:
        return web.json_response({"remaining": deadlines.remaining()})

    async def moved(request: web.Request) -> web.Response:
        raise web.HTTPFound("/info")

    async def broken(request: web.Request) -> web.Response:
        raise web.HTTPServiceUnavailable()

    async def busy(request: web.Request) -> web.Response:
        return web.Response(status=503, text="busy")

    middleware = DeadlineMiddleware(
        default=1.0, maximum=2.0, routes={"/bulk/*": Limits(default=3.0, maximum=4.0)}
    )
    app = web.Application(middlewares=[middleware], client_max_size=8 * 1024 * 1024)
    app.router.add_get("/info", info)
    app.router.add_get("/items/{item_id}", info)
    app.router.add_get("/bulk/run", info)
    app.router.add_get("/slow", slow)
    app.router.add_post("/echo", echo)
    app.router.add_get("/stall", stall)
    app.router.add_get("/finish", finish)
    app.router.add_get("/finish-own", finish_own)
    app.router.add_get("/report", report)
    app.router.add_get("/moved", moved)
    app.router.add_get("/broken", broken)
    app.router.add_get("/busy", busy)
    app.router.add_get("/chat", websocket_echo)
    return app


@pytest.fixture(scope="module")
def url(record: Record) -> Iterator[str]:
    """The aiohttp server's base URL."""
    with serve_aiohttp(build(record)) as base:
        yield base


def ms(value: str) -> dict[str, str]:
    """The deadline header."""
    return {"x-request-timeout-ms": value}


def test_budget_from_header_default_maximum_and_routes(url: str, events: Events) -> None:
    """Header, default, maximum, @limits and the route map set the handler's deadline."""
    assert 0.5 < httpx.get(f"{url}/info", headers=ms("800")).json()["remaining"] <= 0.75
    assert 0.8 < httpx.get(f"{url}/info").json()["remaining"] <= 0.95
    assert 1.8 < httpx.get(f"{url}/info", headers=ms("99999")).json()["remaining"] <= 1.95
    assert 4.5 < httpx.get(f"{url}/report").json()["remaining"] <= 4.95
    assert 2.5 < httpx.get(f"{url}/bulk/run").json()["remaining"] <= 2.95
    httpx.get(f"{url}/items/3")
    httpx.get(f"{url}/missing")
    routes = [e.route for e in events.wait_finished(7)]
    assert routes[-2:] == ["/items/{item_id}", "*"]


def test_504_on_deadline_and_on_arrival(url: str, record: Record, events: Events) -> None:
    """The handler is cancelled at the deadline with a JSON 504; header 0 never runs it."""
    rid = uuid.uuid4().hex
    begin = time.monotonic()
    response = httpx.get(f"{url}/slow?id={rid}", headers=ms("300"), timeout=5)
    assert response.status_code == 504
    assert 0.24 <= time.monotonic() - begin <= 0.75
    assert response.json()["limit"] == "x-request-timeout-ms"
    assert "cancelled" in record.get(rid)
    unrun = uuid.uuid4().hex
    assert httpx.get(f"{url}/slow?id={unrun}", headers=ms("0")).status_code == 504
    assert record.get(unrun) == {}
    assert [e.outcome for e in events.wait_finished(2)] == ["deadline", "budget_exhausted"]


def test_deadline_after_response_started_closes(url: str, record: Record) -> None:
    """A deadline after the response started closes the connection mid-body."""
    rid = uuid.uuid4().hex
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.get(f"{url}/stall?id={rid}", headers=ms("300"), timeout=5)
    assert record.wait(rid, "cancelled") - record.get(rid)["started"] < 0.3 + 0.5


def test_deadline_after_a_whole_response_cuts_only_cleanup(
    url: str, record: Record, events: Events, caplog: pytest.LogCaptureFixture
) -> None:
    """The handler wrote its whole response, then went on working: the deadline cuts that
    work, the caller has its answer, the outcome is "ok" and aiohttp logs no error. A
    deadline error of the handler's own there is an error like any other."""
    rid = uuid.uuid4().hex
    response = httpx.get(f"{url}/finish?id={rid}", headers=ms("300"), timeout=5)
    assert (response.status_code, response.text) == (200, "whole")
    assert record.wait(rid, "cancelled") - record.get(rid)["started"] < 0.3 + 0.5
    own = httpx.get(f"{url}/finish-own", headers=ms("900"), timeout=5)
    assert (own.status_code, own.text) == (200, "whole")
    assert [e.outcome for e in events.wait_finished(2)] == ["ok", "error"]
    errors = [r for r in caplog.records if r.levelname == "ERROR" and r.name.startswith("aiohttp")]
    # One: the handler's own error (aiohttp logs a TimeoutError without its traceback).
    assert len(errors) == 1


def test_caller_left_cancels_handler(url: str, record: Record, events: Events) -> None:
    """A client that disconnects gets its handler cancelled with CallerLeft, promptly."""
    rid = uuid.uuid4().hex
    port = httpx.URL(url).port
    assert port is not None
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(f"GET /slow?id={rid} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    time.sleep(0.2)
    closed = time.monotonic()
    sock.close()
    cancelled = record.wait(rid, "cancelled")
    assert 0 <= cancelled - closed < 0.15
    assert isinstance(record.get(rid)["reason"], deadlines.CallerLeft)
    assert events.wait_finished(1)[0].outcome == "caller_left"


def test_body_and_keep_alive(url: str) -> None:
    """Bodies arrive intact and one connection serves requests around a 504."""
    payload = os.urandom(2 * 1024 * 1024)
    with httpx.Client(timeout=5) as client:
        echoed = client.post(f"{url}/echo", content=payload).json()
        assert echoed["sha"] == hashlib.sha256(payload).hexdigest()
        assert client.get(f"{url}/info", headers=ms("0")).status_code == 504
        assert client.get(f"{url}/info").status_code == 200


def test_handler_cancellation_server_option(record: Record, events: Events) -> None:
    """With aiohttp's own handler_cancellation=True the outcome is still caller_left."""
    with serve_aiohttp(build(record), handler_cancellation=True) as base:
        port = httpx.URL(base).port
        assert port is not None
        rid = uuid.uuid4().hex
        sock = socket.create_connection(("127.0.0.1", port))
        sock.sendall(f"GET /slow?id={rid} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        time.sleep(0.2)
        sock.close()
        record.wait(rid, "cancelled")
        assert events.wait_finished(1)[0].outcome == "caller_left"


def test_options_validated() -> None:
    """Bad options fail at construction."""
    with pytest.raises(ValueError, match="watch_every"):
        DeadlineMiddleware(default=1, maximum=2, watch_every=0)
    with pytest.raises(ValueError, match="default"):
        DeadlineMiddleware(default=3, maximum=2)


@pytest.mark.anyio
async def test_scope_unaffected_outside_requests() -> None:
    """Outside a request there is no deadline (the middleware leaks nothing)."""
    await asyncio.sleep(0)
    assert deadlines.current() is None


def test_http_exceptions_are_answers(url: str, events: Events) -> None:
    """A redirect or a 404 raised as aiohttp's HTTPException ends "ok"; a 503, raised or
    returned, "error"."""
    assert httpx.get(f"{url}/moved", timeout=5).status_code == 302
    assert httpx.get(f"{url}/nowhere", timeout=5).status_code == 404
    assert httpx.get(f"{url}/broken", timeout=5).status_code == 503
    assert httpx.get(f"{url}/busy", timeout=5).status_code == 503  # returned, not raised
    outcomes = [(e.route, e.outcome) for e in events.wait_finished(4)]
    assert outcomes == [("/moved", "ok"), ("*", "ok"), ("/broken", "error"), ("/busy", "error")]


def test_websocket_outlives_the_request_budget(url: str) -> None:
    """A WebSocket session is not a request under a deadline: it passes through and lives
    past the route's 1 s default."""

    async def chat() -> list[str]:
        async with aiohttp.ClientSession() as session, session.ws_connect(f"{url}/chat") as ws:
            await ws.send_str("first")
            answers = [await ws.receive_str(timeout=5)]
            await asyncio.sleep(1.3)
            await ws.send_str("later")
            answers.append(await ws.receive_str(timeout=5))
            return answers

    assert asyncio.run(chat()) == ["first:True", "later:True"]


def test_head_takes_the_get_routes_limits(events: Events) -> None:
    """aiohttp answers HEAD with the GET handler: a "GET /path" route's limits apply."""

    async def report(request: web.Request) -> web.Response:
        return web.Response(headers={"x-remaining": f"{deadlines.remaining():.3f}"})

    routes = {"GET /report": Limits(default=3.0, maximum=5.0)}
    app = web.Application(middlewares=[DeadlineMiddleware(default=0.2, maximum=1.0, routes=routes)])
    app.router.add_get("/report", report)
    with serve_aiohttp(app) as base, httpx.Client(timeout=5) as client:
        for method in ("GET", "HEAD"):
            answer = client.request(method, f"{base}/report")
            assert answer.status_code == 200
            assert 2.5 < float(answer.headers["x-remaining"]) <= 2.95


def test_caller_leaving_mid_upload_is_caller_left(
    record: Record, events: Events, caplog: pytest.LogCaptureFixture
) -> None:
    """The caller hangs up in the middle of its request body: aiohttp fails the handler's
    read at once, before the connection watch comes round. That is the caller leaving,
    not an error, and nothing is logged as one."""

    async def upload(request: web.Request) -> web.Response:
        try:
            body = await request.read()
        except (ConnectionError, asyncio.CancelledError) as exc:
            # Mostly the read fails; now and then the connection watch comes round first.
            record.put(request.query["id"], read=type(exc).__name__)
            raise
        return web.Response(text=str(len(body)))

    app = web.Application(middlewares=[DeadlineMiddleware(default=2.0, maximum=5.0)])
    app.router.add_post("/upload", upload)
    heads = {
        "length": b"Content-Length: 100000\r\n\r\n" + b"a" * 1000,
        "chunked": b"Transfer-Encoding: chunked\r\n\r\n3e8\r\n" + b"a" * 1000 + b"\r\n",
    }
    with serve_aiohttp(app) as base:
        port = httpx.URL(base).port
        assert port is not None
        for key, head in heads.items():
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(f"POST /upload?id={key} HTTP/1.1\r\nHost: x\r\n".encode() + head)
                time.sleep(0.1)
            assert record.wait(key, "read") in ("ConnectionResetError", "CancelledError")
        outcomes = [e.outcome for e in events.wait_finished(2)]
    assert outcomes == ["caller_left", "caller_left"]
    assert [r for r in caplog.records if r.levelname == "ERROR"] == []


def test_upgrade_header_alone_does_not_skip_the_deadline(url: str, record: Record) -> None:
    """Only a whole WebSocket handshake passes through: a plain request that merely says
    ``Upgrade: websocket`` still gets its deadline and its 504."""
    rid = uuid.uuid4().hex
    headers = {"upgrade": "websocket", "connection": "upgrade", **ms("300")}
    response = httpx.get(f"{url}/slow?id={rid}", headers=headers, timeout=5)
    assert response.status_code == 504
    assert record.wait(rid, "cancelled") - record.get(rid)["started"] < 0.3 + 0.5


def test_websocket_subprotocols_raise_no_warnings(caplog: pytest.LogCaptureFixture) -> None:
    """A handshake offering a subprotocol the handler accepts passes through with no
    warning logged (a probe of the handshake must not speak for the handler)."""

    async def graphql(request: web.Request) -> web.WebSocketResponse:
        socket = web.WebSocketResponse(protocols=("graphql-transport-ws",))
        await socket.prepare(request)
        await socket.send_str(f"hello {socket.ws_protocol}")
        await socket.close()
        return socket

    app = web.Application(middlewares=[DeadlineMiddleware(default=1.0, maximum=2.0)])
    app.router.add_get("/graphql", graphql)

    async def connect(base: str) -> str:
        async with aiohttp.ClientSession() as session:
            protocols = ("graphql-transport-ws",)
            async with session.ws_connect(f"{base}/graphql", protocols=protocols) as ws:
                return await ws.receive_str(timeout=5)

    with serve_aiohttp(app) as base:
        assert asyncio.run(connect(base)) == "hello graphql-transport-ws"
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == []
