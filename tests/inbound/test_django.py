"""deadlines.django: the middleware under Django's test clients, uvicorn (ASGI) and waitress (WSGI).

One Django project for the module (settings are per process): sync and async views
that report what they saw, under ``deadlines.django.DeadlineMiddleware``.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator

import django
import httpx
import pytest
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.urls import path

import deadlines
from deadlines.django import Limits

from .conftest import Events, serve_uvicorn, serve_waitress

SLOW = 0.3  # the /slow/* routes' budget, seconds


class Seen:
    """What the views saw, for the tests to read (views run in server threads)."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.cancelled = threading.Event()
        self.holding = threading.Event()


seen = Seen()


def left(request: HttpRequest) -> JsonResponse:
    """Sync view: the time left, as the view sees it."""
    seen.calls.append("left")
    return JsonResponse({"left": deadlines.remaining()})


async def aleft(request: HttpRequest) -> JsonResponse:
    """Async view: the time left."""
    seen.calls.append("aleft")
    return JsonResponse({"left": deadlines.remaining()})


def overrun(request: HttpRequest) -> HttpResponse:
    """Sync view that works past its deadline, then checks it (sync code can't be cut)."""
    time.sleep(SLOW + 0.1)
    deadlines.check()
    return HttpResponse("too late")


async def ahang(request: HttpRequest) -> HttpResponse:
    """Async view that never answers by itself."""
    await asyncio.sleep(30)
    return HttpResponse("never")


async def ahold(request: HttpRequest) -> HttpResponse:
    """Async view that waits until it is cancelled (the caller leaving)."""
    seen.holding.set()
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        seen.cancelled.set()
        raise
    return HttpResponse("never")


def failing(request: HttpRequest) -> HttpResponse:
    """A sync view answering 500."""
    return HttpResponse("broken", status=500)


def stream(request: HttpRequest) -> StreamingHttpResponse:
    """A streamed body, whose chunks see the request's deadline."""

    def chunks() -> Iterator[bytes]:
        for _ in range(3):
            yield f"{deadlines.remaining():.3f}\n".encode()

    return StreamingHttpResponse(chunks())


urlpatterns = [
    path("left", left),
    path("aleft", aleft),
    path("slow/overrun", overrun),
    path("slow/ahang", ahang),
    path("ahold", ahold),
    path("failing", failing),
    path("stream", stream),
]

if not settings.configured:
    settings.configure(
        DEBUG=False,
        ALLOWED_HOSTS=["*"],
        ROOT_URLCONF=__name__,
        SECRET_KEY="deadlines-tests",
        INSTALLED_APPS=[],
        MIDDLEWARE=["deadlines.django.DeadlineMiddleware"],
        DEADLINES={
            "default": 2.0,
            "maximum": 5.0,
            "reserve": 0.0,
            "routes": {"/slow/*": Limits(default=SLOW, maximum=SLOW)},
        },
        LOGGING_CONFIG=None,  # a view's 500 is not printed to the test's stderr
    )
    django.setup()

from django.core.asgi import get_asgi_application  # noqa: E402
from django.core.wsgi import get_wsgi_application  # noqa: E402
from django.test import AsyncClient, Client  # noqa: E402


def budget_of(response: HttpResponse) -> float:
    """The time left a view reported."""
    return float(json.loads(response.content)["left"])


def test_sync_view_runs_inside_the_callers_budget(events: Events) -> None:
    """The caller's header, capped at the maximum, is the sync view's deadline."""
    client = Client()
    assert 1.3 < budget_of(client.get("/left", headers={"x-request-timeout-ms": "1450"})) <= 1.45
    assert 4.5 < budget_of(client.get("/left", headers={"x-request-timeout-ms": "99000"})) <= 5.0
    assert 1.8 < budget_of(client.get("/left", headers={"grpc-timeout": "garbage"})) <= 2.0
    assert [(e.route, e.outcome) for e in events.finished()] == [("*", "ok")] * 3


@pytest.mark.anyio
async def test_async_view_runs_inside_the_callers_budget(events: Events) -> None:
    """Under Django's async client an async view sees the same deadline."""
    response = await AsyncClient().get("/aleft", headers={"x-request-timeout-ms": "800"})
    assert 0.6 < budget_of(response) <= 0.8
    assert [e.outcome for e in events.finished()] == ["ok"]


def test_sync_view_past_its_deadline_is_a_504_naming_the_limit(events: Events) -> None:
    """`deadlines.check()` after the route's budget: the JSON 504, not Django's 500."""
    response = Client().get("/slow/overrun")
    assert response.status_code == 504
    assert response["Content-Type"] == "application/json"
    body = json.loads(response.content)
    assert body["limit"] == "route default"
    assert body["budget_ms"] == round(SLOW * 1000)
    assert [(e.route, e.outcome) for e in events.finished()] == [("/slow/*", "deadline")]


