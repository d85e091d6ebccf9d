"""Cancellations in every phase, alone and interleaved, leave no connection behind.

A call is interrupted at an exact point of its phase (from httpcore's trace hook, or
once the server saw it reach the phase), and a second cancellation follows: during the
cleanup of the first, or a few loop turns later. That is what happens by itself under
load, where the deadline's timer and the caller leaving fire in the same instant. After
each, for every client:

* the server sees the connection closed within 50 ms (or, for a stalled upload that
  the server never reads, the socket is no longer the process's);
* the pool counts as many connections as there are sockets open;
* a healthy call right after succeeds at once, on a pool of one.

A bounded stochastic sweep then sets the deadline's own timer against a cancellation
from outside, from 2 ms before it to 5 ms after.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from outbound_helpers import UploadStallServer, eventually, sockets_to

import deadlines.httpx as dhttpx
from deadlines import Dependency
from deadlines.lab.servers import (
    HealthyServer,
    Server,
    SilentServer,
    TLSNeverServer,
    TrickleServer,
)

pytestmark = pytest.mark.realtime

#: One connection, so a place leaked by a call makes the next one fail (PoolTimeout).
DEP = Dependency("c", connect=5, headers=5, idle=5, total=10, pool_size=1, pool_wait=0.5)
#: How soon the server must see the close (what the issue asks).
CLOSE_SEEN = 0.05
UPLOAD = b"x" * (16 << 20)  # more than loopback buffers take: the write blocks

# phase: (the httpcore event at which the first cancellation lands, server, method, body)
PHASES: dict[str, tuple[str, Callable[[], Server], str, bytes | None]] = {
    "connect": ("connection.connect_tcp.started", SilentServer, "GET", None),
    "tls": ("connection.start_tls.started", TLSNeverServer, "GET", None),
    "write": ("http11.send_request_body.started", UploadStallServer, "POST", UPLOAD),
    "headers": ("http11.receive_response_headers.started", SilentServer, "GET", None),
    "body": ("http11.receive_response_body.started", lambda: TrickleServer(10.0), "GET", None),
}
# The second cancellation: None, at the start of httpcore's cleanup, or k loop turns later.
SECOND: list[str | int | None] = [None, "http11.response_closed.started", 0, 1, 2, 3]


async def _turns(k: int) -> None:
    for _ in range(k):
        await anyio.sleep(0)


async def _closed_in_time(server: Server, cut_at: float) -> None:
    """Every connection the server saw was closed within CLOSE_SEEN of the cut.

    A cut at the start of the connect phase may land before the SYN: then the server
    sees nothing, and no socket of ours remains. A server that never reads cannot see a
    close: there the socket must no longer be ours.
    """
    if isinstance(server, UploadStallServer):
        assert await eventually(lambda: sockets_to(server.port) == 0, CLOSE_SEEN + 0.5)
        return
    await anyio.sleep(CLOSE_SEEN)  # a connect that went through is accepted by now
    assert await eventually(lambda: server.peer_closed == server.opened, 2.0), (
        "a socket stayed open"
    )
    for seen in server.close_times:
        late = seen - cut_at
        assert late <= CLOSE_SEEN, f"the server saw a close {late * 1000:.0f} ms after the cut"
    assert sockets_to(server.port) == 0


async def _healthy_call_succeeds(get: Callable[[str], Awaitable[int]], healthy: Server) -> None:
    start = time.monotonic()
    assert await get(healthy.url) == 200
    assert time.monotonic() - start < 0.4, "the healthy call waited: a place was leaked"


class Cut:
    """Runs one call in a task of its own and cancels it as the caller leaving would.

    On asyncio natively (`Task.cancel`, which an anyio shield does not stop), on trio
    through a cancel scope around the call. Records when the first cut was made.
    """

    def __init__(self) -> None:
        self.at: list[float] = []
        self._task: asyncio.Task[Any] | None = None
        self._scope = anyio.CancelScope()
        self._group: Any = None

    def __call__(self) -> None:
        self.at.append(time.monotonic())
        if self._task is not None:
            self._task.cancel()
        else:
            self._scope.cancel()

    def after(self, turns: int) -> None:
        """Cut again `turns` loop turns from now."""

        async def later() -> None:
            for _ in range(turns):
                await anyio.sleep(0)
            self()

        if self._task is not None:
            asyncio.get_running_loop().create_task(later())
        else:
            self._group.start_soon(later)

    async def run(self, call: Callable[[], Awaitable[object]]) -> None:
        """Run `call` until it ends or is cut."""
        if _on_asyncio():
            self._task = asyncio.get_running_loop().create_task(call())
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            return
        async with anyio.create_task_group() as self._group:

            async def scoped() -> None:
                with self._scope:
                    await call()

            self._group.start_soon(scoped)


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.parametrize("second", SECOND, ids=str)
@pytest.mark.parametrize("phase", list(PHASES))
async def test_httpx_async_cancelled_in_each_phase_leaks_nothing(
    phase: str, second: str | int | None
) -> None:
    """httpx, async: a cancellation in each phase, then another mid-cleanup, leaks nothing."""
    event, make, method, body = PHASES[phase]
    cut = Cut()

    async def trace(name: str, info: dict[str, Any]) -> None:
        if name == event and not cut.at:
            cut()
            if isinstance(second, int):
                cut.after(second)
        elif name == second and cut.at:
            cut()

    with make() as server, HealthyServer() as healthy:
        async with dhttpx.AsyncClient(DEP, verify=False) as client:
            await cut.run(
                lambda: client.request(
                    method, server.url, content=body, extensions={"trace": trace}
                )
            )
            assert cut.at, f"the call never reached {event}"
            await _closed_in_time(server, cut.at[0])
            pool = client._transport._pool  # type: ignore[attr-defined]
            assert len(pool.connections) == sockets_to(server.port) == 0

            async def get(url: str) -> int:
                return (await client.get(url)).status_code

            await _healthy_call_succeeds(get, healthy)
            assert len(pool.connections) == sockets_to(healthy.port) == 1


class Interrupt(BaseException):
    """What interrupts blocking code from outside (as KeyboardInterrupt does)."""


@pytest.mark.parametrize("second", [None, "http11.response_closed.started"], ids=str)
@pytest.mark.parametrize("phase", list(PHASES))
def test_httpx_sync_interrupted_in_each_phase_leaks_nothing(phase: str, second: str | None) -> None:
    """httpx, blocking: interrupted in each phase, then again in the cleanup, leaks nothing."""
    event, make, method, body = PHASES[phase]
    cut_at: list[float] = []

    def trace(name: str, info: dict[str, Any]) -> None:
        if (name == event and not cut_at) or (name == second and cut_at):
            cut_at.append(time.monotonic())
            raise Interrupt

    with make() as server, HealthyServer() as healthy, dhttpx.Client(DEP, verify=False) as client:
        with pytest.raises(Interrupt):
            client.request(method, server.url, content=body, extensions={"trace": trace})
        assert cut_at, f"the call never reached {event}"
        anyio.run(_closed_in_time, server, cut_at[0])
        pool = client._transport._pool  # type: ignore[attr-defined]
        assert len(pool.connections) == sockets_to(server.port) == 0
        start = time.monotonic()
        assert client.get(healthy.url).status_code == 200
        assert time.monotonic() - start < 0.4, "the healthy call waited: a place was leaked"
        assert len(pool.connections) == sockets_to(healthy.port) == 1
