"""DeadlineMiddleware under trio: hypercorn's trio worker on loopback, caller-left included."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from typing import Any
from urllib.parse import parse_qsl

import anyio
import httpx
import pytest
import trio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

import deadlines
from deadlines.asgi import DeadlineMiddleware

from .apps import Record
from .conftest import Events

pytestmark = pytest.mark.realtime

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


# The app: plain ASGI, trio-only awaits, reporting what it saw in a shared Record.


async def _sleep_recorded(record: Record, key: str, seconds: float) -> None:
    """trio.sleep, recording when it started and when it was cancelled."""
    record.put(key, started=time.monotonic(), deadline=deadlines.current())
    try:
        await trio.sleep(seconds)
    except trio.Cancelled:
        record.put(key, cancelled=time.monotonic())
        raise
    record.put(key, finished=time.monotonic())


async def _json(send: Send, status: int, value: Any) -> None:
    body = json.dumps(value).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


def trio_app(record: Record) -> Callable[..., Any]:
    """An ASGI app whose handlers use trio directly (no asyncio anywhere)."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":  # passed through untouched by the middleware
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        query = dict(parse_qsl(scope["query_string"].decode()))
        rid = query.get("id", "")
        path = scope["path"]
        if path == "/info":
            current = deadlines.current()
            await _json(send, 200, {"remaining": deadlines.remaining() if current else None})
        elif path == "/sleep":
            await _sleep_recorded(record, rid, 10.0)
            await _json(send, 200, {"done": True})
        elif path == "/upload":
            # A slow reader: `pieces` body messages, each recorded, then work ("work")
            # or a wait for more body that never comes ("wait").
            body = b""
            for _ in range(int(query["pieces"])):
                message = await receive()
                body += message.get("body", b"")
                record.put(rid, body=body)
                await trio.sleep(0.02)
            if query["mode"] == "wait":
                message = await receive()
                record.put(rid, then=message["type"])
            await _sleep_recorded(record, rid, 10.0)  # work on, ignoring a disconnect
            await _json(send, 200, {"length": len(body)})
        elif path == "/echo":
            await trio.sleep(float(query.get("delay", "0")))
            chunks: list[bytes] = []
            more = True
            while more:
                message = await receive()
                assert message["type"] == "http.request", message
                chunks.append(message.get("body", b""))
                more = message.get("more_body", False)
            body = b"".join(chunks)
            await _json(send, 200, {"length": len(body), "sha": hashlib.sha256(body).hexdigest()})
        elif path == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            for i in range(5):
                await trio.sleep(0.02)
                await send(
                    {"type": "http.response.body", "body": b"chunk%d;" % i, "more_body": True}
                )
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        elif path == "/stall":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"first;", "more_body": True})
            await _sleep_recorded(record, rid, 10.0)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        else:
            await _json(send, 404, {"error": "not found"})

    return app


class Escaped:
    """An outer ASGI layer that records anything the middleware raised to the server."""

    def __init__(self, app: Callable[..., Any]) -> None:
        self.app = app
        self.errors: list[BaseException] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        except BaseException as exc:
            self.errors.append(exc)
            raise


@contextlib.contextmanager
def serve_hypercorn_trio(app: Callable[..., Any]) -> Iterator[str]:
    """Serve an ASGI app with hypercorn's trio worker in a thread; yields its base URL."""
    from hypercorn.config import Config
    from hypercorn.trio import serve

    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 1.0
    ready = threading.Event()
    state: dict[str, Any] = {}

    async def main() -> None:
        stop = trio.Event()
        state["token"] = trio.lowlevel.current_trio_token()
        state["stop"] = stop
        async with trio.open_nursery() as nursery:
            start = functools.partial(serve, app, config, shutdown_trigger=stop.wait, mode="asgi")
            binds = await nursery.start(start)
            state["url"] = binds[0]
            ready.set()

    def run() -> None:
        try:
            trio.run(main)
        except BaseException as exc:
            state["error"] = exc
        finally:
            ready.set()

    thread = threading.Thread(target=run, daemon=True, name="hypercorn-trio")
    thread.start()
    try:
        assert ready.wait(10), "hypercorn (trio) did not start"
        assert "error" not in state, state.get("error")
        yield state["url"]
    finally:
        if "stop" in state:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(state["stop"].set, trio_token=state["token"])
        thread.join(10)
        assert not thread.is_alive(), "hypercorn (trio) did not stop"
        assert "error" not in state, state.get("error")


