"""deadlines.aiohttp: every phase bounded against real misbehaving servers on loopback."""

from __future__ import annotations

import asyncio
import collections
import gc
import time
from collections.abc import Callable

import aiohttp
import pytest
from outbound_helpers import LATE, fds_back, fired_at, open_fds, peer_closed, server_idle

import deadlines
import deadlines.aiohttp as daiohttp
from deadlines import (
    BudgetExhausted,
    ConnectTimeout,
    DeadlineExceeded,
    Dependency,
    HeadersTimeout,
    IdleTimeout,
    PoolTimeout,
    TotalTimeout,
)
from deadlines.lab.servers import (
    BlackholeServer,
    HeaderTrickleServer,
    HealthyServer,
    ResetServer,
    Server,
    SilentServer,
    SlowServer,
    TLSNeverServer,
    TrickleServer,
)

pytestmark = [pytest.mark.realtime, pytest.mark.anyio]

DEP = Dependency("t", connect=0.3, headers=0.4, idle=0.3, total=0.8, pool_size=2, pool_wait=0.2)

CASES: dict[str, tuple[Callable[[], Server], type[Exception], str, float, bool]] = {
    "slow": (lambda: SlowServer(3.0), HeadersTimeout, "headers", 0.4, True),
    "silent": (SilentServer, HeadersTimeout, "headers", 0.4, True),
    "header-trickle": (lambda: HeaderTrickleServer(0.05), HeadersTimeout, "headers", 0.4, True),
    "trickle": (lambda: TrickleServer(0.05), TotalTimeout, "body", 0.8, True),
    "trickle-idle": (lambda: TrickleServer(2.0), IdleTimeout, "body", 0.3, True),
    "tls-never": (TLSNeverServer, ConnectTimeout, "connect", 0.3, False),
    "blackhole": (BlackholeServer, ConnectTimeout, "connect", 0.3, False),
}


@pytest.mark.parametrize("name", list(CASES))
async def test_each_server_fails_in_its_phase_and_closes(name: str) -> None:
    """Each misbehaving server gives its error, in its phase, at its limit; no socket leaks."""
    make, error, phase, limit, sent = CASES[name]
    with make() as server:
        baseline = open_fds()
        async with daiohttp.session(DEP, ssl=False) as http:
            start = time.monotonic()
            with pytest.raises(error) as caught:
                async with http.get(server.url) as response:
                    await response.read()
            assert fired_at(time.monotonic() - start, limit)
            assert caught.value.phase == phase
            assert caught.value.request_sent is sent
            if not isinstance(server, BlackholeServer):
                assert await peer_closed(server), "the client did not close its socket"
            assert await server_idle(server)
            assert await fds_back(baseline) == baseline  # closed while the session is open


async def test_reset_mid_body_is_aiohttp_payload_error() -> None:
    """A reset mid-body is aiohttp's own error, not a timeout; nothing leaks."""
    with ResetServer(sent=10, length=1000) as server:
        baseline = open_fds()
        async with daiohttp.session(DEP) as http:
            with pytest.raises(aiohttp.ClientPayloadError):
                async with http.get(server.url) as response:
                    await response.read()
            assert await fds_back(baseline) == baseline


async def test_streamed_body_is_bounded_by_the_total() -> None:
    """iter_chunked over a trickle: the total covers the body, chunk by chunk."""
    with TrickleServer(0.05) as server:
        async with daiohttp.session(DEP) as http:
            start = time.monotonic()
            received = 0
            with pytest.raises(TotalTimeout):
                async with http.get(server.url) as response:
                    async for chunk in response.content.iter_chunked(1024):
                        received += len(chunk)
            assert fired_at(time.monotonic() - start, 0.8)
            assert received > 3
            assert await peer_closed(server)


async def test_healthy_call_reports_pool_wait_and_sends_the_header() -> None:
    """A good call works, reports no pool wait, and tells the server the time left."""
    with HealthyServer(body=b"hello") as server:
        async with daiohttp.session(DEP) as http:
            for _ in range(2):
                async with deadlines.scope(0.5), http.get(server.url) as response:
                    assert await response.text() == "hello"
                    assert response.pool_wait == 0.0
            sent = int(server.requests[-1].headers["x-request-timeout-ms"])
            assert 300 < sent <= 500
        assert server.opened == 1  # keep-alive: one connection for both


async def test_budget_exhausted_sends_nothing() -> None:
    """Below min_useful the call fails at once; the server sees nothing."""
    dep = Dependency("t", min_useful=0.5)
    with HealthyServer() as server:
        async with daiohttp.session(dep) as http, deadlines.scope(0.3):
            with pytest.raises(BudgetExhausted):
                await http.get(server.url)
        assert server.opened == 0


async def test_pool_exhaustion_by_hung_calls_is_pool_timeout() -> None:
    """Hung calls fill the dependency's pool; the next waits pool_wait, then PoolTimeout."""
    dep = Dependency("t", headers=5, total=5, pool_size=2, pool_wait=0.3)
    with SilentServer() as server:
        async with daiohttp.session(dep) as http:

            async def get() -> None:
                await http.get(server.url)

            hung = [asyncio.create_task(get()) for _ in range(2)]
            assert await asyncio.to_thread(server.wait_requests, 2)
            start = time.monotonic()
            with pytest.raises(PoolTimeout) as caught:
                await http.get(server.url)
            assert fired_at(time.monotonic() - start, 0.3)
            assert caught.value.pool_wait == pytest.approx(0.3, abs=0.2)
            assert caught.value.request_sent is False
            assert server.opened == 2
            for task in hung:
                task.cancel()
            await asyncio.gather(*hung, return_exceptions=True)


