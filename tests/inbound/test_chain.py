"""A three-hop chain A → B → C on loopback, each hop its own uvicorn server.

With the middleware and the remaining time forwarded on every call, C is told how much
time is left and stops within tens of milliseconds of A's caller hanging up. Without
them, C does all its work for nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import deadlines
import deadlines.httpx
from deadlines import wire
from deadlines.asgi import DeadlineMiddleware

from .apps import Record
from .conftest import free_socket, serve_uvicorn

pytestmark = pytest.mark.realtime

C_WORK = 1.0  # seconds of work at C; long enough to tell "stopped" from "finished"
FIXED_TIMEOUT = 3.0  # the per-hop timeout of the chain without deadlines


def hop(
    downstream: str | None, record: Record, *, propagate: bool, outbound: str = "plain"
) -> Starlette:
    """A (or B) calls `downstream`; C (no downstream) does C_WORK seconds of work.

    `outbound` "plain" forwards the header by hand with httpx; "deadlines" uses
    `deadlines.httpx`, which does it (and bounds every phase) by itself.
    """

    async def relay(request: Request) -> Response:
        await asyncio.sleep(0.01)  # a little local work
        if outbound == "deadlines":
            dependency = deadlines.Dependency("next-hop", total=10.0)
            async with deadlines.httpx.AsyncClient(dependency) as smart:
                answer = await smart.get(
                    f"{downstream}/work", headers={"x-id": request.headers["x-id"]}
                )
            return Response(answer.content, status_code=answer.status_code)
        if propagate:  # what deadlines.httpx will do: forward the rest, bound the wait
            headers = wire.outbound_headers(deadlines.remaining())
            timeout = min(deadlines.remaining(), FIXED_TIMEOUT)
        else:
            headers, timeout = {}, FIXED_TIMEOUT
        headers["x-id"] = request.headers["x-id"]
        async with httpx.AsyncClient(timeout=timeout, verify=False) as client:
            answer = await client.get(f"{downstream}/work", headers=headers)
        return Response(answer.content, status_code=answer.status_code)

    async def work(request: Request) -> Response:
        key = request.headers["x-id"]
        record.put(key, told=request.headers.get(wire.HEADER), started=time.monotonic())
        try:
            for _ in range(int(C_WORK / 0.01)):
                await asyncio.sleep(0.01)  # a step of real work
        except asyncio.CancelledError:
            record.put(key, stopped=time.monotonic())
            raise
        record.put(key, finished=time.monotonic())
        return JSONResponse({"done": True})

    endpoint = relay if downstream is not None else work
    middleware = (
        [Middleware(DeadlineMiddleware, default=5.0, maximum=10.0, reserve=0.02)]
        if propagate
        else []
    )
    return Starlette(routes=[Route("/work", endpoint)], middleware=middleware)


@contextlib.contextmanager
def chain(record: Record, *, propagate: bool, outbound: str = "plain") -> Iterator[str]:
    """Start C, B and A; yields A's URL."""
    with (
        serve_uvicorn(hop(None, record, propagate=propagate)) as c,
        serve_uvicorn(hop(c, record, propagate=propagate, outbound=outbound)) as b,
        serve_uvicorn(hop(b, record, propagate=propagate, outbound=outbound)) as a,
    ):
        yield a


def call_and_hang_up(url: str, key: str, record: Record, *, budget_ms: str = "5000") -> float:
    """Call A over a raw socket; once C is at work, close the connection. Returns when."""
    port = httpx.URL(url).port
    assert port is not None
    request = (
        f"GET /work HTTP/1.1\r\nHost: a\r\nx-id: {key}\r\n{wire.HEADER}: {budget_ms}\r\n\r\n"
    ).encode()
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(request)
    record.wait(key, "started", timeout=5)  # the request went all the way to C
    time.sleep(0.1)
    hung_up = time.monotonic()
    sock.close()
    return hung_up


@pytest.mark.parametrize("outbound", ["plain", "deadlines"])
def test_caller_hanging_up_stops_c_within_tens_of_ms(outbound: str) -> None:
    """With deadlines, C is told the remaining time and stops soon after A's caller leaves."""
    record = Record()
    with chain(record, propagate=True, outbound=outbound) as a:
        key = uuid.uuid4().hex
        hung_up = call_and_hang_up(a, key, record)
        stopped = record.wait(key, "stopped", timeout=3)
        seen = record.get(key)
    told = int(seen["told"])
    assert 4000 < told < 5000  # the budget, less two reserves and the time spent
    assert "finished" not in seen
    print(f"C stopped {(stopped - hung_up) * 1000:.1f} ms after the caller hung up")
    assert 0 <= stopped - hung_up < 0.1, f"C stopped {stopped - hung_up:.3f} s after hang-up"


def test_without_deadlines_c_finishes_for_nobody() -> None:
    """Without the middleware, C is told nothing and finishes its work after the caller left."""
    record = Record()
    with chain(record, propagate=False) as a:
        key = uuid.uuid4().hex
        hung_up = call_and_hang_up(a, key, record)
        finished = record.wait(key, "finished", timeout=5)
        seen = record.get(key)
    assert seen["told"] is None
    assert "stopped" not in seen
    assert finished - hung_up > C_WORK / 2  # work went on long after the caller left


def test_budget_runs_out_along_the_chain() -> None:
    """A 600 ms budget: C is told less, stops by the deadline, and A answers 504 in time."""
    record = Record()
    with chain(record, propagate=True) as a:
        key = uuid.uuid4().hex
        begin = time.monotonic()
        answer = httpx.get(f"{a}/work", headers={wire.HEADER: "600", "x-id": key}, timeout=5)
        took = time.monotonic() - begin
        stopped = record.wait(key, "stopped", timeout=3)
        seen = record.get(key)
    assert answer.status_code == 504
    assert 0.5 <= took <= 0.58 + 0.5
    assert int(seen["told"]) < 600 - 2 * 20
    assert stopped - begin <= 0.6 + 0.5
    assert "finished" not in seen


class _Downstream:
    """A raw TCP server that never answers and records when each connection closes."""

    def __init__(self) -> None:
        self.closed: list[float] = []
        self.received = threading.Event()
        self.sock = free_socket()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        self.received.set()
        await reader.read()  # until the caller closes the connection
        self.closed.append(time.monotonic())
        writer.close()

    def __enter__(self) -> _Downstream:
        self.thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._handle, sock=self.sock), self.loop
        ).result(5)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        return self

    def wait_closed(self, timeout: float = 3.0) -> float:
        """When the first connection was closed by its caller."""
        end = time.monotonic() + timeout
        while not self.closed:
            assert time.monotonic() < end, "the downstream never saw the connection close"
            time.sleep(0.005)
        return self.closed[0]

    def __exit__(self, *exc: Any) -> None:
        async def stop() -> None:
            self._server.close()
            await self._server.wait_closed()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def test_disconnect_cancels_outbound_call_downstream_sees_close() -> None:
    """The caller leaving cancels the handler's outbound call: the downstream sees the close."""
    record = Record()
    with (
        _Downstream() as downstream,
        serve_uvicorn(hop(downstream.url, record, propagate=True)) as a,
    ):
        port = httpx.URL(a).port
        assert port is not None
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(b"GET /work HTTP/1.1\r\nHost: a\r\nx-id: 1\r\n\r\n")
            assert downstream.received.wait(5)
            time.sleep(0.1)
            hung_up = time.monotonic()
        closed = downstream.wait_closed()
    assert 0 <= closed - hung_up < 0.1, f"downstream saw the close {closed - hung_up:.3f} s later"
