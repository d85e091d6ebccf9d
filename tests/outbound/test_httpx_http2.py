"""deadlines.httpx over HTTP/2: a real Hypercorn server on loopback, TLS with ALPN h2.

On HTTP/2 the requests to one origin are streams of one connection. Each must keep its
own limits: one stream's timeout must neither fail the others nor break the connection,
and the server must hear (RST_STREAM) that the stream was given up.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import anyio
import httpx
import pytest
from http2_server import H2Server
from outbound_helpers import LATE, eventually, fds_back, fired_at, open_fds

import deadlines
import deadlines.httpx as dhttpx
from deadlines import (
    DeadlineExceeded,
    Dependency,
    HeadersTimeout,
    IdleTimeout,
    TotalTimeout,
)

pytestmark = pytest.mark.realtime

DEP = Dependency("h2", connect=1.0, headers=0.4, idle=0.3, total=1.2, pool_size=10)
# For several streams at once: limits far from the answers that must arrive in time.
MUX = Dependency("h2", connect=1.0, headers=1.0, idle=0.5, total=2.0, pool_size=10)


@pytest.fixture
def server() -> Iterator[H2Server]:
    """Hypercorn over TLS (ALPN h2), stopped after the test."""
    with H2Server() as running:
        yield running


def _client(server: H2Server, dep: Dependency = DEP) -> dhttpx.AsyncClient:
    return dhttpx.AsyncClient(dep, http2=True, verify=server.ssl_context())


def _one_connection(server: H2Server) -> bool:
    """Whether every request the server saw came over one connection, as HTTP/2."""
    return len({seen.client_port for seen in server.requests}) == 1 and {
        seen.http_version for seen in server.requests
    } == {"2"}


@pytest.mark.anyio
async def test_get_is_http2_and_carries_the_time_left(server: H2Server) -> None:
    """A GET goes over HTTP/2 and the server receives the time left, under the deadline."""
    async with _client(server) as client:
        response = await client.get(server.url("/ok"))
        assert response.http_version == "HTTP/2"
        assert response.text == "ok"
        assert 1000 < int(server.requests[-1].headers["x-request-timeout-ms"]) <= 1200
        async with deadlines.scope(0.5):
            await client.get(server.url("/ok"))
        assert 300 < int(server.requests[-1].headers["x-request-timeout-ms"]) <= 500
    assert _one_connection(server)


@pytest.mark.anyio
async def test_silent_stream_is_headers_timeout_and_the_connection_lives_on(
    server: H2Server,
) -> None:
    """No answer: HeadersTimeout at headers; the stream is reset, the connection reused."""
    async with _client(server) as client:
        await client.get(server.url("/ok"))
        start = time.monotonic()
        with pytest.raises(HeadersTimeout) as caught:
            await client.get(server.url("/silent"))
        assert fired_at(time.monotonic() - start, 0.4)
        assert caught.value.phase == "headers"
        assert caught.value.request_sent is True
        assert await eventually(lambda: server.disconnects == 1), "no RST_STREAM reached it"
        response = await client.get(server.url("/ok"))
        assert response.text == "ok"
    assert _one_connection(server)


@pytest.mark.anyio
async def test_a_tighter_deadline_is_deadline_exceeded(server: H2Server) -> None:
    """Under a scope tighter than headers, the deadline ends the stream: DeadlineExceeded."""
    async with _client(server) as client:
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded) as caught:
            async with deadlines.scope(0.25):
                await client.get(server.url("/silent"))
        assert fired_at(time.monotonic() - start, 0.25)
        assert caught.value.phase == "headers"
        assert await eventually(lambda: server.disconnects == 1)
        assert (await client.get(server.url("/ok"))).status_code == 200
    assert _one_connection(server)


@pytest.mark.anyio
async def test_stalled_body_is_idle_timeout_and_trickle_is_total_timeout(
    server: H2Server,
) -> None:
    """Head then silence: IdleTimeout at idle; a body that trickles: TotalTimeout at total."""
    async with _client(server) as client:
        start = time.monotonic()
        with pytest.raises(IdleTimeout) as idle:
            await client.get(server.url("/stall"))
        assert fired_at(time.monotonic() - start, 0.3)
        assert idle.value.phase == "body"

        start = time.monotonic()
        received = 0
        with pytest.raises(TotalTimeout) as total:
            async with client.stream("GET", server.url("/trickle?interval=0.05")) as response:
                async for chunk in response.aiter_bytes():
                    received += len(chunk)
        assert fired_at(time.monotonic() - start, 1.2)
        assert total.value.phase == "body"
        assert received > 5
        assert await eventually(lambda: server.disconnects == 2)
        assert (await client.get(server.url("/ok"))).text == "ok"
    assert _one_connection(server)


@pytest.mark.anyio
async def test_streams_on_one_connection_keep_their_own_limits(server: H2Server) -> None:
    """Two streams time out, each at its own limit; the others on the connection finish."""
    outcomes: dict[str, tuple[object, float]] = {}
    async with _client(server, MUX) as client:
        await client.get(server.url("/ok"))  # the connection is up: all below share it
        start = time.monotonic()

        async def call(name: str, path: str, deadline: float = 60) -> None:
            try:
                async with deadlines.scope(deadline):
                    response = await client.get(server.url(path))
                outcomes[name] = (response.content, time.monotonic() - start)
            except Exception as exc:  # recorded, asserted below
                outcomes[name] = (type(exc), time.monotonic() - start)

        async with anyio.create_task_group() as group:
            group.start_soon(call, "silent", "/silent", 0.2)
            group.start_soon(call, "stall", "/stall")
            group.start_soon(call, "slow", "/slow?delay=0.5")
            group.start_soon(call, "trickle", "/trickle?interval=0.05&count=16")
            for i in range(3):
                group.start_soon(call, f"ok{i}", "/ok")

    silent, stall = outcomes.pop("silent"), outcomes.pop("stall")
    assert silent[0] is DeadlineExceeded and fired_at(silent[1], 0.2), silent
    assert issubclass(stall[0], IdleTimeout) and fired_at(stall[1], 0.5), stall  # type: ignore[arg-type]
    assert issubclass(stall[0], httpx.ReadTimeout), stall  # type: ignore[arg-type]
    slow, trickle = outcomes.pop("slow"), outcomes.pop("trickle")
    assert slow[0] == b"slow" and fired_at(slow[1], 0.5), slow
    assert trickle[0] == b"x" * 16 and fired_at(trickle[1], 0.8), trickle
    assert all(content == b"ok" for content, _ in outcomes.values()), outcomes
    assert _one_connection(server)  # 8 requests, one connection
    assert await eventually(lambda: server.disconnects == 2)


@pytest.mark.anyio
async def test_given_up_streams_do_not_use_up_the_connection() -> None:
    """More timeouts than the server allows concurrent streams: the next call still works.

    httpcore alone counts a stream it gave up as still open; here each is reset, so the
    connection does not run out of streams ("Max outbound streams is 3, 3 open").
    """
    dep = Dependency("h2", headers=0.05, total=1.0)
    with H2Server(max_streams=3) as server:
        async with _client(server, dep) as client:
            await client.get(server.url("/ok"))
            for _ in range(5):
                with pytest.raises(HeadersTimeout):
                    await client.get(server.url("/silent"))
            assert (await client.get(server.url("/ok"))).text == "ok"
        assert _one_connection(server)
        assert await eventually(lambda: server.disconnects == 5)


@pytest.mark.anyio
async def test_caller_leaving_resets_the_stream_and_nothing_leaks(server: H2Server) -> None:
    """A cancelled call resets its stream at once; closing the client frees every socket."""
    baseline = open_fds()
    async with _client(server, Dependency("h2", headers=5, total=5)) as client:
        await client.get(server.url("/ok"))
        with anyio.move_on_after(0.2):
            await client.get(server.url("/silent"))
        left = time.monotonic()
        assert await eventually(lambda: server.disconnects == 1)
        assert time.monotonic() - left < LATE
        assert (await client.get(server.url("/ok"))).text == "ok"
    assert _one_connection(server)
    assert await fds_back(baseline) == baseline


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_trio_streams_keep_their_own_limits(server: H2Server, anyio_backend: str) -> None:
    """Under trio too: a stream's deadline ends it, and a later answer on the connection arrives."""
    results: dict[str, object] = {}
    async with _client(server, MUX) as client:
        await client.get(server.url("/ok"))
        start = time.monotonic()

        async def silent() -> None:
            with pytest.raises(DeadlineExceeded):
                async with deadlines.scope(0.15):
                    await client.get(server.url("/silent"))
            results["silent"] = time.monotonic() - start

        async def slow() -> None:
            results["slow"] = (await client.get(server.url("/slow?delay=0.3"))).text

        async with anyio.create_task_group() as group:
            group.start_soon(silent)
            group.start_soon(slow)
        assert await eventually(lambda: server.disconnects == 1)
    assert fired_at(results["silent"], 0.15)  # type: ignore[arg-type]
    assert results["slow"] == "slow"
    assert _one_connection(server)


