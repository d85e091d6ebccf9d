"""The aiohttp.web DeadlineMiddleware on a real server: streamed bodies, the keep-alive
after a cut, WebSocket handshakes, ``Expect: 100-continue`` and class-based views."""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator

import aiohttp
import httpx
import pytest
from aiohttp import web

import deadlines
from deadlines.aiohttp_web import DeadlineMiddleware, limits

from .apps import Record
from .conftest import Events, read_response, serve_aiohttp
from .test_aiohttp_web import websocket_echo

pytestmark = pytest.mark.realtime

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

HANDSHAKE = (
    "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
)


class Report(web.View):
    """A class-based view whose GET is marked."""

    @limits(default=5.0, maximum=6.0)
    async def get(self) -> web.Response:
        return web.Response(text=f"{deadlines.remaining():.3f}")


@limits(default=3.0, maximum=4.0)
class Marked(web.View):
    """A class-based view marked on the class, and with its own mark on POST."""

    async def get(self) -> web.Response:
        return web.Response(text=f"{deadlines.remaining():.3f}")

    @limits(default=5.0, maximum=6.0)
    async def post(self) -> web.Response:
        return web.Response(text=f"{deadlines.remaining():.3f}")


def build(record: Record, deadline: DeadlineMiddleware) -> web.Application:
    """An app whose handlers stream, stall, upgrade and take uploads."""

    async def export(request: web.Request) -> web.Response:
        key = request.query["id"]

        async def body() -> AsyncIterator[bytes]:
            for i in range(8):
                await asyncio.sleep(0.15)  # the next page from an upstream
                record.put(key, **{f"chunk{i}": deadlines.current() is not None})
                yield b"chunk%d;" % i

        return web.Response(body=body())

    async def feed(request: web.Request) -> web.Response:
        key = request.query["id"]

        async def body() -> AsyncIterator[bytes]:
            yield b"first;"
            try:
                await asyncio.sleep(10)  # waiting on an upstream for the next event
            except asyncio.CancelledError:
                record.put(key, cancelled=time.monotonic())
                raise
            yield b"never"

        return web.Response(body=body())

    async def short(request: web.Request) -> web.Response:
        async def body() -> AsyncIterator[bytes]:
            yield b"a;"
            yield b"b;"

        return web.Response(body=body())

    async def finish(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        response.content_length = 5
        await response.prepare(request)
        await response.write_eof(b"whole")
        await asyncio.sleep(10)  # cleanup, cut by the deadline
        return response

    async def ping(request: web.Request) -> web.Response:
        return web.Response(text="pong")

    async def slow(request: web.Request) -> web.Response:
        record.put(request.query["id"], deadline=deadlines.current())
        await asyncio.sleep(3)
        return web.Response(text="full report")

    async def late(request: web.Request) -> web.Response:
        async def body() -> AsyncIterator[bytes]:
            await asyncio.sleep(10)  # the first page never comes in time
            yield b"never"

        return web.Response(body=body())

    async def missing(request: web.Request) -> web.Response:
        async def body() -> AsyncIterator[bytes]:
            raise web.HTTPNotFound()  # aiohttp answers it as a response
            yield b"never"

        return web.Response(body=body())

    async def old_http(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()  # HTTP/1.0, no length: the close ends the body
        await response.prepare(request)
        await response.write_eof(b"whole")
        await asyncio.sleep(10)
        return response

    async def session_in_a_task(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await asyncio.create_task(ws.prepare(request))  # prepared in a child task
        async for message in ws:
            await asyncio.sleep(0.6)  # past the request's budget
            await ws.send_str(f"{message.data}:{deadlines.remaining()}")
        return ws

    async def session_with_a_helper(request: web.Request) -> web.WebSocketResponse:
        async def helper() -> float:
            await asyncio.sleep(0.6)  # past the request's budget
            return deadlines.remaining()

        started = asyncio.create_task(helper())  # under the request's deadline
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_str(f"{await started}:{deadlines.remaining()}")
        await ws.close()
        return ws

    @web.middleware
    async def in_a_task(request: web.Request, handler: Handler) -> web.StreamResponse:
        """An outer middleware running the rest in a task of its own (wait_for does)."""
        if request.path != "/wrapped":
            return await handler(request)
        return await asyncio.create_task(handler(request))

    app = web.Application(middlewares=[in_a_task, deadline])
    app.router.add_get("/wrapped", export)
    app.router.add_get("/late", late)
    app.router.add_get("/missing", missing)
    app.router.add_get("/old", old_http)
    app.router.add_get("/session", session_in_a_task)
    app.router.add_get("/helper", session_with_a_helper)
    app.router.add_get("/export", export)
    app.router.add_get("/feed", feed)
    app.router.add_get("/short", short)
    app.router.add_get("/finish", finish)
    app.router.add_get("/ping", ping)
    app.router.add_get("/slow", slow)
    app.router.add_get("/chat", websocket_echo)
    app.router.add_view("/report", Report)
    app.router.add_route("*", "/marked", Marked)
    return app


@pytest.fixture(scope="module")
def port(record: Record) -> Iterator[int]:
    """The aiohttp server's port (route default 0.5 s, maximum 0.5 s)."""
    deadline = DeadlineMiddleware(default=0.5, maximum=0.5)
    with serve_aiohttp(build(record, deadline)) as base:
        found = httpx.URL(base).port
        assert found is not None
        yield found


def test_streamed_body_runs_under_the_deadline_and_is_cut(
    port: int, record: Record, events: Events
) -> None:
    """An async generator body sees the request's deadline and is cut at it: the
    connection closes mid-body and the request ends "deadline"; a short one ends "ok"."""
    rid = uuid.uuid4().hex
    begin = time.monotonic()
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.get(f"http://127.0.0.1:{port}/export?id={rid}", timeout=5).read()
    assert time.monotonic() - begin < 0.45 + 0.5  # all eight chunks take 1.2 s
    seen = record.get(rid)
    assert seen and all(seen.values())  # every chunk made saw the deadline
    assert "chunk7" not in seen
    assert httpx.get(f"http://127.0.0.1:{port}/short", timeout=5).text == "a;b;"
    assert [(e.route, e.outcome) for e in events.wait_finished(2)] == [
        ("/export", "deadline"),
        ("/short", "ok"),
    ]


def test_streamed_body_stops_when_the_caller_leaves(record: Record, events: Events) -> None:
    """A caller that hangs up while the body waits for its next chunk has that wait
    cancelled within tens of ms; the request ends "caller_left"."""
    deadline = DeadlineMiddleware(default=10.0, maximum=10.0)
    with serve_aiohttp(build(record, deadline)) as base:
        found = httpx.URL(base).port
        assert found is not None
        rid = uuid.uuid4().hex
        sock = socket.create_connection(("127.0.0.1", found), timeout=5)
        sock.sendall(f"GET /feed?id={rid} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert b"first;" in sock.recv(65536)
        time.sleep(0.1)
        closed = time.monotonic()
        sock.close()
        assert record.wait(rid, "cancelled") - closed < 0.3
        assert [e.outcome for e in events.wait_finished(1)] == ["caller_left"]


def test_connection_kept_after_a_cut_following_a_whole_response(port: int) -> None:
    """The deadline cuts the handler's work after its whole response: the keep-alive
    connection serves the caller's next request, as it would without the middleware."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /finish HTTP/1.1\r\nHost: x\r\n\r\n")
        first = read_response(sock)
        assert first.startswith(b"HTTP/1.1 200") and first.endswith(b"whole")
        time.sleep(0.45 + 0.3)  # past the cut
        sock.sendall(b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_response(sock).endswith(b"pong")


def test_handshake_headers_do_not_lift_the_deadline(
    port: int, record: Record, events: Events
) -> None:
    """WebSocket handshake headers on a plain HTTP route change nothing: the handler
    runs under the route's maximum and is answered 504 at it."""
    rid = uuid.uuid4().hex
    request = (
        f"GET /slow?id={rid} HTTP/1.1\r\nHost: x\r\nx-request-timeout-ms: 100000\r\n{HANDSHAKE}\r\n"
    )
    begin = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(request.encode())
        answer = read_response(sock)
    assert answer.startswith(b"HTTP/1.1 504")
    assert time.monotonic() - begin < 0.45 + 0.75
    assert record.get(rid)["deadline"] is not None
    assert [e.outcome for e in events.wait_finished(1)] == ["deadline"]


def test_websocket_upgrade_lifts_the_deadline_and_is_reported(port: int, events: Events) -> None:
    """A real WebSocket still outlives the budget and sees no deadline once upgraded;
    its handshake is reported "ok" at the upgrade."""

    async def chat() -> list[str]:
        url = f"http://127.0.0.1:{port}/chat"
        async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
            await ws.send_str("first")
            answers = [await ws.receive_str(timeout=5)]
            await asyncio.sleep(0.8)  # past the 0.5 s maximum
            await ws.send_str("later")
            answers.append(await ws.receive_str(timeout=5))
            return answers

    assert asyncio.run(chat()) == ["first:True", "later:True"]
    (finished,) = events.wait_finished(1)
    assert (finished.route, finished.outcome) == ("/chat", "ok")
    assert finished.duration < 0.5


def test_expect_handler_refuses_expired_uploads(events: Events) -> None:
    """With the middleware's expect_handler on the route, an expired upload gets its 504
    and no "100 Continue"; a live one gets "100 Continue" and is handled."""

    async def upload(request: web.Request) -> web.Response:
        return web.Response(text=str(len(await request.read())))

    deadline = DeadlineMiddleware(default=2.0, maximum=10.0)
    app = web.Application(middlewares=[deadline])
    app.router.add_post("/upload", upload, expect_handler=deadline.expect_handler)
    head = "POST /upload HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
    with serve_aiohttp(app) as base:
        port = httpx.URL(base).port
        assert port is not None
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(
                f"{head}x-request-timeout-ms: 0\r\nContent-Length: 33554432\r\n\r\n".encode()
            )
            answer = read_response(sock)
        assert answer.startswith(b"HTTP/1.1 504"), answer[:40]
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(f"{head}Content-Length: 5\r\n\r\n".encode())
            assert sock.recv(25) == b"HTTP/1.1 100 Continue\r\n\r\n"
            sock.sendall(b"hello")
            assert read_response(sock).endswith(b"\r\n\r\n5")
        outcomes = [(e.route, e.outcome) for e in events.wait_finished(2)]
    assert outcomes == [("/upload", "budget_exhausted"), ("/upload", "ok")]


def test_class_based_view_method_marks(port: int) -> None:
    """@limits on a web.View method sets that method's limits, over the class's mark."""
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(timeout=5) as client:
        assert 4.5 < float(client.get(f"{base}/report").text) <= 4.95
        assert 2.5 < float(client.get(f"{base}/marked").text) <= 2.95
        assert 4.5 < float(client.post(f"{base}/marked").text) <= 4.95


def test_streamed_body_is_cut_under_an_outer_middleware_task(port: int, events: Events) -> None:
    """An outer middleware that runs the handler in a task of its own: the body is
    still made, and cut, under the deadline, and reported when it ends."""
    begin = time.monotonic()
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{port}/wrapped?id={uuid.uuid4().hex}", timeout=5)
    assert time.monotonic() - begin < 0.45 + 0.5  # all eight chunks take 1.2 s
    (finished,) = events.wait_finished(1)
    assert (finished.outcome, finished.duration > 0.4) == ("deadline", True)


def test_deadline_before_the_first_chunk_closes_the_connection(port: int) -> None:
    """Nothing of the streamed response is out yet, but the connection's writer is set
    for it (chunked): no other answer may go through it, so the connection closes, and
    never carries a misframed answer that the caller's next request would be read after."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /late HTTP/1.1\r\nHost: x\r\n\r\nGET /ping HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = read_until_closed(sock)
    assert b"pong" not in answer, answer  # the pipelined request was not served on it
    assert httpx.get(f"http://127.0.0.1:{port}/ping", timeout=5).text == "pong"


def test_connection_closed_after_a_cut_when_the_body_ended_with_it(port: int) -> None:
    """HTTP/1.0 without a length: the body ends when the connection closes, so after a
    cut that followed the whole response the connection is closed, not kept."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /old HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\n")
        answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.0 200") and answer.endswith(b"whole")


def test_websocket_prepared_in_a_child_task_has_no_deadline(port: int) -> None:
    """The deadline is lifted for the session even when the handler prepares the socket
    in a child task (another context): no time is left is never what it sees."""

    async def chat() -> str:
        url = f"http://127.0.0.1:{port}/session"
        async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
            await ws.send_str("hello")
            return str(await asyncio.wait_for(ws.receive_str(), 5))

    assert asyncio.run(chat()) == "hello:inf"


def test_websocket_leaves_the_deadline_only_in_its_handlers_context(port: int) -> None:
    """The session leaves the request's deadline; a task the handler started before it
    keeps that deadline (a deadline only ever shrinks)."""

    async def chat() -> str:
        url = f"http://127.0.0.1:{port}/helper"
        async with aiohttp.ClientSession() as session, session.ws_connect(url) as ws:
            return str(await asyncio.wait_for(ws.receive_str(), 5))

    assert asyncio.run(chat()) == "0.0:inf"


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (5 s at most)."""
    data = b""
    end = time.monotonic() + 5.0
    while time.monotonic() < end:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    raise AssertionError(f"the connection stayed open: {data[:80]!r}")


def test_an_error_answered_before_the_first_chunk_leaves_no_misframed_connection(
    port: int,
) -> None:
    """The body raises an `HTTPException` before its first chunk: aiohttp would answer it
    through the writer set for the streamed response, and keep the connection, so the
    caller's next request was read after a misframed answer. The connection closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(
            b"GET /missing HTTP/1.1\r\nHost: x\r\n\r\nGET /ping HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        answer = read_until_closed(sock)
    assert b"pong" not in answer, answer
