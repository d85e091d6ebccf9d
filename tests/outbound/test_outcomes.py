"""Every failure of every client reaches observers, and its error, with the true outcome.

For each client (httpx async and blocking, aiohttp) and each way a call fails, from
the pool to the body: the error raised says the phase, the dependency and whether the
request was sent, and the one `CallFinished` event observers (Prometheus, OTel, logs)
receive says the same outcome and phase. A failure in the body must never be counted
as a success.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from contextlib import suppress
from typing import Any

import aiohttp
import anyio
import httpx
import pytest
from outbound_helpers import UploadStallServer, finished_events

import deadlines
import deadlines.aiohttp as daiohttp
import deadlines.httpx as dhttpx
import deadlines.prometheus
from deadlines import Dependency
from deadlines.lab.servers import (
    BlackholeServer,
    ResetServer,
    Server,
    SilentServer,
    TrickleServer,
)

pytestmark = pytest.mark.realtime

DEP = Dependency("dep", connect=0.3, headers=0.3, idle=0.3, total=0.8, pool_size=1, pool_wait=0.2)

# failure: (server, the scope around the call or None, the error's type name, outcome,
#           phase, request_sent)
FAILURES: dict[str, tuple[Callable[[], Server], float | None, str, str, str, bool]] = {
    "connect": (BlackholeServer, None, "ConnectTimeout", "timeout", "connect", False),
    "headers": (SilentServer, None, "HeadersTimeout", "timeout", "headers", True),
    "idle": (lambda: TrickleServer(2.0), None, "IdleTimeout", "timeout", "body", True),
    "total": (lambda: TrickleServer(0.05), None, "TotalTimeout", "timeout", "body", True),
    "deadline-in-body": (
        lambda: TrickleServer(0.05),
        0.5,
        "DeadlineExceeded",
        "deadline",
        "body",
        True,
    ),
    "reset-in-body": (
        lambda: ResetServer(sent=10, length=1000, pause=0.1),
        None,
        "",
        "error",
        "body",
        True,
    ),
}
#: What each client raises for a reset mid-body.
RESET_ERROR = {"httpx": httpx.ReadError, "aiohttp": aiohttp.ClientPayloadError}
#: The client's own exception a timeout in each phase also is (what its users catch).
CLIENT_TIMEOUT: dict[str, dict[str, type[Exception]]] = {
    "httpx": {
        "pool": httpx.PoolTimeout,
        "connect": httpx.ConnectTimeout,
        "headers": httpx.ReadTimeout,
        "body": httpx.ReadTimeout,
    },
    "aiohttp": {
        "pool": aiohttp.ConnectionTimeoutError,
        "connect": aiohttp.ConnectionTimeoutError,
        "headers": aiohttp.SocketTimeoutError,
        "body": aiohttp.SocketTimeoutError,
    },
}


async def _httpx_async(url: str, seconds: float | None) -> None:
    async with dhttpx.AsyncClient(DEP) as client:
        if seconds is None:
            await client.get(url)
            return
        async with deadlines.scope(seconds):
            await client.get(url)


async def _aiohttp(url: str, seconds: float | None) -> None:
    async with daiohttp.session(DEP) as http:
        if seconds is None:
            async with http.get(url) as response:
                await response.read()
            return
        async with deadlines.scope(seconds), http.get(url) as response:
            await response.read()


def _httpx_sync(url: str, seconds: float | None) -> None:
    with dhttpx.Client(DEP) as client:
        if seconds is None:
            client.get(url)
            return
        with deadlines.scope(seconds):
            client.get(url)


CLIENTS: dict[str, Callable[[str, float | None], Any]] = {
    "httpx-async": _httpx_async,
    "httpx-sync": _httpx_sync,
    "aiohttp": _aiohttp,
}


def _run(client: str, url: str, seconds: float | None) -> BaseException:
    call = CLIENTS[client]
    try:
        if client == "httpx-sync":
            call(url, seconds)
        else:
            asyncio.run(call(url, seconds))
    except Exception as exc:
        return exc
    raise AssertionError("the call did not fail")


@pytest.mark.parametrize("failure", list(FAILURES))
@pytest.mark.parametrize("client", list(CLIENTS))
def test_each_failure_is_reported_with_its_outcome_and_phase(client: str, failure: str) -> None:
    """The error and the one CallFinished event agree: outcome, phase, request sent."""
    make, seconds, error_name, outcome, phase, sent = FAILURES[failure]
    with make() as server, finished_events() as events:
        error = _run(client, server.url, seconds)
    if failure == "reset-in-body":
        assert isinstance(error, RESET_ERROR[client.split("-")[0]]), repr(error)
    else:
        assert type(error).__name__ == error_name, repr(error)
        # An async scope's deadline is raised by the scope, outside the call, as
        # asyncio.timeout's is; from inside a call, an error is the client's own too.
        if seconds is None or client == "httpx-sync":
            assert isinstance(error, CLIENT_TIMEOUT[client.split("-")[0]][phase])
            if client.startswith("httpx"):
                assert error.request.url == httpx.URL(server.url)  # type: ignore[attr-defined]
        assert error.phase == phase  # type: ignore[attr-defined]
        assert error.dependency == "dep"  # type: ignore[attr-defined]
        assert error.request_sent is sent  # type: ignore[attr-defined]
    assert len(events) == 1, events
    event = events[0]
    assert (event.outcome, event.phase, event.request_sent) == (outcome, phase, sent), event
    assert event.error is not None


@pytest.mark.anyio
async def test_the_pool_wait_is_reported_as_a_pool_timeout_by_every_async_client() -> None:
    """A full pool: PoolTimeout, phase pool, not sent, for httpx and aiohttp alike."""
    with SilentServer() as server, finished_events() as events:
        async with dhttpx.AsyncClient(DEP) as client, daiohttp.session(DEP) as http:

            async def hold_httpx() -> None:
                await client.get(server.url)

            async def hold_aiohttp() -> None:
                async with http.get(server.url) as response:
                    await response.read()

            errors = []
            for hold, second in ((hold_httpx, hold_httpx), (hold_aiohttp, hold_aiohttp)):
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(_swallow, hold)
                    await anyio.sleep(0.05)
                    try:
                        await second()
                    except deadlines.PoolTimeout as exc:
                        errors.append(exc)
                    tasks.cancel_scope.cancel()
    assert [(e.phase, e.request_sent, e.dependency) for e in errors] == [("pool", False, "dep")] * 2
    assert isinstance(errors[0], httpx.PoolTimeout)
    assert isinstance(errors[1], aiohttp.ConnectionTimeoutError)
    pool = [(e.outcome, e.phase, e.request_sent) for e in events if e.phase == "pool"]
    assert pool == [("timeout", "pool", False)] * 2


async def _swallow(call: Callable[[], Any]) -> None:
    with suppress(Exception):
        await call()


def test_the_blocking_pool_wait_is_a_pool_timeout() -> None:
    """Blocking: a thread finds the pool of one held by another; PoolTimeout, not sent."""
    with SilentServer() as server, finished_events() as events, dhttpx.Client(DEP) as client:
        holder = threading.Thread(target=lambda: _ignore(lambda: client.get(server.url)))
        holder.start()
        assert server.wait_requests(1)
        with pytest.raises(deadlines.PoolTimeout) as caught:
            client.get(server.url)
        holder.join()
    assert (caught.value.phase, caught.value.request_sent) == ("pool", False)
    assert isinstance(caught.value, httpx.PoolTimeout)
    assert ("timeout", "pool", False) in [(e.outcome, e.phase, e.request_sent) for e in events]


def _ignore(call: Callable[[], Any]) -> None:
    with suppress(Exception):
        call()


@pytest.mark.parametrize("client", list(CLIENTS))
def test_prometheus_counts_a_body_timeout_as_a_timeout_in_the_body(client: str) -> None:
    """Scraped: an idle timeout mid-body is a timeout in phase body, never an ok call."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    registry = CollectorRegistry()
    with deadlines.prometheus.install(registry), TrickleServer(2.0) as server:
        _run(client, server.url, None)
        scraped = generate_latest(registry).decode()
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(scraped)
        for sample in family.samples
    }
    dep = ("dependency", "dep")
    assert samples[("deadlines_outbound_timeouts_total", (dep, ("phase", "body")))] == 1
    assert samples[("deadlines_outbound_calls_total", (dep, ("outcome", "timeout")))] == 1
    assert ("deadlines_outbound_calls_total", (dep, ("outcome", "ok"))) not in samples


@pytest.mark.parametrize("client", ["httpx-async", "httpx-sync"])
def test_an_upload_the_server_never_reads_is_a_write_timeout(client: str) -> None:
    """The headers window ends mid-upload: HeadersTimeout, and httpx's WriteTimeout."""
    body = b"x" * (16 << 20)

    async def upload_async(url: str) -> None:
        async with dhttpx.AsyncClient(DEP) as http:
            await http.post(url, content=body)

    def upload_sync(url: str) -> None:
        with dhttpx.Client(DEP) as http:
            http.post(url, content=body)

    with UploadStallServer() as server, pytest.raises(deadlines.HeadersTimeout) as caught:
        if client == "httpx-sync":
            upload_sync(server.url)
        else:
            asyncio.run(upload_async(server.url))
    assert isinstance(caught.value, httpx.WriteTimeout)
    assert caught.value.request_sent is True
