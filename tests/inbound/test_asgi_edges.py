"""DeadlineMiddleware at the edges of an exchange, on real uvicorn and hypercorn servers.

Host routing, the time after the app returned (answering, then whatever called the
middleware), a connection gone while the 504 goes out, messages sent before the
response starts, deadline errors raised after the response is complete, and one
middleware serving on loop after loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import time
import weakref
from typing import Any

import httpx
import pytest

import deadlines
from deadlines.asgi import DeadlineMiddleware, limits

from .apps import Record
from .conftest import Events, serve_hypercorn, serve_uvicorn, uvicorn_in_loop

pytestmark = pytest.mark.realtime

ASGIApp = Any


def _outer(
    record: Record, key: str, app: ASGIApp, *, send_delay: float = 0.0, after: float = 0.0
) -> Any:
    """An ASGI middleware outside ours that records, under `key`, how ours returned.

    `send_delay`: each message waits that long before it reaches the server, as a
    server or middleware whose `send` suspends would; `after`: work the outer middleware
    does once the inner app returned (cancelled or not).
    """

    async def outer(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # hypercorn's lifespan: not a request
            await app(scope, receive, send)
            return

        async def slow_send(message: Any) -> None:
            if send_delay:
                await asyncio.sleep(send_delay)
            await send(message)

        try:
            await app(scope, receive, slow_send if send_delay else send)
        except BaseException as exc:
            record.put(key, inner=repr(exc))
            raise
        record.put(key, inner="returned")
        try:
            await asyncio.sleep(after)
        except asyncio.CancelledError:
            record.put(key, after="cancelled")
            raise
        record.put(key, after="done")

    return outer


def test_host_routes_keep_their_own_limits() -> None:
    """Two hosts serving the same path each get their own route's limits and maximum."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Host, Route, Router

    @limits(default=30, maximum=60)
    async def report(request: Request) -> JSONResponse:
        return JSONResponse({"remaining": deadlines.remaining()})

    async def api(request: Request) -> JSONResponse:
        return JSONResponse({"remaining": deadlines.remaining()})

    app = Starlette(
        routes=[
            Host("reports.example.com", app=Router([Route("/run", report)])),
            Host("api.example.com", app=Router([Route("/run", api)])),
        ]
    )
    wrapped = DeadlineMiddleware(app, default=1.0, maximum=2.0)

    def remaining(host: str, ms: str | None = None) -> float:
        headers = {"host": host} | ({} if ms is None else {"x-request-timeout-ms": ms})
        answer = httpx.get(f"{url}/run", headers=headers, timeout=5.0)
        assert answer.status_code == 200
        return float(answer.json()["remaining"])

    with serve_uvicorn(wrapped) as url:
        for _ in range(2):  # the second round is answered from the route cache
            assert 0.5 < remaining("api.example.com") <= 0.95
            assert 29.5 < remaining("reports.example.com") <= 29.95
            assert 1.5 < remaining("api.example.com", "60000") <= 1.95  # its own maximum
            assert 49.5 < remaining("reports.example.com", "50000") <= 49.95


def test_no_deadline_timer_outlives_the_app(record: Record, events: Events) -> None:
    """The app fails with a deadline error early and the 504 takes a while to go out: the
    request's deadline timer is never armed after that, and whoever called the
    middleware is not cancelled at the request's deadline later on."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        async with deadlines.scope(0.001):  # the app's own, far shorter than the request's
            await asyncio.sleep(1)

    # 300 ms budget: far enough that its timer waits for the sweeper (10 ms), which
    # comes round while the 504 is held up for 100 ms.
    inner = DeadlineMiddleware(app, default=2.0, maximum=10.0)
    with serve_uvicorn(_outer(record, "timer", inner, send_delay=0.1, after=0.6)) as url:
        answer = httpx.get(url, headers={"x-request-timeout-ms": "300"}, timeout=5.0)
        assert answer.status_code == 504
        assert record.wait("timer", "after", timeout=5.0) == "done"
    assert record.get("timer")["inner"] == "returned"
    assert events.wait_finished(1)[0].outcome == "deadline"


def test_caller_left_seen_by_the_app_ends_quietly(record: Record, events: Events) -> None:
    """The app reads the disconnect itself and returns; the middleware's 499 then goes
    out through a `send` that suspends, and the middleware still returns normally."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass

    inner = DeadlineMiddleware(app, default=2.0, maximum=10.0)
    with serve_uvicorn(_outer(record, "left", inner, send_delay=0.05)) as url:
        port = httpx.URL(url).port
        head = b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-length: 100\r\n\r\nfirst"
        with socket.create_connection(("127.0.0.1", port), timeout=5.0) as sock:
            sock.sendall(head)
            time.sleep(0.05)
        assert record.wait("left", "after", timeout=5.0) == "done"
    assert record.get("left")["inner"] == "returned"
    assert events.wait_finished(1)[0].outcome == "caller_left"


class _GoneOnSend:
    """Outside ours: every `send` fails as an ASGI 2.4 server's does once the connection
    is closed (an OSError)."""

    def __init__(self, app: ASGIApp, record: Record) -> None:
        self.app = app
        self.record = record

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        async def gone(message: Any) -> None:
            raise ConnectionResetError("the connection is closed")

        try:
            await self.app(scope, receive, gone)
        except BaseException as exc:
            self.record.put(scope["path"], inner=repr(exc))
            raise
        self.record.put(scope["path"], inner="returned")