@pytest.fixture(scope="module")
def lazy(record: Record) -> Iterator[tuple[str, Escaped]]:
    """The app behind DeadlineMiddleware with its defaults, on hypercorn's trio worker."""
    app = Escaped(DeadlineMiddleware(trio_app(record), default=1.0, maximum=2.0))
    with serve_hypercorn_trio(app) as url:
        yield url, app
    assert app.errors == []  # nothing was raised to the server


@pytest.fixture(scope="module")
def eager(record: Record) -> Iterator[tuple[str, Escaped]]:
    """The same with the watcher from the start and a small read-ahead."""
    middleware = DeadlineMiddleware(
        trio_app(record), default=1.0, maximum=2.0, watch_after=0.0, read_ahead=64 * 1024
    )
    app = Escaped(middleware)
    with serve_hypercorn_trio(app) as url:
        yield url, app
    assert app.errors == []


@pytest.fixture(params=["lazy", "eager"])
def server(request: pytest.FixtureRequest) -> tuple[str, Escaped]:
    """Each of the two servers in turn."""
    found: tuple[str, Escaped] = request.getfixturevalue(request.param)
    return found


def key() -> str:
    """A fresh request id for the shared record."""
    return uuid.uuid4().hex


def port_of(url: str) -> int:
    """The port of a loopback base URL."""
    port = httpx.URL(url).port
    assert port is not None
    return port


