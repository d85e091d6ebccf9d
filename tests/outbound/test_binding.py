"""An error names the limit that bound it: its own cap, the call's total, or the deadline.

For every client, in each phase (pool, connect, headers, body), each of the three
limits in turn is made the shortest: the error is that limit's class, carries it as
``limit``, says it in its text, and fires at it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any

import pytest
from outbound_helpers import fired_at

import deadlines
import deadlines.aiohttp as daiohttp
import deadlines.httpx as dhttpx
from deadlines import Dependency
from deadlines.lab.servers import (
    BlackholeServer,
    Server,
    SilentServer,
    TrickleServer,
)

pytestmark = pytest.mark.realtime

SHORT = 0.3  # the binding limit, in seconds
LONG = 5.0  # every other limit

# phase: (server, the Dependency field capping the phase, the cap's error class)
PHASES: dict[str, tuple[Callable[[], Server], str, str]] = {
    "pool": (SilentServer, "pool_wait", "PoolTimeout"),
    "connect": (BlackholeServer, "connect", "ConnectTimeout"),
    "headers": (SilentServer, "headers", "HeadersTimeout"),
    "body": (lambda: TrickleServer(2.0), "idle", "IdleTimeout"),
}
BINDINGS = ("cap", "total", "deadline")


def _dependency(field: str, binding: str) -> Dependency:
    limits = dict.fromkeys(("connect", "headers", "idle", "pool_wait"), LONG)
    if binding == "cap":
        limits[field] = SHORT
    return Dependency("b", total=SHORT if binding == "total" else 2 * LONG, pool_size=1, **limits)


def _expected(binding: str, cap_error: str) -> str:
    return {"cap": cap_error, "total": "TotalTimeout", "deadline": "DeadlineExceeded"}[binding]


async def _async_call(
    client: str, dep: Dependency, url: str, held: str | None, deadline: bool
) -> Any:
    """Call `url` (with the pool's one place held by an unread answer from `held`)."""
    async with contextlib.AsyncExitStack() as stack:
        if client == "httpx":
            session: Any = await stack.enter_async_context(dhttpx.AsyncClient(dep))
            if held is not None:
                await stack.enter_async_context(session.stream("GET", held))
        else:
            session = await stack.enter_async_context(daiohttp.session(dep))
            if held is not None:
                await stack.enter_async_context(session.get(held))

        async def get() -> None:
            if client == "httpx":
                await session.get(url)
                return
            async with session.get(url) as response:
                await response.read()

        start = time.monotonic()
        try:
            if deadline:
                async with deadlines.scope(SHORT):
                    await get()
            else:
                await get()
        except Exception as exc:
            return exc, time.monotonic() - start
    raise AssertionError("the call did not fail")


def _sync_call(dep: Dependency, url: str, held: str | None, deadline: bool) -> Any:
    with contextlib.ExitStack() as stack:
        client = stack.enter_context(dhttpx.Client(dep))
        if held is not None:
            stack.enter_context(client.stream("GET", held))
        start = time.monotonic()
        try:
            if deadline:
                with deadlines.scope(SHORT):
                    client.get(url)
            else:
                client.get(url)
        except Exception as exc:
            return exc, time.monotonic() - start
    raise AssertionError("the call did not fail")


@pytest.mark.parametrize("binding", BINDINGS)
@pytest.mark.parametrize("phase", list(PHASES))
@pytest.mark.parametrize("client", ["httpx", "httpx-sync", "aiohttp"])
def test_the_error_names_the_limit_that_bound_it(client: str, phase: str, binding: str) -> None:
    """The shortest limit decides the error's class, its `limit`, its text and its instant."""
    make, field, cap_error = PHASES[phase]
    dep = _dependency(field, binding)
    with make() as server, TrickleServer(10.0) as other:
        held = other.url if phase == "pool" else None  # an unfinished answer holds the place
        if client == "httpx-sync":
            error, elapsed = _sync_call(dep, server.url, held, binding == "deadline")
        else:
            error, elapsed = asyncio.run(
                _async_call(client, dep, server.url, held, binding == "deadline")
            )
    assert type(error).__name__ == _expected(binding, cap_error), repr(error)
    assert error.phase == phase
    assert error.limit == pytest.approx(SHORT)
    assert f"{SHORT * 1000:.0f} ms" in str(error), str(error)
    assert fired_at(elapsed, SHORT), elapsed
    assert fired_at(error.elapsed, SHORT), error.elapsed