@pytest.mark.anyio
@pytest.mark.realtime
async def test_async_view_is_cancelled_at_its_deadline(events: Events) -> None:
    """An async view that hangs is cut at the deadline and answered 504 on time."""
    start = time.monotonic()
    response = await AsyncClient().get("/slow/ahang")
    took = time.monotonic() - start
    assert response.status_code == 504
    assert SLOW - 0.01 <= took < SLOW + 1.0
    assert [e.outcome for e in events.finished()] == ["deadline"]


def test_expired_on_arrival_never_runs_the_view(events: Events) -> None:
    """A header of 0 is answered 504 at once; the view never runs."""
    before = len(seen.calls)
    response = Client().get("/left", headers={"x-request-timeout-ms": "0"})
    assert response.status_code == 504
    assert json.loads(response.content)["limit"] == "x-request-timeout-ms"
    assert len(seen.calls) == before
    assert [e.outcome for e in events.finished()] == ["budget_exhausted"]


def test_a_5xx_answer_is_an_error_and_a_stream_reports_when_it_ends(events: Events) -> None:
    """A 500 the view returns is an error; a streamed body runs under the deadline."""
    client = Client()
    assert client.get("/failing").status_code == 500
    response = client.get("/stream", headers={"x-request-timeout-ms": "1000"})
    assert [e.outcome for e in events.finished()] == ["error"]  # the stream is not read yet
    values = [float(line) for line in b"".join(response.streaming_content).split()]
    response.close()
    assert len(values) == 3 and all(0.5 < v <= 1.0 for v in values)
    assert [e.outcome for e in events.finished()] == ["error", "ok"]


def test_settings_are_checked() -> None:
    """A DEADLINES setting without default and maximum is refused with what it needs."""
    from django.test import override_settings

    from deadlines.django import DeadlineMiddleware

    with override_settings(DEADLINES={"default": 1.0}), pytest.raises(ValueError, match="max"):
        DeadlineMiddleware(lambda request: HttpResponse())


# Real servers.


@pytest.fixture(scope="module")
def asgi_url() -> Iterator[str]:
    """The project under uvicorn (ASGI)."""
    with serve_uvicorn(get_asgi_application()) as url:
        yield url


@pytest.fixture(scope="module")
def wsgi_url() -> Iterator[str]:
    """The project under waitress (WSGI)."""
    with serve_waitress(get_wsgi_application()) as url:
        yield url


@pytest.mark.realtime
def test_under_uvicorn_an_async_view_is_cut_at_its_deadline(asgi_url: str, events: Events) -> None:
    """Over real HTTP: 504 on time for a hung async view; the header reaches a view."""
    start = time.monotonic()
    response = httpx.get(f"{asgi_url}/slow/ahang", timeout=5)
    took = time.monotonic() - start
    assert response.status_code == 504
    assert SLOW - 0.01 <= took < SLOW + 1.0
    assert (
        0.3
        < httpx.get(f"{asgi_url}/aleft", headers={"x-request-timeout-ms": "500"}).json()["left"]
        <= 0.5
    )
    assert sorted(e.outcome for e in events.wait_finished(2)) == ["deadline", "ok"]


@pytest.mark.realtime
def test_under_uvicorn_the_caller_leaving_cancels_the_async_view(
    asgi_url: str, events: Events
) -> None:
    """A caller that hangs up: Django cancels the view and it is reported caller_left."""
    seen.holding.clear()
    seen.cancelled.clear()
    host, port = asgi_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"GET /ahold HTTP/1.1\r\nHost: x\r\nx-request-timeout-ms: 4000\r\n\r\n")
        assert seen.holding.wait(5)
    start = time.monotonic()
    assert seen.cancelled.wait(3), "the view was not cancelled"
    assert time.monotonic() - start < 2.0  # long before its 4 s deadline
    assert [(e.route, e.outcome) for e in events.wait_finished(1)] == [("*", "caller_left")]


@pytest.mark.realtime
def test_under_waitress_a_sync_view_past_its_deadline_is_a_504(
    wsgi_url: str, events: Events
) -> None:
    """Over real HTTP under WSGI: the header's budget, and the 504 past the deadline."""
    assert (
        0.7
        < httpx.get(f"{wsgi_url}/left", headers={"x-request-timeout-ms": "900"}).json()["left"]
        <= 0.9
    )
    response = httpx.get(f"{wsgi_url}/slow/overrun", timeout=5)
    assert response.status_code == 504
    assert response.json()["error"] == "deadline exceeded"
    assert sorted(e.outcome for e in events.wait_finished(2)) == ["deadline", "ok"]