@pytest.mark.parametrize(
    ("path", "ms", "outcome"), [("/slow", "100", "deadline"), ("/now", "0", "budget_exhausted")]
)
def test_504_to_a_closed_connection_is_counted(
    path: str, ms: str, outcome: str, record: Record, events: Events
) -> None:
    """When the 504 cannot be sent (the caller is gone), the middleware returns and the
    request's outcome is still reported: no request stays in flight in the metrics."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await asyncio.sleep(5)

    inner = DeadlineMiddleware(app, default=2.0, maximum=10.0)
    with serve_uvicorn(_GoneOnSend(inner, record)) as url:
        httpx.get(f"{url}{path}", headers={"x-request-timeout-ms": ms}, timeout=5.0)
        assert record.wait(path, "inner") == "returned"
    finished = events.wait_finished(1)
    assert [(e.route, e.outcome) for e in finished] == [("*", outcome)]


def test_early_hint_does_not_start_the_response(events: Events) -> None:
    """103 Early Hints before the response: the deadline still gets its 504 (hypercorn,
    which sends hints over HTTP/2: here cleartext, with prior knowledge)."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        assert "http.response.early_hint" in scope["extensions"]
        links = [b"</style.css>; rel=preload; as=style"]
        await send({"type": "http.response.early_hint", "links": links})
        await asyncio.sleep(5)

    wrapped = DeadlineMiddleware(app, default=2.0, maximum=10.0)
    with serve_hypercorn(wrapped) as url, httpx.Client(http1=False, http2=True) as client:
        answer = client.get(url, headers={"x-request-timeout-ms": "300"}, timeout=5.0)
    assert answer.http_version == "HTTP/2"
    assert answer.status_code == 504
    assert answer.json()["budget_ms"] == 250
    assert events.wait_finished(1)[0].outcome == "deadline"


def test_response_with_trailers_is_complete_after_them(record: Record, events: Events) -> None:
    """A response whose start promises trailers is not complete at its last body: the
    deadline passing before the trailers is a deadline on a started response (the
    error is raised, the server ends the stream); once they are out, it cuts cleanup."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        assert "http.response.trailers" in scope["extensions"]
        start = {"type": "http.response.start", "status": 200, "headers": [], "trailers": True}
        await send(start)
        await send({"type": "http.response.body", "body": b"whole"})
        await asyncio.sleep(float(scope["query_string"] or 0))  # before the trailers
        await send({"type": "http.response.trailers", "headers": [(b"x-sum", b"1")]})
        await asyncio.sleep(5)  # cleanup, for nobody

    inner = DeadlineMiddleware(app, default=2.0, maximum=10.0)
    returned = []
    for late in ("5", "0"):  # one server each, so each one's outer record is its own
        wrapped = _outer(record, f"trailers{late}", inner)
        with serve_hypercorn(wrapped) as url, httpx.Client(http1=False, http2=True) as client:
            with contextlib.suppress(httpx.HTTPError):  # how the stream ends is hypercorn's
                client.get(f"{url}?{late}", headers={"x-request-timeout-ms": "300"}, timeout=1)
            returned.append(record.wait(f"trailers{late}", "inner", timeout=5.0))
    assert returned[0].startswith("DeadlineExceeded") and returned[1] == "returned"
    assert [e.outcome for e in events.wait_finished(2)] == ["deadline", "ok"]


def test_app_deadline_error_after_complete_response_is_raised(
    record: Record, events: Events
) -> None:
    """After a complete response, a deadline error of the app's own (not the request's
    timer) is raised like any other error, not taken for cleanup cut short."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"done"})
        async with deadlines.scope(0.01):
            await asyncio.sleep(1)

    inner = DeadlineMiddleware(app, default=2.0, maximum=10.0)
    with serve_uvicorn(_outer(record, "after", inner)) as url:
        answer = httpx.get(url, timeout=5.0)
        assert (answer.status_code, answer.text) == (200, "done")
        assert "DeadlineExceeded" in record.wait("after", "inner")
    assert events.wait_finished(1)[0].outcome == "error"


def test_closed_loops_are_let_go() -> None:
    """One middleware serving on loop after loop (a test suite, `asyncio.run` again and
    again) keeps none of the closed loops but the last, until another one comes along."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    wrapped = DeadlineMiddleware(app, default=2.0, maximum=10.0)
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def serve_once() -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        async with uvicorn_in_loop(wrapped) as url, httpx.AsyncClient(timeout=5.0) as client:
            answer = await client.get(url, headers={"x-request-timeout-ms": "900"})
            assert answer.status_code == 204

    for _ in range(4):
        asyncio.run(serve_once())
    gc.collect()
    assert [ref() is None for ref in loops] == [True, True, True, False]


def test_server_errors_the_app_answers_are_errors(events: Events) -> None:
    """A 5xx the app answers with (without raising) ends "error"; a 4xx is an answer."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def busy(request: Request) -> PlainTextResponse:
        return PlainTextResponse("busy", status_code=503)

    app = Starlette(routes=[Route("/busy", busy)])
    wrapped = DeadlineMiddleware(app, default=2.0, maximum=10.0)
    with serve_uvicorn(wrapped) as url, httpx.Client(timeout=5.0) as client:
        statuses = [client.get(f"{url}{path}").status_code for path in ("/busy", "/nowhere")]
    assert statuses == [503, 404]
    assert [e.outcome for e in events.wait_finished(2)] == ["error", "ok"]