def until(predicate: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    """Block until `predicate()` holds."""
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, f"{what} did not happen within {timeout} s"
        time.sleep(0.002)


def _has_read(record: Record, rid: str, body: bytes) -> bool:
    return record.get(rid).get("body") == body


def hang_up_after(url: str, path: str, seconds: float) -> float:
    """GET `path` over a raw socket and close it after `seconds`; returns the close time."""
    head = f"GET {path} HTTP/1.1\r\nHost: x\r\nx-request-timeout-ms: 9000\r\n\r\n"
    sock = socket.create_connection(("127.0.0.1", port_of(url)))
    sock.sendall(head.encode())
    time.sleep(seconds)
    closed = time.monotonic()
    sock.close()
    return closed


def test_handler_sees_deadline(server: tuple[str, Escaped]) -> None:
    """Under trio the handler sees the header's budget, or the default, via deadlines.current()."""
    url, _ = server
    with httpx.Client(timeout=5) as client:  # one keep-alive connection, several requests
        headers = {"x-request-timeout-ms": "800"}
        assert 0.5 < client.get(f"{url}/info", headers=headers).json()["remaining"] <= 0.75
        assert 0.8 < client.get(f"{url}/info").json()["remaining"] <= 0.95
        capped = client.get(f"{url}/info", headers={"x-request-timeout-ms": "60000"})
        assert 1.8 < capped.json()["remaining"] <= 1.95


def test_504_when_deadline_passes(
    server: tuple[str, Escaped], record: Record, events: Events
) -> None:
    """Past the deadline the trio handler is cancelled; the client gets a 504 naming the limit."""
    url, _ = server
    rid = key()
    begin = time.monotonic()
    response = httpx.get(f"{url}/sleep?id={rid}", headers={"x-request-timeout-ms": "300"})
    took = time.monotonic() - begin
    assert response.status_code == 504
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert (body["error"], body["limit"], body["budget_ms"]) == (
        "deadline exceeded",
        "x-request-timeout-ms",
        250,
    )
    assert 0.24 <= took <= 0.25 + 0.5
    assert record.wait(rid, "cancelled") - record.get(rid)["started"] < 0.25 + 0.3
    assert "finished" not in record.get(rid)
    finished = events.wait_finished(1)[0]
    assert (finished.route, finished.outcome) == ("*", "deadline")


def test_caller_left_cancels_sleeping_handler(
    server: tuple[str, Escaped], record: Record, events: Events
) -> None:
    """A client that closes its socket cancels a handler in trio.sleep within tens of ms."""
    url, app = server
    errors = len(app.errors)
    rid = key()
    closed = hang_up_after(url, f"/sleep?id={rid}", 0.2)
    cancelled = record.wait(rid, "cancelled")
    assert 0 <= cancelled - closed < 0.5
    assert record.get(rid)["deadline"] is not None
    assert "finished" not in record.get(rid)
    finished = events.wait_finished(1)[0]
    assert (finished.route, finished.outcome) == ("*", "caller_left")
    assert app.errors[errors:] == []  # nothing raised to the server


@pytest.mark.parametrize("mode", ["work", "wait"])
def test_caller_left_while_reading_body(
    server: tuple[str, Escaped], mode: str, record: Record, events: Events
) -> None:
    """A handler reading a streamed body slowly gets each piece intact, then is cancelled
    when the client hangs up mid-body: while it works ("work") or waits for more ("wait")."""
    url, app = server
    errors = len(app.errors)
    rid = key()
    pieces = [os.urandom(700), b"second piece;", os.urandom(5000)]
    head = (
        f"POST /upload?id={rid}&pieces={len(pieces)}&mode={mode} HTTP/1.1\r\nHost: x\r\n"
        f"x-request-timeout-ms: 9000\r\ncontent-length: 100000\r\n\r\n"
    )
    sent = b""
    with socket.create_connection(("127.0.0.1", port_of(url))) as sock:
        sock.sendall(head.encode())
        for piece in pieces:
            time.sleep(0.05)  # the app reads while the watcher runs
            sock.sendall(piece)
            sent += piece
            until(functools.partial(_has_read, record, rid, sent), "the app reading the piece")
        time.sleep(0.2)  # the app works, or waits for body that never comes
        closed = time.monotonic()
    cancelled = record.wait(rid, "cancelled")
    assert 0 <= cancelled - closed < 0.5
    assert record.get(rid)["body"] == sent
    if mode == "wait":  # the app's own receive() was answered: the caller left
        assert record.get(rid)["then"] == "http.disconnect"
    finished = events.wait_finished(1)[0]
    assert finished.outcome == "caller_left"
    assert app.errors[errors:] == []


def test_caller_left_mid_response(
    server: tuple[str, Escaped], record: Record, events: Events
) -> None:
    """A client that leaves after the response started (not complete) cancels the handler."""
    url, app = server
    errors = len(app.errors)
    rid = key()
    with socket.create_connection(("127.0.0.1", port_of(url)), timeout=5) as sock:
        sock.sendall(f"GET /stall?id={rid} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        record.wait(rid, "started")
        time.sleep(0.05)
        closed = time.monotonic()
    assert 0 <= record.wait(rid, "cancelled") - closed < 0.5
    assert events.wait_finished(1)[0].outcome == "caller_left"
    assert app.errors[errors:] == []


@pytest.mark.parametrize("size", [0, 1000, 3 * 1024 * 1024])
def test_app_reads_whole_body(server: tuple[str, Escaped], size: int) -> None:
    """The app reads the request body intact, larger than the read-ahead, read late or early."""
    url, _ = server
    payload = os.urandom(size)
    for delay in ("0", "0.05"):
        response = httpx.post(f"{url}/echo?delay={delay}", content=payload, timeout=10)
        assert response.status_code == 200
        assert response.json() == {"length": size, "sha": hashlib.sha256(payload).hexdigest()}


def test_streaming_response_and_expect_100_continue(server: tuple[str, Escaped]) -> None:
    """A streamed response arrives whole; a body sent after "100 Continue" is read."""
    url, _ = server
    assert httpx.get(f"{url}/stream", timeout=5).text == "chunk0;chunk1;chunk2;chunk3;chunk4;"
    body = b"y" * 5000
    head = (
        "POST /echo?delay=0.05 HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port_of(url)), timeout=5) as sock:
        sock.sendall(head)
        assert sock.recv(1024).startswith(b"HTTP/1.1 100")
        sock.sendall(body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200")
    assert b'"length": 5000' in data


def starlette_trio_app(record: Record) -> Starlette:
    """A Starlette app whose handlers wait with anyio (trio underneath), behind ours."""

    async def info(request: Request) -> JSONResponse:
        polls = 0
        for _ in range(5):  # Starlette polls receive() in a cancelled scope
            assert not await request.is_disconnected()
            polls += 1
        return JSONResponse({"remaining": deadlines.remaining(), "polls": polls})

    async def echo(request: Request) -> JSONResponse:
        await anyio.sleep(0.05)
        body = await request.body()
        return JSONResponse({"length": len(body), "sha": hashlib.sha256(body).hexdigest()})

    async def stream(request: Request) -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            for i in range(5):
                await anyio.sleep(0.02)
                yield b"chunk%d;" % i

        return StreamingResponse(chunks())  # listens for disconnect in a task group

    async def slow(request: Request) -> Response:
        await _sleep_recorded(record, request.query_params["id"], 10.0)
        return Response("done")

    routes = [Route("/info", info), Route("/echo", echo, methods=["POST"])]
    routes += [Route("/stream", stream), Route("/slow", slow)]
    ours = Middleware(DeadlineMiddleware, default=1.0, maximum=2.0)
    return Starlette(routes=routes, middleware=[ours])


def test_starlette_under_trio(record: Record, events: Events) -> None:
    """Starlette on hypercorn's trio worker: deadline, disconnect polls, bodies, streams,
    and a caller leaving cancels the handler."""
    with serve_hypercorn_trio(starlette_trio_app(record)) as url:
        info = httpx.get(f"{url}/info", headers={"x-request-timeout-ms": "800"}, timeout=5)
        assert info.json()["polls"] == 5
        assert 0.5 < info.json()["remaining"] <= 0.75
        payload = os.urandom(2 * 1024 * 1024)
        echoed = httpx.post(f"{url}/echo", content=payload, timeout=10).json()
        assert echoed == {"length": len(payload), "sha": hashlib.sha256(payload).hexdigest()}
        assert httpx.get(f"{url}/stream", timeout=5).text.endswith("chunk3;chunk4;")
        rid = key()
        closed = hang_up_after(url, f"/slow?id={rid}", 0.2)
        assert 0 <= record.wait(rid, "cancelled") - closed < 0.5
        finished = events.wait_finished(4)
        assert [(e.route, e.outcome) for e in finished] == [
            ("/info", "ok"),
            ("/echo", "ok"),
            ("/stream", "ok"),
            ("/slow", "caller_left"),
        ]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_watcher_waits_for_watch_after_and_for_the_app_with_expect() -> None:
    """Under trio the watcher reads ahead only after `watch_after`, and with Expect:
    100-continue only after the app asked for the body itself."""
    calls: list[float] = []

    async def receive() -> Message:
        calls.append(time.monotonic())
        if len(calls) == 1:
            return {"type": "http.request", "body": b"abc", "more_body": False}
        await trio.sleep(10)  # the client stays
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        return None

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await trio.sleep(float(scope["query_string"]))
        if scope["path"] == "/read":
            assert await receive() == {"type": "http.request", "body": b"abc", "more_body": False}
            await trio.sleep(0.1)
        await _json(send, 200, {})

    middleware = DeadlineMiddleware(app, default=2, maximum=2, watch_after=0.1)
    expect = [(b"expect", b"100-continue")]
    plain: dict[str, Any] = {"type": "http", "path": "/", "headers": []}

    begin = time.monotonic()
    await middleware({**plain, "query_string": b"0.02"}, receive, send)
    assert calls == []  # finished before watch_after: nobody read ahead
    await middleware({**plain, "query_string": b"0.3"}, receive, send)
    assert len(calls) == 2  # the watcher read the body, then waited for more
    assert calls[0] - begin >= 0.1 - 0.01
    calls.clear()
    begin = time.monotonic()
    await middleware(
        {**plain, "path": "/read", "headers": expect, "query_string": b"0.3"}, receive, send
    )
    assert len(calls) == 2
    assert calls[0] - begin >= 0.3 - 0.01  # the app's own read came first


@pytest.mark.parametrize("path", ["/thread", "/shielded"])
def test_a_deadline_passed_without_a_checkpoint_is_a_504_and_the_server_lives(
    path: str, events: Events
) -> None:
    """A handler that runs past its deadline without a trio checkpoint (a sync endpoint's
    thread, a shielded block) meets it first in its send: it gets the 504 (nothing was
    out yet), and hypercorn's trio worker keeps serving. The cancellation used to land
    inside hypercorn's own send, and its worker died answering 500 on a begun response."""

    def blocking() -> None:
        time.sleep(0.5)

    async def thread(request: Request) -> Response:
        await trio.to_thread.run_sync(blocking)  # the thread's wait is not cancellable
        return Response("late")

    async def shielded(request: Request) -> Response:
        with trio.CancelScope(shield=True):
            await trio.sleep(0.5)
        return Response("late")

    async def ok(request: Request) -> Response:
        return Response("ok")

    app = Starlette(
        routes=[Route("/thread", thread), Route("/shielded", shielded), Route("/ok", ok)],
        middleware=[Middleware(DeadlineMiddleware, default=0.25, maximum=1.0)],
    )
    with serve_hypercorn_trio(app) as url:
        late = httpx.get(f"{url}{path}", timeout=5)
        assert late.status_code == 504, late.text
        assert httpx.get(f"{url}/ok", timeout=5).text == "ok"
    finished = events.wait_finished(2)
    assert [(e.route, e.outcome) for e in finished] == [(path, "deadline"), ("/ok", "ok")]


def test_http2_answer_to_a_reader_granting_no_window_ends_at_the_deadline(
    events: Events,
) -> None:
    """Over HTTP/2 hypercorn's send of the first body message waits for the caller's
    flow-control window. A caller that grants none: the request still ends at its
    deadline (that send was once shielded, and the request hung for good)."""
    import h2.config
    import h2.connection
    import h2.settings

    async def big(request: Request) -> Response:
        return Response(b"x" * (1 << 20))

    app = Starlette(
        routes=[Route("/big", big)],
        middleware=[Middleware(DeadlineMiddleware, default=0.5, maximum=5.0)],
    )
    with serve_hypercorn_trio(app) as url:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        window = {h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 1024}
        conn.local_settings = h2.settings.Settings(client=True, initial_values=window)
        conn.initiate_connection()
        with socket.create_connection(("127.0.0.1", port_of(url)), timeout=0.1) as sock:
            sock.sendall(conn.data_to_send())
            head = [(":method", "GET"), (":path", "/big"), (":scheme", "http"), (":authority", "x")]
            conn.send_headers(1, head, end_stream=True)
            sock.sendall(conn.data_to_send())
            end = time.monotonic() + 3.0
            while not events.finished() and time.monotonic() < end:
                with contextlib.suppress(TimeoutError):  # read, never grant a window
                    data = sock.recv(65536)
                    conn.receive_data(data)
                    sock.sendall(conn.data_to_send())
            (finished,) = events.wait_finished(1, timeout=0.1)
    assert finished.route == "/big"
    assert finished.duration < 1.5
