"""DeadlineMiddleware and the outbound clients under ``uvicorn[standard]``: uvloop and httptools.

Production services run uvicorn with uvloop's event loop and the httptools parser. uvloop's
loop has no ``_thread_id``, so the middleware asks for the running loop on every request
instead of reusing the one it remembered, and its timers (the deadline's, the sweeper's,
the outbound clients') run on libuv's millisecond clock; httptools reports the caller
leaving through its own protocol code, not h11's. Real uvicorn servers on loopback, real
sockets. uvloop and httptools are in the dev extra: without them this module fails to
import (it is never skipped).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import httptools  # noqa: F401 - the parser uvicorn is asked for; fail here when missing
import httpx
import pytest
import uvloop
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

import deadlines
import deadlines.aiohttp
import deadlines.httpx
from deadlines.asgi import DeadlineMiddleware
from deadlines.lab.servers import SilentServer

from .apps import Record, fastapi_app, starlette_app
from .conftest import Events, serve_uvicorn
from .test_asgi import get, hang_up_after, key

pytestmark = pytest.mark.realtime

# A timer never fires before its instant, but uvloop's clock counts whole milliseconds.
EARLY = 0.005
LATE = 0.75  # how late an answer may be on a loaded 2-core machine
GONE = 0.3  # how soon after the caller hangs up the handler must be cancelled


class Served(NamedTuple):
    """A running server: its base URL, the app it serves, what the probe saw."""

    url: str
    app: Any
    seen: dict[str, str]


class Probe:
    """Records the event loop and the HTTP protocol serving the requests, then passes them on."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: dict[str, str] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            loop = type(asyncio.get_running_loop())
            self.seen["loop"] = f"{loop.__module__}.{loop.__qualname__}"
            # uvicorn's receive is a bound method of its protocol module's request cycle.
            self.seen["protocol"] = type(receive.__self__).__module__
        await self.app(scope, receive, send)


@contextlib.contextmanager
def serve_standard(app: Any) -> Iterator[Served]:
    """Serve `app` as uvicorn[standard] does in production: uvloop and httptools."""
    probe = Probe(app)
    with serve_uvicorn(probe, loop="uvloop", http="httptools") as url:
        yield Served(url, app, probe.seen)


@pytest.fixture(scope="module")
def starlette_server(record: Record) -> Iterator[Served]:
    """The Starlette app of apps.py (default 1 s, maximum 2 s) on uvloop and httptools."""
    with serve_standard(starlette_app(record)) as served:
        yield served


@pytest.fixture(scope="module")
def fastapi_server(record: Record) -> Iterator[Served]:
    """The FastAPI app of apps.py (default 1 s, maximum 2 s) on uvloop and httptools."""
    with serve_standard(fastapi_app(record)) as served:
        yield served


@pytest.fixture(params=["starlette", "fastapi"])
def server(request: pytest.FixtureRequest) -> Served:
    """Each app in turn."""
    served: Served = request.getfixturevalue(f"{request.param}_server")
    return served


def middleware_of(app: Any) -> DeadlineMiddleware:
    """The DeadlineMiddleware instance in a Starlette/FastAPI app's built middleware stack."""
    layer = app.middleware_stack  # built by the app's first request
    while not isinstance(layer, DeadlineMiddleware):
        layer = layer.app
    return layer


def test_served_by_uvloop_and_httptools(server: Served) -> None:
    """The servers really run uvloop's loop, which has no `_thread_id`, and httptools."""
    assert get(f"{server.url}/info").status_code == 200
    assert server.seen == {
        "loop": "uvloop.Loop",
        "protocol": "uvicorn.protocols.http.httptools_impl",
    }
    loop = uvloop.new_event_loop()
    try:
        assert not hasattr(loop, "_thread_id")
    finally:
        loop.close()


def test_handler_sees_header_capped_less_reserve(server: Served) -> None:
    """`deadlines.current()` in the handler: the header's budget, capped by the maximum,
    less the 50 ms reserve; the default without a header; sync handlers too."""
    url = server.url
    assert 0.45 < get(f"{url}/info", "800").json()["remaining"] <= 0.75
    assert 0.7 < get(f"{url}/info").json()["remaining"] <= 0.95
    assert 1.7 < get(f"{url}/info", "600000").json()["remaining"] <= 1.95
    assert 0.6 < get(f"{url}/sync", "900").json()["remaining"] <= 0.85


