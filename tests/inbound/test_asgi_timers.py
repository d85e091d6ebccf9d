"""The request's deadline is armed only for requests still running after `watch_after`.

Most requests end long before their deadline; the middleware enters the deadline at once
(handlers see it) but leaves arming its timer to the sweeper that starts the caller-left
watcher, so a request that ends sooner never touches a timer. A deadline that could pass
before the sweeper comes round is armed at once. Served by uvicorn in a thread of this
process, so the handlers can look at their loop's deadline timers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

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
    """Deadline timers armed on the running loop."""
    return _alarms._clock_for(asyncio.get_running_loop())._live


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
