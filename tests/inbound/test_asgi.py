"""DeadlineMiddleware on real uvicorn and hypercorn servers serving Starlette and FastAPI."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

import deadlines
from deadlines.asgi import DeadlineMiddleware, Limits

from .apps import Record, fastapi_app, starlette_app
from .conftest import (
    Events,
    raw_request,
    read_response,
    serve_hypercorn,
    serve_uvicorn,
    status_of,
)

pytestmark = pytest.mark.realtime


@pytest.fixture(scope="module")
def base(record: Record) -> Iterator[str]:
    """A Starlette app behind DeadlineMiddleware on uvicorn."""
    with serve_uvicorn(starlette_app(record)) as url:
        yield url


@pytest.fixture(scope="module")
def eager(record: Record) -> Iterator[str]:
    """The same app with the watcher from the start and a small read-ahead, on h11."""
    app = starlette_app(record, watch_after=0.0, read_ahead=64 * 1024)
    with serve_uvicorn(app, http="h11") as url:
        yield url


def key() -> str:
    """A fresh request id for the shared record."""
    return uuid.uuid4().hex


def get(url: str, ms: str | None = None, **kwargs: Any) -> httpx.Response:
    """GET with an optional x-request-timeout-ms header."""
    headers = {} if ms is None else {"x-request-timeout-ms": ms}
    return httpx.get(url, headers=headers, timeout=kwargs.pop("timeout", 10.0), **kwargs)


def hang_up_after(url: str, seconds: float, *, method: str = "GET", body: bytes = b"") -> float:
    """Send a request over a raw socket, close it after `seconds`; returns the close time."""
    parsed = httpx.URL(url)
    target = parsed.raw_path.decode()
    head = (
        f"{method} {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"x-request-timeout-ms: 9000\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    sock = socket.create_connection(("127.0.0.1", parsed.port or 80))
    sock.sendall(head.encode() + body)
    time.sleep(seconds)
    closed = time.monotonic()
    sock.close()
    return closed


def test_header_sets_deadline_seen_by_handler(base: str) -> None:
    """The handler sees the header's budget minus the reserve through deadlines.current()."""
    left = get(f"{base}/info", "800").json()["remaining"]
    assert 0.5 < left <= 0.75


def test_no_header_uses_default_and_header_is_capped(base: str) -> None:
    """No header gives the default; a huge header is capped at the maximum."""
    assert 0.8 < get(f"{base}/info").json()["remaining"] <= 0.95
    assert 1.8 < get(f"{base}/info", "600000").json()["remaining"] <= 1.95


def test_other_headers_understood(base: str) -> None:
    """grpc-timeout and Envoy's header set the budget too; the smallest wins."""
    headers = {"grpc-timeout": "700m", "x-envoy-expected-rq-timeout-ms": "500"}
    left = httpx.get(f"{base}/info", headers=headers, timeout=5).json()["remaining"]
    assert 0.3 < left <= 0.45


def test_sync_handler_sees_deadline(base: str) -> None:
    """A sync Starlette handler, run in the thread pool, sees the request's deadline."""
    left = get(f"{base}/sync", "900").json()["remaining"]
    assert 0.6 < left <= 0.85


def test_route_limits_from_decorator_map_and_template(base: str, events: Events) -> None:
    """@limits and the route map set per-route defaults and maxima; labels are templates."""
    assert 4.5 < get(f"{base}/report").json()["remaining"] <= 4.95
    assert 7.5 < get(f"{base}/report", "60000").json()["remaining"] <= 7.95
    assert 2.5 < get(f"{base}/bulk/run").json()["remaining"] <= 2.95
    get(f"{base}/items/42")
    get(f"{base}/admin/users/7")
    get(f"{base}/nowhere/at/all")
    routes = [e.route for e in events.wait_finished(6)]
    assert routes == [
        "/report",
        "/report",
        "/bulk/run",
        "/items/{item_id}",
        "/admin/users/{user_id}",
        "*",
    ]
    started = [e for e in events.items if isinstance(e, deadlines.RequestStarted)]
    assert started[0].budget == pytest.approx(4.95)