@pytest.mark.parametrize("ms", ["300", "60"])
def test_overrun_is_answered_504_on_time(
    server: Served, ms: str, record: Record, events: Events
) -> None:
    """The deadline's timer fires under uvloop: the handler is cancelled and the client gets
    the 504 JSON at the budget. 300 ms is armed by the sweeper after `watch_after`; 60 ms
    (10 ms after the reserve) is armed on arrival."""
    budget = int(ms) / 1000 - 0.05
    rid = key()
    begin = time.monotonic()
    response = get(f"{server.url}/slow?id={rid}", ms)
    took = time.monotonic() - begin
    assert response.status_code == 504
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["error"] == "deadline exceeded"
    assert body["limit"] == "x-request-timeout-ms"
    assert abs(body["budget_ms"] - budget * 1000) <= 1  # whole ms, float arithmetic
    assert budget - EARLY <= took <= budget + LATE
    cancelled = record.wait(rid, "cancelled")
    assert cancelled - record.get(rid)["started"] <= budget + LATE
    assert "finished" not in record.get(rid)
    finished = events.wait_finished(1)[0]
    assert (finished.route, finished.outcome) == ("/slow", "deadline")


def test_caller_leaving_cancels_handler(server: Served, record: Record, events: Events) -> None:
    """A client that hangs up mid-request: httptools reports it, the handler is cancelled."""
    rid = key()
    closed = hang_up_after(f"{server.url}/slow?id={rid}", 0.2)
    assert 0 <= record.wait(rid, "cancelled") - closed < GONE
    assert "finished" not in record.get(rid)
    finished = events.wait_finished(1)[0]
    assert (finished.route, finished.outcome) == ("/slow", "caller_left")


def test_caller_leaving_reason_and_unread_body(starlette_server: Served, record: Record) -> None:
    """The handler (ours runs it in the request's task) sees `CallerLeft` as the reason; a
    POST whose body the handler never reads is cancelled too."""
    url = starlette_server.url
    rid = key()
    closed = hang_up_after(f"{url}/slow?id={rid}", 0.2)
    assert 0 <= record.wait(rid, "cancelled") - closed < GONE
    assert isinstance(record.get(rid)["reason"], deadlines.CallerLeft)
    rid = key()
    closed = hang_up_after(f"{url}/unread?id={rid}", 0.2, method="POST", body=b"x" * 10_000)
    assert 0 <= record.wait(rid, "cancelled") - closed < GONE


def test_expired_on_arrival_never_runs_handler(
    server: Served, record: Record, events: Events
) -> None:
    """A header of 0 is answered 504 at once, and the handler never starts."""
    rid = key()
    begin = time.monotonic()
    response = get(f"{server.url}/slow?id={rid}", "0")
    assert time.monotonic() - begin < LATE
    assert response.status_code == 504
    assert response.json()["budget_ms"] == 0
    assert events.wait_finished(1)[0].outcome == "budget_exhausted"
    assert record.get(rid) == {}


