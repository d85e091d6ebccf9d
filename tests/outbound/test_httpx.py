"""deadlines.httpx: every phase bounded against real misbehaving servers on loopback."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable

import anyio
import httpx
import pytest
from outbound_helpers import (
    LATE,
    fds_back,
    fds_settle,
    fired_at,
    open_fds,
    peer_closed,
    server_idle,
)

import deadlines
import deadlines.httpx as dhttpx
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

pytestmark = pytest.mark.realtime

DEP = Dependency("t", connect=0.3, headers=0.4, idle=0.3, total=0.8, pool_size=2, pool_wait=0.2)

# server factory, expected error, phase, the limit (s) it must fire at, request sent
CASES: dict[str, tuple[Callable[[], Server], type[Exception], str, float, bool]] = {
    "slow": (lambda: SlowServer(3.0), HeadersTimeout, "headers", 0.4, True),
    "silent": (SilentServer, HeadersTimeout, "headers", 0.4, True),
    "header-trickle": (lambda: HeaderTrickleServer(0.05), HeadersTimeout, "headers", 0.4, True),
    "trickle": (lambda: TrickleServer(0.05), TotalTimeout, "body", 0.8, True),
    "trickle-idle": (lambda: TrickleServer(2.0), IdleTimeout, "body", 0.3, True),
    "tls-never": (TLSNeverServer, ConnectTimeout, "connect", 0.3, False),
    "blackhole": (BlackholeServer, ConnectTimeout, "connect", 0.3, False),
}


@pytest.mark.anyio
@pytest.mark.parametrize("name", list(CASES))
async def test_async_each_server_fails_in_its_phase_and_closes(name: str) -> None:
    """Each misbehaving server gives its error, in its phase, at its limit; no socket leaks."""
    make, error, phase, limit, sent = CASES[name]
    with make() as server:
        baseline = open_fds()
        async with dhttpx.AsyncClient(DEP, verify=False) as client:
            start = time.monotonic()
            with pytest.raises(error) as caught:
                await client.get(server.url)
            elapsed = time.monotonic() - start
            assert fired_at(elapsed, limit), elapsed
            assert caught.value.phase == phase
            assert caught.value.request_sent is sent
            assert caught.value.retry_safe is (not sent)
            assert caught.value.dependency == "t"
            if server.scheme == "https" or not isinstance(server, BlackholeServer):
                assert await peer_closed(server), "the client did not close its socket"
            assert await server_idle(server)
            assert await fds_back(baseline) == baseline  # closed while the client is still open


@pytest.mark.parametrize("name", ["slow", "silent", "trickle", "trickle-idle", "blackhole"])
def test_sync_each_server_fails_in_its_phase_and_closes(name: str) -> None:
    """The blocking client gives the same errors, phases and timings."""
    make, error, phase, limit, sent = CASES[name]
    with make() as server:
        baseline = open_fds()
        with dhttpx.Client(DEP) as client:
            start = time.monotonic()
            with pytest.raises(error) as caught:
                client.get(server.url)
            assert fired_at(time.monotonic() - start, limit)
            assert caught.value.phase == phase
            assert caught.value.request_sent is sent
            assert server.wait_idle()
            assert fds_settle(baseline) == baseline


@pytest.mark.anyio
async def test_reset_mid_body_is_httpx_read_error() -> None:
    """A reset mid-body is a network error (httpx.ReadError), not a timeout; nothing leaks."""
    with ResetServer(sent=10, length=1000) as server:
        baseline = open_fds()
        async with dhttpx.AsyncClient(DEP) as client:
            with pytest.raises(httpx.ReadError):
                await client.get(server.url)
            assert await fds_back(baseline) == baseline


@pytest.mark.anyio
async def test_healthy_call_reports_pool_wait_and_keeps_the_connection() -> None:
    """A good call works, says it did not wait for the pool, and reuses its connection."""
    with HealthyServer(body=b"hello") as server:
        async with dhttpx.AsyncClient(DEP) as client:
            for _ in range(3):
                response = await client.get(server.url)
                assert response.text == "hello"
                assert response.extensions[dhttpx.POOL_WAIT] == 0.0
        assert server.opened == 1


@pytest.mark.anyio
async def test_header_carries_the_time_left_to_a_real_server() -> None:
    """x-request-timeout-ms is the time left in whole ms, under the deadline and the total."""
    with HealthyServer() as server:
        async with dhttpx.AsyncClient(DEP) as client:
            await client.get(server.url)
            assert 700 < int(server.requests[-1].headers["x-request-timeout-ms"]) <= 800
            async with deadlines.scope(0.5):
                await client.get(server.url)
            assert 300 < int(server.requests[-1].headers["x-request-timeout-ms"]) <= 500


@pytest.mark.anyio
async def test_header_is_computed_after_the_pool_wait() -> None:
    """Time spent waiting for a pooled connection is not promised to the next hop."""
    dep = Dependency("t", total=5, pool_size=1, pool_wait=2)
    with HealthyServer() as server:
        async with dhttpx.AsyncClient(dep) as client:
            async with client.stream("GET", server.url) as held:

                async def second() -> httpx.Response:
                    return await client.get(server.url)

                async with anyio.create_task_group() as group:
                    group.start_soon(second)
                    await anyio.sleep(0.3)
                    await held.aclose()
            sent = int(server.requests[-1].headers["x-request-timeout-ms"])
            assert sent <= 5000 - 300


@pytest.mark.anyio
async def test_budget_exhausted_sends_nothing() -> None:
    """Below min_useful the call fails at once with BudgetExhausted; no connection opened."""
    dep = Dependency("t", min_useful=0.5)
    with HealthyServer() as server:
        async with dhttpx.AsyncClient(dep) as client, deadlines.scope(0.3):
            start = time.monotonic()
            with pytest.raises(BudgetExhausted) as caught:
                await client.get(server.url)
            assert time.monotonic() - start < 0.05
            assert caught.value.request_sent is False
        assert server.opened == 0


def test_sync_request_deadline_binding_is_deadline_exceeded_with_phase() -> None:
    """When the request's deadline is the binding limit the error is DeadlineExceeded."""
    dep = Dependency("t", headers=5, total=5)
    with SilentServer() as server, dhttpx.Client(dep) as client, deadlines.scope(0.3):
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded) as caught:
            client.get(server.url)
        assert fired_at(time.monotonic() - start, 0.3)
        assert caught.value.phase == "headers"
        assert caught.value.request_sent is True


