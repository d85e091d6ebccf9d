"""`DeadlineMiddleware(gate=...)` on real servers: uvicorn (ASGI, asyncio) and aiohttp.web.

Each test starts a server with a gate of its own; the app records the requests it saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

import deadlines
from deadlines import Admission, CoDel, Gate

from .conftest import Events, serve_aiohttp, serve_uvicorn

pytestmark = pytest.mark.realtime
#: The servers each test runs on (the `serve` fixture).
each_server = pytest.mark.parametrize("server", ["asgi", "aiohttp"])

Serve = Callable[[Gate], contextlib.AbstractContextManager[str]]


class Calls:
    """The ids of the requests the app started, in order, from the server's thread."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self._lock = threading.Lock()

    def add(self, ident: str) -> None:
        with self._lock:
            self.ids.append(ident)


async def _work(gate: Gate, calls: Calls, query: Any) -> None:
    """/work?id=I&ms=N sleeps N ms; /hold?id=I&waiting=W returns once W requests wait."""
    calls.add(query.get("id", "-"))
    if "waiting" in query:
        end = time.monotonic() + 5.0
        while gate.waiting < int(query["waiting"]) and time.monotonic() < end:
            await asyncio.sleep(0.005)
    else:
        await asyncio.sleep(float(query.get("ms", "0")) / 1000.0)


@contextlib.contextmanager
def _asgi(gate: Gate, calls: Calls) -> Iterator[str]:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from deadlines.asgi import DeadlineMiddleware

    async def work(request: Request) -> PlainTextResponse:
        await _work(gate, calls, request.query_params)
        return PlainTextResponse("done")

    app = Starlette(routes=[Route("/work", work), Route("/hold", work)])
    with serve_uvicorn(DeadlineMiddleware(app, default=5.0, maximum=30.0, gate=gate)) as url:
        yield url


@contextlib.contextmanager
def _aiohttp(gate: Gate, calls: Calls) -> Iterator[str]:
    from aiohttp import web

    from deadlines.aiohttp_web import DeadlineMiddleware

    async def work(request: web.Request) -> web.Response:
        await _work(gate, calls, request.query)
        return web.Response(text="done")

    app = web.Application(middlewares=[DeadlineMiddleware(default=5.0, maximum=30.0, gate=gate)])
    app.router.add_get("/work", work)
    app.router.add_get("/hold", work)
    with serve_aiohttp(app) as url:
        yield url


@pytest.fixture
def calls() -> Calls:
    """The requests the app saw."""
    return Calls()


@pytest.fixture
def serve(server: str, calls: Calls) -> Serve:
    """Start the server under test with a gate."""
    return lambda gate: (_asgi if server == "asgi" else _aiohttp)(gate, calls)


def ms(value: int) -> dict[str, str]:
    """The deadline header."""
    return {"x-request-timeout-ms": str(value)}