async def test_time_in_the_pool_counts_toward_the_total() -> None:
    """Pool wait plus server time never exceed the total."""
    dep = Dependency("t", headers=5, total=0.8, pool_size=1, pool_wait=5)
    with SlowServer(0.5) as server:
        async with daiohttp.session(dep) as http:

            async def hold() -> None:
                async with http.get(server.url) as response:
                    await response.read()

            holder = asyncio.create_task(hold())
            assert await asyncio.to_thread(server.wait_requests, 1)
            start = time.monotonic()
            with pytest.raises(TotalTimeout) as caught:
                await http.get(server.url)
            assert fired_at(time.monotonic() - start, 0.8)
            assert caught.value.pool_wait is not None
            assert caught.value.pool_wait > 0.3
            await holder


async def test_deadline_binding_is_deadline_exceeded_and_closes() -> None:
    """A request deadline shorter than the caps ends the call at its instant."""
    dep = Dependency("t", headers=5, total=5)
    with SilentServer() as server:
        async with daiohttp.session(dep) as http:
            start = time.monotonic()
            with pytest.raises(DeadlineExceeded):
                async with deadlines.scope(0.3):
                    await http.get(server.url)
            assert fired_at(time.monotonic() - start, 0.3)
            assert await peer_closed(server)


async def test_limits_above_five_seconds_are_not_rounded() -> None:
    """aiohttp rounds timers over 5 s up to a whole second; these fire on time."""
    dep = Dependency("t", headers=10, total=10)
    with SilentServer() as server:
        async with daiohttp.session(dep) as http:
            loop = asyncio.get_running_loop()
            # Start just after a whole second of loop time: rounding would add ~0.9 s.
            await asyncio.sleep(1.05 - loop.time() % 1.0)
            start = time.monotonic()
            with pytest.raises(DeadlineExceeded):
                async with deadlines.scope(5.1):
                    await http.get(server.url)
            assert 5.09 <= time.monotonic() - start < 5.4


SLOW_CAPS = Dependency("t", connect=5, headers=5, idle=5, total=5, pool_size=1, pool_wait=5)


@pytest.mark.parametrize(
    "make",
    [TLSNeverServer, SilentServer, lambda: TrickleServer(0.05)],
    ids=["tls-handshake", "headers", "body"],
)
async def test_cancel_closes_the_socket_at_once(make: Callable[[], Server]) -> None:
    """A caller that leaves closes the connection now, seen server-side, TLS included."""
    with make() as server:
        baseline = open_fds()
        async with daiohttp.session(SLOW_CAPS, ssl=False) as http:

            async def call() -> None:
                async with http.get(server.url) as response:
                    async for _ in response.content.iter_any():
                        pass

            task = asyncio.create_task(call())
            await asyncio.sleep(0.3)
            cancelled_at = time.monotonic()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert await peer_closed(server, timeout=1.0)
            assert server.close_times[0] - cancelled_at < LATE  # at once, not at GC
            assert await fds_back(baseline) == baseline


async def test_the_session_is_aiohttps_own_with_its_options() -> None:
    """A plain aiohttp.ClientSession: connector options are taken, aiohttp's timeout too."""
    with SilentServer() as server:
        async with daiohttp.session(DEP, ssl=False, use_dns_cache=False) as http:
            assert type(http) is aiohttp.ClientSession
            assert isinstance(http.connector, aiohttp.TCPConnector)
            assert http.connector.limit == DEP.pool_size
            start = time.monotonic()
            with pytest.raises(aiohttp.ServerTimeoutError):  # aiohttp's own, shorter
                async with http.get(server.url, timeout=aiohttp.ClientTimeout(sock_read=0.1)):
                    pass
            assert time.monotonic() - start < DEP.headers
    with pytest.raises(TypeError, match="deadlines.Dependency"):
        daiohttp.session("pricing")  # type: ignore[arg-type]


async def test_a_call_leaves_no_cyclic_garbage() -> None:
    """Calls free everything by reference counting: nothing per call for the cyclic GC.

    A response holding its body wrapper, which holds the response, once made every call
    garbage that only a collection could free, and under load those collections cost
    more than the rest of the call's bookkeeping.
    """
    with HealthyServer() as server:
        async with daiohttp.session(Dependency("t")) as http, deadlines.scope(30):
            for _ in range(5):  # warm: the pooled connection and first-use caches
                async with http.get(server.url) as response:
                    await response.read()
            gc.collect()
            gc.disable()
            try:
                for _ in range(25):
                    async with http.get(server.url) as response:
                        assert await response.read()
                for _ in range(25):  # awaited, never released: closed at the body's end
                    response = await http.get(server.url)
                    assert await response.content.read()
                gc.set_debug(gc.DEBUG_SAVEALL)  # keep what it finds, to name it below
                found = gc.collect()
            finally:
                gc.set_debug(0)
                gc.enable()
    kinds = collections.Counter(type(thing).__qualname__ for thing in gc.garbage)
    gc.garbage.clear()
    assert found == 0, f"cyclic garbage found: {kinds.most_common(8)}"