@pytest.mark.anyio
async def test_async_request_deadline_binding_is_deadline_exceeded() -> None:
    """Under an async scope the deadline ends the call at its instant, socket closed."""
    dep = Dependency("t", headers=5, total=5)
    with SilentServer() as server:
        async with dhttpx.AsyncClient(dep) as client:
            start = time.monotonic()
            with pytest.raises(DeadlineExceeded):
                async with deadlines.scope(0.3):
                    await client.get(server.url)
            assert fired_at(time.monotonic() - start, 0.3)
            assert await peer_closed(server)


@pytest.mark.anyio
async def test_streamed_body_is_bounded_by_the_total() -> None:
    """client.stream + aiter_bytes: the total covers the body of a streamed response."""
    with TrickleServer(0.05) as server:
        baseline = open_fds()
        async with dhttpx.AsyncClient(DEP) as client:
            start = time.monotonic()
            received = 0
            with pytest.raises(TotalTimeout) as caught:
                async with client.stream("GET", server.url) as response:
                    async for chunk in response.aiter_bytes():
                        received += len(chunk)
            assert fired_at(time.monotonic() - start, 0.8)
            assert received > 3
            assert caught.value.phase == "body"
            assert await peer_closed(server)
            assert await fds_back(baseline) == baseline


@pytest.mark.anyio
async def test_pool_exhaustion_by_hung_calls_is_pool_timeout() -> None:
    """Hung calls fill this dependency's pool; the next waits pool_wait, then PoolTimeout."""
    dep = Dependency("t", headers=5, total=5, pool_size=2, pool_wait=0.3)
    with SilentServer() as server:
        async with dhttpx.AsyncClient(dep) as client, anyio.create_task_group() as group:
            for _ in range(2):
                group.start_soon(client.get, server.url)
            assert await anyio.to_thread.run_sync(server.wait_requests, 2)
            start = time.monotonic()
            with pytest.raises(PoolTimeout) as caught:
                await client.get(server.url)
            assert fired_at(time.monotonic() - start, 0.3)
            assert caught.value.pool_wait == pytest.approx(0.3, abs=0.2)
            assert caught.value.request_sent is False
            assert "waiting for a pooled connection" in str(caught.value)
            assert server.opened == 2  # the pool never opened a third connection
            group.cancel_scope.cancel()