def _wait(condition: Callable[[], bool], timeout: float = 2.0) -> bool:
    end = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= end:
            return False
        time.sleep(0.005)
    return True


def test_sync_limits_end_the_stream_not_the_connection(server: H2Server) -> None:
    """Blocking client: headers, idle and deadline each end their stream, not the connection."""
    with dhttpx.Client(DEP, http2=True, verify=server.ssl_context()) as client:
        assert client.get(server.url("/ok")).http_version == "HTTP/2"

        start = time.monotonic()
        with pytest.raises(HeadersTimeout):
            client.get(server.url("/silent"))
        assert fired_at(time.monotonic() - start, 0.4)
        assert _wait(lambda: server.disconnects == 1), "no RST_STREAM reached the server"

        start = time.monotonic()
        with pytest.raises(IdleTimeout):
            client.get(server.url("/stall"))
        assert fired_at(time.monotonic() - start, 0.3)
        assert _wait(lambda: server.disconnects == 2)

        start = time.monotonic()
        with pytest.raises(DeadlineExceeded) as caught, deadlines.scope(0.2):
            client.get(server.url("/silent"))
        assert fired_at(time.monotonic() - start, 0.2)
        assert caught.value.phase == "headers"
        assert _wait(lambda: server.disconnects == 3)

        assert client.get(server.url("/ok")).text == "ok"
    assert _one_connection(server)


@pytest.mark.anyio
async def test_cleartext_http2_prior_knowledge() -> None:
    """http1=False on http://: HTTP/2 from the first byte, with the same per-stream limits."""
    with H2Server(tls=False) as server:
        async with dhttpx.AsyncClient(DEP, http1=False, http2=True) as client:
            assert (await client.get(server.url("/ok"))).http_version == "HTTP/2"
            with pytest.raises(HeadersTimeout):
                await client.get(server.url("/silent"))
            assert (await client.get(server.url("/ok"))).text == "ok"
        assert _one_connection(server)
        assert await eventually(lambda: server.disconnects == 1)