def test_504_when_deadline_passes(base: str, record: Record, events: Events) -> None:
    """Past the deadline the handler is cancelled and the client gets a 504 naming the limit."""
    rid = key()
    begin = time.monotonic()
    response = get(f"{base}/slow?id={rid}", "300")
    took = time.monotonic() - begin
    assert response.status_code == 504
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["error"] == "deadline exceeded"
    assert body["limit"] == "x-request-timeout-ms"
    assert body["budget_ms"] == 250
    assert 0.24 <= took <= 0.25 + 0.5
    cancelled = record.wait(rid, "cancelled")
    assert cancelled - record.get(rid)["started"] < 0.25 + 0.3
    assert "finished" not in record.get(rid)
    finished = events.wait_finished(1)[0]
    assert (finished.route, finished.outcome) == ("/slow", "deadline")


def test_504_names_route_default(base: str) -> None:
    """Without a header the 504 body says the route default was the limit."""
    response = get(f"{base}/slow?id={key()}", timeout=5)
    assert response.status_code == 504
    assert response.json()["limit"] == "route default"
    assert response.json()["budget_ms"] == 950


def test_expired_on_arrival_never_runs_handler(base: str, record: Record, events: Events) -> None:
    """A header of 0 is answered 504 at once, without running the handler."""
    rid = key()
    begin = time.monotonic()
    response = get(f"{base}/slow?id={rid}", "0")
    assert response.status_code == 504
    assert time.monotonic() - begin < 0.5
    assert response.json()["budget_ms"] == 0
    time.sleep(0.05)
    assert record.get(rid) == {}
    assert events.wait_finished(1)[0].outcome == "budget_exhausted"


def test_deadline_after_response_started_drops_connection(
    base: str, record: Record, events: Events
) -> None:
    """When the response has started, the deadline closes the connection mid-body."""
    rid = key()
    with pytest.raises(httpx.RemoteProtocolError):
        get(f"{base}/stall?id={rid}", "300")
    assert "cancelled" in record.get(rid)
    assert events.wait_finished(1)[0].outcome == "deadline"


def test_deadline_after_response_complete_cuts_background_work_only(
    base: str, record: Record, events: Events
) -> None:
    """Work left after a complete response is cut at the deadline; the exchange ends "ok".

    The client has its whole answer, and the connection serves the next request: the
    server was not handed an error for a response that went out in full.
    """
    rid = key()
    port = httpx.URL(base).port
    head = "GET {} HTTP/1.1\r\nHost: 127.0.0.1\r\nx-request-timeout-ms: 300\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=5.0) as sock:
        sent = time.monotonic()
        sock.sendall(head.format(f"/after?id={rid}").encode())
        first = read_response(sock)
        assert first.startswith(b"HTTP/1.1 200") and first.endswith(b"done")
        cancelled = record.wait(rid, "cancelled")
        assert 0.2 <= cancelled - sent < 1.5  # the 250 ms budget, not the 10 s sleep
        assert events.wait_finished(1)[0].outcome == "ok"
        sock.sendall(head.format("/info").encode())  # the same connection, kept alive
        assert read_response(sock).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("server", ["base", "eager"])
def test_caller_left_cancels_handler(
    server: str, request: pytest.FixtureRequest, record: Record, events: Events
) -> None:
    """When the client disconnects, the handler is cancelled at once with CallerLeft."""
    url: str = request.getfixturevalue(server)
    rid = key()
    closed = hang_up_after(f"{url}/slow?id={rid}", 0.2)
    cancelled = record.wait(rid, "cancelled")
    assert 0 <= cancelled - closed < 0.15
    assert isinstance(record.get(rid)["reason"], deadlines.CallerLeft)
    finished = events.wait_finished(1)[0]
    assert (finished.route, finished.outcome) == ("/slow", "caller_left")


@pytest.mark.parametrize("server", ["base", "eager"])
def test_caller_left_while_body_unread(
    server: str, request: pytest.FixtureRequest, record: Record
) -> None:
    """A POST whose body the handler never reads is still cancelled when the caller leaves."""
    url: str = request.getfixturevalue(server)
    rid = key()
    closed = hang_up_after(f"{url}/unread?id={rid}", 0.2, method="POST", body=b"x" * 10_000)
    assert 0 <= record.wait(rid, "cancelled") - closed < 0.15


@pytest.mark.parametrize("server", ["base", "eager"])
@pytest.mark.parametrize("size", [0, 1000, 3 * 1024 * 1024])
def test_app_reads_whole_body(server: str, size: int, request: pytest.FixtureRequest) -> None:
    """The app reads the request body intact, larger than the read-ahead, read late or early."""
    url: str = request.getfixturevalue(server)
    payload = os.urandom(size)
    for delay in ("0", "0.05"):
        response = httpx.post(f"{url}/echo?delay={delay}", content=payload, timeout=10)
        assert response.status_code == 200
        assert response.json() == {
            "length": size,
            "sha": hashlib.sha256(payload).hexdigest(),
        }