@pytest.mark.anyio
async def test_time_in_the_pool_counts_toward_the_total() -> None:
    """Pool wait plus server time never exceed the total (httpx 0.28: 5 s failed at 9.7 s)."""
    dep = Dependency("t", headers=5, total=0.8, pool_size=1, pool_wait=5)
    with SlowServer(0.5) as server:
        async with dhttpx.AsyncClient(dep) as client, anyio.create_task_group() as group:
            group.start_soon(client.get, server.url)  # holds the only connection 0.5 s
            assert await anyio.to_thread.run_sync(server.wait_requests, 1)
            start = time.monotonic()
            with pytest.raises(TotalTimeout) as caught:
                await client.get(server.url)  # 0.5 s in the pool + 0.5 s server > 0.8
            assert fired_at(time.monotonic() - start, 0.8)
            assert caught.value.phase == "headers"
            assert caught.value.pool_wait == pytest.approx(0.45, abs=0.2)


@pytest.mark.anyio
async def test_total_shorter_than_pool_wait_fires_in_the_pool() -> None:
    """A total shorter than the pool cap ends the wait in the pool as TotalTimeout."""
    dep = Dependency("t", headers=5, total=0.3, pool_size=1, pool_wait=5)
    with HealthyServer() as server:
        async with dhttpx.AsyncClient(dep) as client:
            async with client.stream("GET", server.url):  # holds the only place
                start = time.monotonic()
                with pytest.raises(TotalTimeout) as caught:
                    await client.get(server.url)
                assert fired_at(time.monotonic() - start, 0.3)
                assert caught.value.phase == "pool"
                assert caught.value.request_sent is False
            assert server.opened == 1


@pytest.mark.anyio
async def test_pool_wait_is_reported_on_the_response() -> None:
    """A call that queued for a connection reports how long, apart from server time."""
    dep = Dependency("t", pool_size=1, pool_wait=2)
    with HealthyServer() as server:
        async with dhttpx.AsyncClient(dep) as client:
            results: list[httpx.Response] = []
            async with client.stream("GET", server.url) as held:

                async def second() -> None:
                    results.append(await client.get(server.url))

                async with anyio.create_task_group() as group:
                    group.start_soon(second)
                    await anyio.sleep(0.3)
                    await held.aclose()
            assert results[0].extensions[dhttpx.POOL_WAIT] == pytest.approx(0.3, abs=0.2)


def test_sync_pool_exhaustion_by_hung_threads_is_pool_timeout() -> None:
    """The blocking client's pool is bounded too: a third thread gets PoolTimeout."""
    dep = Dependency("t", headers=0.9, total=2.0, pool_size=2, pool_wait=0.3)
    with SilentServer() as server, dhttpx.Client(dep) as client:
        errors: list[BaseException] = []

        def hung() -> None:
            try:
                client.get(server.url)
            except HeadersTimeout as exc:
                errors.append(exc)

        threads = [threading.Thread(target=hung) for _ in range(2)]
        for thread in threads:
            thread.start()
        assert server.wait_requests(2)
        start = time.monotonic()
        with pytest.raises(PoolTimeout) as caught:
            client.get(server.url)
        assert fired_at(time.monotonic() - start, 0.3)
        assert caught.value.pool_wait is not None
        for thread in threads:
            thread.join()
        assert len(errors) == 2


# Cancellation: the socket closes at once, in every phase.


async def _cancel_after(seconds: float, call: Callable[[], object]) -> float:
    """Run `call` and cancel it after `seconds` (the caller left); the cancel instant."""
    async with anyio.create_task_group() as group:

        async def run() -> None:
            await call()  # type: ignore[misc]

        group.start_soon(run)
        await anyio.sleep(seconds)
        cancelled_at = time.monotonic()
        group.cancel_scope.cancel()
    return cancelled_at