def test_one_instance_serves_many_requests(server: Served, events: Events) -> None:
    """200 sequential requests on one keep-alive connection, then 50 at once, through one
    middleware instance: every budget is the request's own, every overrun a 504 on time.
    With uvloop the loop is looked up for each request (nothing remembered), it has one
    sweeper, and no request stays registered with it."""
    url = server.url
    expected: list[str] = []
    with httpx.Client(timeout=10) as client:
        for i in range(200):
            if i % 25 == 24:  # now and then one overruns, so the timers are armed
                response = client.get(
                    f"{url}/slow?id={key()}", headers={"x-request-timeout-ms": "120"}
                )
                assert response.status_code == 504
                expected.append("deadline")
                continue
            ms = 0 if i % 20 == 19 else 300 + 7 * i
            response = client.get(f"{url}/info", headers={"x-request-timeout-ms": str(ms)})
            if ms == 0:
                assert response.status_code == 504
                expected.append("budget_exhausted")
            else:
                expected.append("ok")
                budget = ms / 1000 - 0.05
                assert budget - LATE < response.json()["remaining"] <= budget

    async def at_once() -> list[tuple[float, httpx.Response, float]]:
        limits = httpx.Limits(max_connections=50)
        async with httpx.AsyncClient(timeout=10, limits=limits) as client:

            async def one(i: int) -> tuple[float, httpx.Response, float]:
                # /slow overruns its budget; /info answers within its own, which must
                # outlast what 50 requests at once on 2 cores may delay it by (LATE + 1 s,
                # as the check below allows), or it too is a 504 now and then.
                ms = 200 + 8 * i if i % 2 else 2000 + 8 * i
                path = f"/slow?id={key()}" if i % 2 else "/info"
                begin = time.monotonic()
                response = await client.get(
                    f"{url}{path}", headers={"x-request-timeout-ms": str(ms)}
                )
                return ms / 1000 - 0.05, response, time.monotonic() - begin

            return await asyncio.gather(*(one(i) for i in range(50)))

    for i, (budget, response, took) in enumerate(asyncio.run(at_once())):
        if i % 2:
            assert response.status_code == 504
            assert abs(response.json()["budget_ms"] - budget * 1000) <= 1
            assert budget - EARLY <= took <= budget + LATE + 1.0  # 50 at once on 2 cores
            expected.append("deadline")
        else:
            assert budget - LATE - 1.0 < response.json()["remaining"] <= budget
            expected.append("ok")

    finished = events.wait_finished(250, timeout=10)
    assert sorted(e.outcome for e in finished) == sorted(expected)
    assert expected.count("budget_exhausted") == 8 and expected.count("deadline") == 8 + 25
    middleware = middleware_of(server.app)
    assert middleware._sweeper is None  # only loops with a `_thread_id` are remembered
    [(loop, sweeper)] = middleware._sweepers.items()
    assert isinstance(loop, uvloop.Loop)
    assert sweeper.pending == {}


def outbound_app(record: Record) -> Starlette:
    """A handler that calls `target` with the deadlines client named by `client`, with
    limits far beyond the request's budget: only the request's deadline can end it."""

    async def call(request: Request) -> Response:
        rid, target = request.query_params["id"], request.query_params["target"]
        dependency = deadlines.Dependency("silent", headers=30.0, total=30.0)
        record.put(rid, started=time.monotonic())
        try:
            if request.query_params["client"] == "httpx":
                async with deadlines.httpx.AsyncClient(dependency) as http:
                    await http.get(target)
            else:
                async with (
                    deadlines.aiohttp.session(dependency) as session,
                    session.get(target) as response,
                ):
                    await response.read()
        except BaseException as exc:
            record.put(rid, ended=time.monotonic(), error=type(exc).__name__)
            raise
        return Response("answered")

    ours = Middleware(DeadlineMiddleware, default=1.0, maximum=2.0)
    return Starlette(routes=[Route("/call", call)], middleware=[ours])


@pytest.mark.parametrize("client", ["httpx", "aiohttp"])
def test_outbound_call_is_bounded_by_the_request_deadline(
    client: str, record: Record, events: Events
) -> None:
    """An outbound call to a server that never answers ends at the request's deadline under
    uvloop: the caller gets the 504 on time, the outbound socket is closed, and the
    silent server was told (x-request-timeout-ms) no more than the time left."""
    budget = 0.4 - 0.05
    rid = key()
    with SilentServer() as silent, serve_standard(outbound_app(record)) as served:
        begin = time.monotonic()
        response = get(f"{served.url}/call?id={rid}&client={client}&target={silent.url}", "400")
        took = time.monotonic() - begin
        assert response.status_code == 504
        assert budget - EARLY <= took <= budget + LATE
        assert record.wait(rid, "ended") - record.get(rid)["started"] <= budget + LATE
        assert silent.wait_peer_closed(1, timeout=5.0)
        told = int(silent.requests[0].headers["x-request-timeout-ms"])
        assert 0 < told <= budget * 1000
    assert served.seen["loop"] == "uvloop.Loop"
    assert record.get(rid)["error"] in ("CancelledError", "DeadlineExceeded")
    assert events.wait_finished(1)[0].outcome == "deadline"
