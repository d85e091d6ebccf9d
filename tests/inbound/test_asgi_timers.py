"""The request's deadline is armed only for requests still running after `watch_after`.

Most requests end long before their deadline; the middleware enters the deadline at once
(handlers see it) but leaves arming its timer to the sweeper that starts the caller-left
watcher, so a request that ends sooner never touches a timer. A deadline that could pass
before the sweeper comes round is armed at once. Served by uvicorn in a thread of this
process, so the handlers can look at their loop's deadline timers.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import deadlines
from deadlines import _alarms
from deadlines.asgi import DeadlineMiddleware

from .conftest import serve_uvicorn


def _armed() -> int:
    """Deadline timers armed on the running loop (not the sweeper's)."""
    heap = _alarms.clock_for(asyncio.get_running_loop())._heap
    return sum(isinstance(entry[2], _alarms.Timeout) for entry in heap)


async def _quick(request: Request) -> JSONResponse:
    return JSONResponse({"armed": _armed(), "has_deadline": deadlines.current() is not None})


async def _after(request: Request) -> JSONResponse:
    await asyncio.sleep(float(request.query_params["sleep"]))
    return JSONResponse({"armed": _armed()})


def _app(watch_after: float) -> DeadlineMiddleware:
    routes = [Route("/quick", _quick), Route("/after", _after)]
    return DeadlineMiddleware(
        Starlette(routes=routes), default=2.0, maximum=10.0, watch_after=watch_after
    )


@pytest.fixture
def base() -> Iterator[str]:
    with serve_uvicorn(_app(watch_after=0.2)) as url:
        yield url


def test_a_quick_request_arms_no_timer(base: str) -> None:
    for _ in range(5):
        body = httpx.get(f"{base}/quick", timeout=5).json()
        assert body == {"armed": 0, "has_deadline": True}


def test_a_request_running_past_watch_after_is_armed(base: str) -> None:
    body = httpx.get(f"{base}/after?sleep=0.5", timeout=5).json()
    assert body["armed"] >= 1


def test_a_deadline_armed_late_still_fires_on_time(base: str) -> None:
    """Budget 0.5 s, armed by the sweeper at 0.2 s: 504 at 0.5 s, not after the 3 s sleep."""
    begin = time.monotonic()
    response = httpx.get(
        f"{base}/after?sleep=3", headers={"x-request-timeout-ms": "550"}, timeout=5
    )
    took = time.monotonic() - begin
    assert response.status_code == 504
    assert 0.49 <= took < 0.5 + 1.0


def test_a_deadline_within_the_watch_window_is_armed_at_once() -> None:
    """Budget 0.1 s with watch_after 1 s: armed on entry, so 504 long before 1 s."""
    with serve_uvicorn(_app(watch_after=1.0)) as url:
        begin = time.monotonic()
        response = httpx.get(
            f"{url}/after?sleep=3", headers={"x-request-timeout-ms": "150"}, timeout=5
        )
        took = time.monotonic() - begin
    assert response.status_code == 504
    assert 0.09 <= took < 0.6


class _LoopWithoutThreadId(asyncio.SelectorEventLoop):
    """As uvloop's loop, it has no `_thread_id` to read (asyncio's own keeps it elsewhere)."""

    _running_in: int | None = None

    def __setattr__(self, name: str, value: object) -> None:
        super().__setattr__("_running_in" if name == "_thread_id" else name, value)

    def is_running(self) -> bool:
        return self._running_in is not None


def test_a_loop_without_a_thread_id_is_asked_for_each_request() -> None:
    """Not remembered for the shortcut, which reads `_thread_id`; deadlines still apply."""
    seen: list[deadlines.Deadline | None] = []
    sent: list[Any] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(deadlines.current())
        await asyncio.sleep(float(scope["query_string"]))

    async def receive() -> Any:
        await asyncio.sleep(10)
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        sent.append(message)

    middleware = DeadlineMiddleware(app, default=0.1, maximum=1, reserve=0, watch_after=0.01)

    async def main() -> None:
        for wait in (b"0", b"0", b"5"):
            scope = {"type": "http", "method": "GET", "path": "/", "headers": []}
            await middleware({**scope, "query_string": wait}, receive, send)

    loop = _LoopWithoutThreadId()
    assert not hasattr(loop, "_thread_id")
    try:
        begin = time.monotonic()
        loop.run_until_complete(main())
        took = time.monotonic() - begin
    finally:
        loop.close()
    assert middleware._sweeper is None
    assert len(seen) == 3 and None not in seen
    assert [m["status"] for m in sent if m["type"] == "http.response.start"] == [504]
    assert 0.09 <= took < 0.6


def test_loops_in_two_threads_each_use_their_own_sweeper() -> None:
    """One middleware, two threads running asyncio loops at once: the remembered sweeper is
    used only by the thread whose loop it is, so every deadline fires on its own loop."""
    middleware = DeadlineMiddleware(_slow, default=0.05, maximum=1, reserve=0, watch_after=0.01)
    statuses: list[list[int]] = [[], []]

    async def serve(mine: list[int]) -> None:
        async def receive() -> Any:
            await asyncio.sleep(10)
            return {"type": "http.disconnect"}

        async def send(message: Any) -> None:
            if message["type"] == "http.response.start":
                mine.append(message["status"])

        scope = {"type": "http", "method": "GET", "path": "/", "headers": []}
        await asyncio.gather(*(middleware(dict(scope), receive, send) for _ in range(20)))
        for _ in range(5):
            await middleware(dict(scope), receive, send)

    threads = [threading.Thread(target=asyncio.run, args=(serve(mine),)) for mine in statuses]
    begin = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert time.monotonic() - begin < 2
    assert statuses == [[504] * 25, [504] * 25]


async def _slow(scope: Any, receive: Any, send: Any) -> None:
    await asyncio.sleep(5)
