"""deadlines.fallback: a default for an optional call, never a swallowed cancellation."""

from __future__ import annotations

import asyncio
import time

import pytest
from outbound_helpers import LATE, peer_closed

import deadlines
import deadlines.httpx as dhttpx
from deadlines import CallerLeft, DeadlineExceeded, Dependency, HeadersTimeout, fallback
from deadlines.lab.servers import HealthyServer, SilentServer

RECS = Dependency("recs", headers=0.2, total=1)


@pytest.mark.anyio
async def test_timeout_returns_the_default_and_closes_the_call() -> None:
    """A slow optional call yields the default at its limit; its socket is closed."""
    seen: list[Exception] = []
    with SilentServer() as server:
        async with dhttpx.AsyncClient(RECS) as client:
            start = time.monotonic()
            recs = await fallback.call(
                lambda: client.get(server.url), default=None, on_fallback=seen.append
            )
            assert recs is None
            assert time.monotonic() - start <= 0.2 + LATE
            assert isinstance(seen[0], HeadersTimeout)
            assert await peer_closed(server)


@pytest.mark.anyio
async def test_limit_bounds_the_call_inside_the_request() -> None:
    """`limit` gives the optional call its own tight scope inside the request's."""
    with SilentServer() as server:
        dep = Dependency("recs", headers=5)
        async with dhttpx.AsyncClient(dep) as client, deadlines.scope(2.0):
            start = time.monotonic()
            got = await fallback.call(lambda: client.get(server.url), default="-", limit=0.2)
            assert got == "-"
            assert time.monotonic() - start <= 0.2 + LATE
            assert deadlines.remaining() > 1.0  # the request goes on


@pytest.mark.anyio
async def test_success_passes_the_result_through() -> None:
    """A call that answers in time returns its own result."""
    with HealthyServer(body=b"recs") as server:
        async with dhttpx.AsyncClient(RECS) as client:
            response = await fallback.call(lambda: client.get(server.url), default=None)
            assert response is not None
            assert response.text == "recs"


@pytest.mark.anyio
async def test_budget_exhausted_returns_the_default_without_calling() -> None:
    """Not enough budget left: the default, and the server never hears of it."""
    with HealthyServer() as server:
        dep = Dependency("recs", min_useful=0.5)
        async with dhttpx.AsyncClient(dep) as client, deadlines.scope(0.2):
            assert await fallback.call(lambda: client.get(server.url), default=[]) == []
        assert server.opened == 0


@pytest.mark.anyio
async def test_caller_leaving_is_not_swallowed() -> None:
    """A cancellation from outside (the caller left) passes through the fallback."""
    with SilentServer() as server:
        async with dhttpx.AsyncClient(Dependency("recs", headers=5)) as client:
            task = asyncio.create_task(
                fallback.call(lambda: client.get(server.url), default="x", limit=2)
            )
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task


@pytest.mark.anyio
async def test_caller_left_error_is_not_swallowed() -> None:
    """CallerLeft is re-raised even when `on` would catch it."""

    async def call() -> str:
        raise CallerLeft()

    with pytest.raises(CallerLeft):
        await fallback.call(call, default="x", on=(Exception,))


def test_expired_request_deadline_is_not_replaced_by_a_default() -> None:
    """When the request's own deadline has passed, no default can help: it propagates."""
    dep = Dependency("recs", headers=5, total=5)
    with (
        SilentServer() as server,
        dhttpx.Client(dep) as client,
        deadlines.scope(0.2),
        pytest.raises(DeadlineExceeded),
    ):
        fallback.call_sync(lambda: client.get(server.url), default="x")


@pytest.mark.anyio
async def test_other_errors_propagate() -> None:
    """Only what `on` names falls back; a bug is not hidden."""

    async def broken() -> str:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        await fallback.call(broken, default="x")


@pytest.mark.anyio
async def test_decorator_on_async_and_sync_functions() -> None:
    """`returning` wraps async and blocking functions alike, keeping their names."""

    @fallback.returning([], limit=0.1)
    async def recs(user: str) -> list[str]:
        await asyncio.sleep(1)
        return [user]

    @fallback.returning("cached")
    def price() -> str:
        raise HeadersTimeout(limit=0.1, elapsed=0.1)

    assert await recs("ann") == []
    assert price() == "cached"
    assert recs.__name__ == "recs"


def test_on_refuses_cancellation_types() -> None:
    """`on` cannot name a cancellation or a non-exception."""
    with pytest.raises(TypeError, match="never catches a cancellation"):
        fallback.returning(None, on=(asyncio.CancelledError,))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="non-empty tuple"):
        fallback.returning(None, on=())