def _until(predicate: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, f"{what} did not happen within {timeout} s"
        time.sleep(0.005)


@contextlib.contextmanager
def _holding(client: httpx.Client, url: str, gate: Gate, ms: int, id: str = "A") -> Iterator[None]:
    """A request of `ms` at work in `gate`'s one turn (from another thread) while the
    block runs; then its end, and the turn given back."""
    params: dict[str, str | int] = {"ms": ms, "id": id}
    holder = threading.Thread(target=client.get, args=(f"{url}/work",), kwargs={"params": params})
    holder.start()
    _until(lambda: gate.busy == 1, "the first request at work")
    yield
    holder.join(5)
    _until(lambda: gate.busy == 0, "the turn given back")


def _learn(url: str, service_ms: int, times: int = 3) -> None:
    for i in range(times):
        response = httpx.get(f"{url}/work", params={"ms": service_ms, "id": f"learn{i}"})
        assert response.status_code == 200


@each_server
def test_admission_sheds_once_the_service_time_is_learned(
    serve: Serve, calls: Calls, events: Events
) -> None:
    """503 with Retry-After and the reason, without calling the app, once learned."""
    gate = Gate(admission=Admission(min_samples=3, rejection_budget=1.0))
    with serve(gate) as url:
        short = httpx.get(f"{url}/work", params={"ms": 300, "id": "early"}, headers=ms(250))
        assert short.status_code == 504  # nothing learned yet: admitted, ran out of time
        _learn(url, 300)
        response = httpx.get(f"{url}/work", params={"ms": 300, "id": "shed"}, headers=ms(250))
        assert response.status_code == 503
        assert response.headers["retry-after"] == "1"
        assert response.json() == {"error": "overloaded", "reason": "admission", "retry_after_s": 1}
        assert "shed" not in calls.ids
        finished = events.wait_finished(5)
    assert [e.outcome for e in finished] == ["deadline", "ok", "ok", "ok", "shed"]


@each_server
def test_expired_arrival_is_504_without_the_app(serve: Serve, calls: Calls) -> None:
    """A request whose budget is spent on arrival gets the usual 504 body at once."""
    with serve(Gate(limit=1, admission=Admission())) as url:
        response = httpx.get(f"{url}/work", params={"id": "expired"}, headers=ms(10))
    assert response.status_code == 504
    assert response.json()["error"] == "deadline exceeded"
    assert calls.ids == []


@each_server
def test_deadline_passing_in_the_queue_is_late(serve: Serve, calls: Calls, events: Events) -> None:
    """Queued behind a long request, the deadline passes: 504 at the deadline, no app
    call, the queue left at once, outcome "late"."""
    gate = Gate(limit=1)
    with serve(gate) as url, httpx.Client() as client, _holding(client, url, gate, 1500):
        started = time.monotonic()
        late = client.get(f"{url}/work", params={"id": "B"}, headers=ms(350))
        took = time.monotonic() - started
        assert gate.waiting == 0 and gate.busy == 1
    assert late.status_code == 504 and late.json()["error"] == "deadline exceeded"
    assert took < 1.0  # at its deadline, not when the first request ended
    assert calls.ids == ["A"]
    outcomes = {e.outcome for e in events.wait_finished(2)}
    assert outcomes == {"late", "ok"}


@each_server
def test_caller_leaving_leaves_the_queue(serve: Serve, calls: Calls, events: Events) -> None:
    """A waiting request whose caller hangs up leaves the queue at once; no app call."""
    gate = Gate(limit=1)
    with serve(gate) as url, httpx.Client() as client, _holding(client, url, gate, 2000):
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GET /work?id=B HTTP/1.1\r\nHost: x\r\n\r\n")
            _until(lambda: gate.waiting == 1, "the second request queued")
        left = time.monotonic()
        _until(lambda: gate.waiting == 0, "the queue left", timeout=1.5)
        assert time.monotonic() - left < 1.0 and gate.busy == 1
    assert calls.ids == ["A"]
    assert {e.outcome for e in events.wait_finished(2)} == {"caller_left", "ok"}


async def _burst(url: str, count: int, service_ms: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=30.0) as client:
        return await asyncio.gather(
            *(
                client.get(
                    f"{url}/work", params={"ms": service_ms, "id": str(i)}, headers=ms(20000)
                )
                for i in range(count)
            )
        )


@each_server
def test_codel_sheds_a_standing_queue(serve: Serve, calls: Calls) -> None:
    """Many more requests than fit: CoDel sheds the ones that waited, with Retry-After."""
    gate = Gate(limit=1, codel=CoDel(target=0.05, interval=0.5))
    with serve(gate) as url:
        responses = asyncio.run(_burst(url, 40, 50))
    served = [r for r in responses if r.status_code == 200]
    shed = [r for r in responses if r.status_code == 503]
    assert len(served) + len(shed) == 40
    assert len(shed) >= 5
    assert all(r.json()["reason"] == "codel" and r.headers["retry-after"] == "1" for r in shed)
    assert len(calls.ids) == len(served)


@each_server
def test_codel_sheds_nothing_for_a_short_burst(serve: Serve) -> None:
    """A burst that drains well within the interval is served whole."""
    gate = Gate(limit=1, codel=CoDel(target=0.05, interval=0.5))
    with serve(gate) as url:
        responses = asyncio.run(_burst(url, 4, 20))
    assert [r.status_code for r in responses] == [200] * 4


@each_server
def test_lifo_serves_the_newest_first(serve: Serve, calls: Calls) -> None:
    """While CoDel sees a standing queue, the newest waiter gets the next turn."""
    codel = CoDel(target=5.0, interval=30.0)  # no interval ends within the test
    codel.overloaded = True  # as after an interval with a standing queue
    gate = Gate(limit=1, codel=codel)
    with serve(gate) as url, httpx.Client() as client:
        threads = [
            threading.Thread(
                target=client.get,
                args=(f"{url}/hold",),
                kwargs={"params": {"id": "0", "waiting": 3}},
            )
        ]
        threads[0].start()
        _until(lambda: gate.busy == 1, "the first request at work")
        for i in (1, 2, 3):
            thread = threading.Thread(
                target=client.get, args=(f"{url}/work",), kwargs={"params": {"id": str(i)}}
            )
            thread.start()
            threads.append(thread)
            if i < 3:
                _until(lambda i=i: gate.waiting == i, f"request {i} queued")
        for thread in threads:
            thread.join(10)
    assert calls.ids == ["0", "3", "2", "1"]


@each_server
def test_the_rejection_budget_caps_refusals(serve: Serve, calls: Calls) -> None:
    """Past the rejection budget (20 % of arrivals) requests are admitted and run into
    their deadline, as without admission."""
    gate = Gate(admission=Admission(min_samples=3, rejection_budget=0.2))
    with serve(gate) as url:
        _learn(url, 200)
        statuses = [
            httpx.get(f"{url}/work", params={"ms": 200, "id": str(i)}, headers=ms(150)).status_code
            for i in range(20)
        ]
    shed, late = statuses.count(503), statuses.count(504)
    assert 1 <= shed <= 5 and shed + late == 20
    assert len(calls.ids) == 3 + late


@each_server
def test_metrics_count_late_and_shed(serve: Serve) -> None:
    """The inbound requests counter has outcomes "shed" and "late", the refusals
    counter the gate's reason (Prometheus)."""
    from prometheus_client import CollectorRegistry

    from deadlines import prometheus

    registry = CollectorRegistry()
    gate = Gate(limit=1, admission=Admission(min_samples=3, rejection_budget=1.0))
    with prometheus.install(registry), serve(gate) as url, httpx.Client() as client:
        _learn(url, 300)
        assert client.get(f"{url}/work", headers=ms(250)).status_code == 503
        with _holding(client, url, gate, 1000, id="-"):
            assert client.get(f"{url}/work", headers=ms(600)).status_code == 504
        value = registry.get_sample_value
        name = "deadlines_inbound_requests_total"
        assert value(name, {"route": "/work", "outcome": "shed"}) == 1
        assert value(name, {"route": "/work", "outcome": "late"}) == 1
        assert value(name, {"route": "/work", "outcome": "ok"}) == 4
        refused = "deadlines_inbound_refused_total"
        assert value(refused, {"route": "/work", "reason": "admission"}) == 1
        assert value(refused, {"route": "/work", "reason": "late"}) == 1


def test_a_gate_under_trio_is_refused() -> None:
    """The ASGI middleware's gate runs under asyncio only: under trio, a clear error."""
    import trio

    from deadlines.asgi import DeadlineMiddleware

    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("never called")

    middleware = DeadlineMiddleware(app, default=1.0, maximum=1.0, gate=Gate(limit=1))
    scope = {"type": "http", "method": "GET", "path": "/", "headers": []}

    async def call() -> None:
        await middleware(scope, None, None)  # type: ignore[arg-type]

    with pytest.raises(RuntimeError, match="asyncio only"):
        trio.run(call)


def test_the_gate_option_is_validated() -> None:
    """gate= takes a deadlines.Gate, in both middlewares."""
    from deadlines.aiohttp_web import DeadlineMiddleware as AiohttpMiddleware
    from deadlines.asgi import DeadlineMiddleware

    with pytest.raises(TypeError, match="Gate"):
        DeadlineMiddleware(print, default=1, maximum=1, gate=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Gate"):
        AiohttpMiddleware(default=1, maximum=1, gate=deadlines.Admission())  # type: ignore[arg-type]


@each_server
def test_work_cut_short_is_not_learned(serve: Serve) -> None:
    """Callers with less time left than the route takes, all admitted (no rejection
    budget): their deadlines cut the work at ~0.1 s, which is not the route's service
    time."""
    admission = Admission(min_samples=3, rejection_budget=0.0)
    with serve(Gate(limit=4, admission=admission)) as url:
        _learn(url, 300)
        for i in range(5):
            response = httpx.get(f"{url}/work", params={"ms": 300, "id": f"c{i}"}, headers=ms(150))
            assert response.status_code == 504
    assert admission.expected("/work") == pytest.approx(0.3, abs=0.1)


def test_aiohttp_a_websocket_holds_no_turn() -> None:
    """A WebSocket session is not a request at work: with limit=1 and a session open, a
    plain GET is served at once, and the session's length is not learned."""
    from aiohttp import web

    from deadlines.aiohttp_web import DeadlineMiddleware

    admission = Admission(min_samples=1)
    gate = Gate(limit=1, admission=admission)

    async def session(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for _ in ws:
            pass
        return ws

    async def plain(request: web.Request) -> web.Response:
        return web.Response(text="done")

    async def talk(url: str) -> tuple[int, float]:
        import aiohttp

        async with aiohttp.ClientSession() as client, client.ws_connect(f"{url}/ws") as ws:
            started = time.monotonic()
            async with client.get(f"{url}/plain", headers=ms(2000)) as response:
                status = response.status
            took = time.monotonic() - started
            await ws.close()
        return status, took

    app = web.Application(middlewares=[DeadlineMiddleware(default=5.0, maximum=30.0, gate=gate)])
    app.router.add_get("/ws", session)
    app.router.add_get("/plain", plain)
    with serve_aiohttp(app) as url:
        status, took = asyncio.run(talk(url))
        _until(lambda: gate.busy == 0, "the GET's turn given back")
    assert status == 200 and took < 1.0
    assert admission.expected("/ws") is None


def test_aiohttp_a_body_made_later_is_made_in_the_turn() -> None:
    """``web.Response(body=agen())``: the body is made before the turn is given back, so
    the limit holds for it (never two at once with limit=1) and its time is learned."""
    from aiohttp import web

    from deadlines.aiohttp_web import DeadlineMiddleware

    admission = Admission(min_samples=1)
    gate = Gate(limit=1, admission=admission)
    running: list[int] = [0, 0]  # now, most at once

    async def body() -> Any:
        running[0] += 1
        running[1] = max(running)
        try:
            await asyncio.sleep(0.3)
            yield b"done"
        finally:
            running[0] -= 1

    async def made_later(request: web.Request) -> web.Response:
        return web.Response(body=body())

    app = web.Application(middlewares=[DeadlineMiddleware(default=5.0, maximum=30.0, gate=gate)])
    app.router.add_get("/later", made_later)
    with serve_aiohttp(app) as url:

        async def four() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=10.0) as client:
                return await asyncio.gather(*(client.get(f"{url}/later") for _ in range(4)))

        responses = asyncio.run(four())
    assert [r.status_code for r in responses] == [200] * 4
    assert all(r.content == b"done" for r in responses)
    assert running[1] == 1
    assert admission.expected("/later") == pytest.approx(0.3, abs=0.1)