@pytest.mark.parametrize("server", ["base", "eager"])
def test_streaming_response_passes(server: str, request: pytest.FixtureRequest) -> None:
    """A streaming response arrives whole, chunk by chunk."""
    url: str = request.getfixturevalue(server)
    response = get(f"{url}/stream", "2000")
    assert response.text == "chunk0;chunk1;chunk2;chunk3;chunk4;"


@pytest.mark.parametrize("server", ["base", "eager"])
def test_is_disconnected_polling_works(server: str, request: pytest.FixtureRequest) -> None:
    """Starlette's request.is_disconnected() answers False while the client waits."""
    url: str = request.getfixturevalue(server)
    assert get(f"{url}/poll", "3000").json() == {"polls": 20}


def test_expect_100_continue(eager: str) -> None:
    """A request with Expect: 100-continue still gets its body read and answered."""
    body = b"y" * 5000
    head = (
        "POST /echo HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode()
    port = httpx.URL(eager).port
    assert port is not None
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(head)
        first = sock.recv(1024)
        assert first.startswith(b"HTTP/1.1 100")
        sock.sendall(body)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    assert b'"length":5000' in data


@pytest.mark.parametrize("order", ["outer", "inner"])
def test_with_base_http_middleware(order: str, record: Record, events: Events) -> None:
    """Next to a BaseHTTPMiddleware (either side) the deadline, 504 and caller-left all work."""
    with serve_uvicorn(starlette_app(record, base_http=order)) as url:
        info = get(f"{url}/info", "800")
        assert info.headers["x-base-http"] == "1"
        assert 0.5 < info.json()["remaining"] <= 0.75
        if order == "outer":
            assert info.json()["seen_by_base"] is None  # it runs before the deadline is set
        else:
            assert 0.5 < info.json()["seen_by_base"] <= 0.75
        assert get(f"{url}/slow?id={key()}", "200").status_code == 504
        rid = key()
        closed = hang_up_after(f"{url}/slow?id={rid}", 0.2)
        assert 0 <= record.wait(rid, "cancelled") - closed < 0.15
        if order == "outer":  # the handler runs in our task: it sees the reason
            assert isinstance(record.get(rid)["reason"], deadlines.CallerLeft)
        outcomes = [e.outcome for e in events.wait_finished(3)]
        assert outcomes == ["ok", "deadline", "caller_left"]


def test_fastapi_dependency_and_http_middleware(record: Record, events: Events) -> None:
    """FastAPI: the dependency's limits apply; handlers see the deadline; 504, caller-left work."""
    with serve_uvicorn(fastapi_app(record)) as url:
        info = get(f"{url}/info", "700")
        assert info.headers["x-tagged"] == "True"
        assert 0.4 < info.json()["remaining"] <= 0.65
        assert 0.6 < get(f"{url}/sync", "900").json()["remaining"] <= 0.85
        assert 3.5 < get(f"{url}/long").json()["remaining"] <= 3.95
        assert 5.5 < get(f"{url}/long", "90000").json()["remaining"] <= 5.95
        slow = get(f"{url}/slow?id={key()}", "200")
        assert slow.status_code == 504
        assert slow.json()["budget_ms"] == 150
        rid = key()
        closed = hang_up_after(f"{url}/slow?id={rid}", 0.2)
        assert 0 <= record.wait(rid, "cancelled") - closed < 0.15
        finished = events.wait_finished(6)
        assert [e.route for e in finished][2:4] == ["/long", "/long"]
        assert finished[-1].outcome == "caller_left"


def test_hypercorn(record: Record, events: Events) -> None:
    """Under hypercorn: deadline in handlers, 504 on time, caller-left cancels, bodies intact."""
    with serve_hypercorn(starlette_app(record)) as url:
        assert 0.5 < get(f"{url}/info", "800").json()["remaining"] <= 0.75
        begin = time.monotonic()
        assert get(f"{url}/slow?id={key()}", "300").status_code == 504
        assert 0.24 <= time.monotonic() - begin <= 0.75
        rid = key()
        closed = hang_up_after(f"{url}/slow?id={rid}", 0.2)
        assert 0 <= record.wait(rid, "cancelled") - closed < 0.15
        payload = os.urandom(2 * 1024 * 1024)
        echoed = httpx.post(f"{url}/echo?delay=0.05", content=payload, timeout=10).json()
        assert echoed["sha"] == hashlib.sha256(payload).hexdigest()
        assert get(f"{url}/stream").text.endswith("chunk4;")
        outcomes = [e.outcome for e in events.wait_finished(5)]
        assert outcomes[:3] == ["ok", "deadline", "caller_left"]


def test_custom_header_name(record: Record) -> None:
    """With header="x-budget-ms" that header is read instead of x-request-timeout-ms."""
    app = starlette_app(record, header="X-Budget-Ms")
    with serve_uvicorn(app) as url:
        left = httpx.get(f"{url}/info", headers={"x-budget-ms": "500"}, timeout=5)
        assert 0.3 < left.json()["remaining"] <= 0.45
        ignored = get(f"{url}/info", "300").json()["remaining"]
        assert ignored > 0.8  # ours is not read: the default applies


def test_keep_alive_connection_serves_many(base: str) -> None:
    """Many requests on one keep-alive connection, including after a 504, all get answers."""
    with httpx.Client(timeout=5) as client:
        for ms in ("500", "0", "500"):
            response = client.get(f"{base}/info", headers={"x-request-timeout-ms": ms})
            assert response.status_code == (504 if ms == "0" else 200)
        assert client.get(f"{base}/slow?id={key()}", headers={"x-request-timeout-ms": "100"})
        assert client.get(f"{base}/info").status_code == 200


def test_raw_socket_request_without_headers(base: str) -> None:
    """A bare HTTP/1.0 request with no headers at all gets the default budget."""
    port = httpx.URL(base).port
    assert port is not None
    answer = raw_request(port, b"GET /info HTTP/1.0\r\n\r\n")
    assert status_of(answer) == 200
    left = json.loads(answer.partition(b"\r\n\r\n")[2])["remaining"]
    assert 0.8 < left <= 0.95


@pytest.mark.anyio
async def test_lifespan_and_websocket_pass_through() -> None:
    """Non-HTTP scopes reach the app untouched, with the original receive and send."""
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append((scope["type"], receive, send, deadlines.current()))

    async def receive() -> Any:
        return {"type": "lifespan.startup"}

    async def send(message: Any) -> None:
        return None

    middleware = DeadlineMiddleware(app, default=1, maximum=2)
    for kind in ("lifespan", "websocket"):
        await middleware({"type": kind}, receive, send)
    assert seen == [("lifespan", receive, send, None), ("websocket", receive, send, None)]


def test_options_are_validated() -> None:
    """Bad options fail at construction with messages that name them."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        return None

    with pytest.raises(ValueError, match="default"):
        DeadlineMiddleware(app, default=3, maximum=2)
    with pytest.raises(ValueError, match="reserve"):
        DeadlineMiddleware(app, default=1, maximum=2, reserve=-1)
    with pytest.raises(ValueError, match="header"):
        DeadlineMiddleware(app, default=1, maximum=2, header="")
    with pytest.raises(ValueError, match="read_ahead"):
        DeadlineMiddleware(app, default=1, maximum=2, read_ahead=-5)
    with pytest.raises(TypeError, match="Limits"):
        DeadlineMiddleware(app, default=1, maximum=2, routes={"/x": (1, 2)})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="start with"):
        DeadlineMiddleware(app, default=1, maximum=2, routes={"x": Limits(default=1, maximum=2)})
    with pytest.raises(TypeError, match="ASGI"):
        DeadlineMiddleware(None, default=1, maximum=2)  # type: ignore[arg-type]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_deadline_applies_under_both_backends(anyio_backend: str) -> None:
    """Called directly under asyncio or trio, the app is stopped at the deadline with a 504."""
    import anyio

    sent: list[Any] = []
    seen: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(deadlines.current())
        await anyio.sleep(5)

    async def receive() -> Any:
        await anyio.sleep(10)  # nothing from the client
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        sent.append(message)

    middleware = DeadlineMiddleware(app, default=0.1, maximum=1, reserve=0)
    begin = time.monotonic()
    await middleware({"type": "http", "method": "GET", "path": "/", "headers": []}, receive, send)
    assert 0.09 <= time.monotonic() - begin < 0.6
    assert seen[0] is not None
    assert sent[0]["status"] == 504
    assert json.loads(sent[1]["body"])["limit"] == "route default"