SLOW_CAPS = Dependency("t", connect=5, headers=5, idle=5, total=5, pool_size=1, pool_wait=5)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.parametrize(
    ("name", "make"),
    [
        ("tls-handshake", TLSNeverServer),
        ("headers", SilentServer),
        ("body", lambda: TrickleServer(0.05)),
    ],
)
async def test_cancel_closes_the_socket_at_once(name: str, make: Callable[[], Server]) -> None:
    """A caller that leaves closes the connection now, seen server-side, TLS included."""
    with make() as server:
        baseline = open_fds()
        async with dhttpx.AsyncClient(SLOW_CAPS, verify=False) as client:

            async def call() -> None:
                async with client.stream("GET", server.url) as response:
                    async for _ in response.aiter_bytes():
                        pass

            cancelled_at = await _cancel_after(0.3, call)
            assert await peer_closed(server, timeout=1.0)
            assert server.close_times[0] - cancelled_at < LATE  # at once, not at GC
            assert await fds_back(baseline) == baseline  # the client is still open


@pytest.mark.anyio
async def test_deadline_during_tls_handshake_closes_the_socket() -> None:
    """A deadline firing mid-handshake closes the socket (httpx 0.28/0.29 left it to GC)."""
    with TLSNeverServer() as server:
        baseline = open_fds()
        async with dhttpx.AsyncClient(SLOW_CAPS, verify=False) as client:
            with pytest.raises(DeadlineExceeded):
                async with deadlines.scope(0.3):
                    await client.get(server.url)
            fired = time.monotonic()
            assert await peer_closed(server, timeout=1.0)
            assert server.close_times[0] - fired < LATE  # at once, not at GC
            assert await fds_back(baseline) == baseline


@pytest.mark.anyio
async def test_cancel_during_connect_to_a_blackhole_frees_the_socket() -> None:
    """Cancelled mid-SYN, the client socket is closed at once."""
    with BlackholeServer() as server:
        baseline = open_fds()
        async with dhttpx.AsyncClient(SLOW_CAPS) as client:
            await _cancel_after(0.2, lambda: client.get(server.url))
            assert await fds_back(baseline, timeout=0.5) == baseline


@pytest.mark.anyio
async def test_cancel_while_waiting_for_the_pool_gives_back_nothing_held() -> None:
    """Cancelled in the pool queue: the pool is not leaked; later calls still get in."""
    with SilentServer() as server, HealthyServer() as healthy:
        async with dhttpx.AsyncClient(SLOW_CAPS) as client:
            async with anyio.create_task_group() as group:
                group.start_soon(client.get, server.url)
                assert await anyio.to_thread.run_sync(server.wait_requests, 1)
                await _cancel_after(0.1, lambda: client.get(healthy.url))
                group.cancel_scope.cancel()
            assert await peer_closed(server)
            response = await client.get(healthy.url)
            assert response.status_code == 200


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_trio_headers_and_total(anyio_backend: str) -> None:
    """Under trio the same limits fire: headers on a silent server, total on a trickle."""
    with SilentServer() as silent, TrickleServer(0.05) as trickle:
        async with dhttpx.AsyncClient(DEP) as client:
            with pytest.raises(HeadersTimeout):
                await client.get(silent.url)
            start = time.monotonic()
            with pytest.raises(TotalTimeout):
                await client.get(trickle.url)
            assert fired_at(time.monotonic() - start, 0.8)


def test_a_dependency_is_required() -> None:
    """Anything but a deadlines.Dependency is refused, with a message that says so."""
    with pytest.raises(TypeError, match="deadlines.Dependency"):
        dhttpx.AsyncTransport("pricing")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="deadlines.Dependency"):
        dhttpx.Client("pricing")  # type: ignore[arg-type]


def test_transport_composes_with_a_plain_httpx_client() -> None:
    """The transport works inside any httpx client; a longer httpx timeout changes nothing."""
    with SilentServer() as server:
        client = httpx.Client(transport=dhttpx.Transport(DEP), timeout=60)
        with client, pytest.raises(HeadersTimeout) as caught:
            client.get(server.url)
        assert caught.value.limit == DEP.headers


def test_user_trace_extension_still_sees_events() -> None:
    """A user's own "trace" extension keeps receiving httpcore's events."""
    seen: list[str] = []
    with HealthyServer() as server, dhttpx.Client(DEP) as client:
        client.get(server.url, extensions={"trace": lambda name, info: seen.append(name)})
    assert "http11.send_request_headers.started" in seen


@pytest.mark.parametrize("module", ["httpx", "aiohttp"])
def test_import_without_the_library_says_what_to_install(module: str) -> None:
    """Without the client library the import error names the extra to install."""
    code = f"import sys; sys.modules[{module!r}] = None; import deadlines.{module}"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode != 0
    assert f"deadlines[{module}]" in result.stderr
