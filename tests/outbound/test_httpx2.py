"""deadlines.httpx2: deadlines.httpx's implementation over httpx2 and httpcore2.

The same limits in every phase, the same pool that no cancellation can leak, the
user's transports and proxies, with errors that are httpx2's own; the two packages
side by side in one process; and the type stub held against the runtime.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import httpx2
import pytest
from outbound_helpers import eventually, fired_at, sockets_to
from proxies import ProxyServer

import deadlines
import deadlines.httpx as dhttpx
import deadlines.httpx2 as dhttpx2
from deadlines import ConnectTimeout, Dependency, HeadersTimeout, IdleTimeout, TotalTimeout
from deadlines.lab.servers import (
    BlackholeServer,
    HealthyServer,
    Server,
    SilentServer,
    TrickleServer,
)
from deadlines.wire import HEADER

pytestmark = pytest.mark.realtime

DEP = Dependency("h2x", connect=0.3, headers=0.4, idle=0.3, total=0.8, pool_size=1, pool_wait=0.2)

# server, our error, httpx2's, phase, the limit it fires at
CASES: dict[str, tuple[Callable[[], Server], type[Exception], type[Exception], str, float]] = {
    "silent": (SilentServer, HeadersTimeout, httpx2.ReadTimeout, "headers", 0.4),
    "trickle": (lambda: TrickleServer(0.05), TotalTimeout, httpx2.ReadTimeout, "body", 0.8),
    "trickle-idle": (lambda: TrickleServer(2.0), IdleTimeout, httpx2.ReadTimeout, "body", 0.3),
    "blackhole": (BlackholeServer, ConnectTimeout, httpx2.ConnectTimeout, "connect", 0.3),
}


@pytest.mark.anyio
@pytest.mark.parametrize("name", list(CASES))
async def test_each_phase_fails_at_its_limit_as_httpx2s_error(name: str) -> None:
    """Each misbehaving server: our error, in its phase, at its limit, and httpx2's class."""
    make, ours, theirs, phase, limit = CASES[name]
    with make() as server:
        async with dhttpx2.AsyncClient(DEP) as client:
            start = time.monotonic()
            with pytest.raises(ours) as caught:
                await client.get(server.url)
            assert fired_at(time.monotonic() - start, limit)
            assert isinstance(caught.value, theirs)
            assert not isinstance(caught.value, httpx.HTTPError)  # not httpx's: httpx2's
            assert caught.value.phase == phase
            assert isinstance(caught.value.request, httpx2.Request)


@pytest.mark.parametrize("name", ["silent", "trickle-idle"])
def test_the_blocking_client_too(name: str) -> None:
    """The blocking twin over httpx2: the same limits and errors."""
    make, ours, theirs, _phase, limit = CASES[name]
    with make() as server, dhttpx2.Client(DEP) as client:
        start = time.monotonic()
        with pytest.raises(ours) as caught:
            client.get(server.url)
        assert fired_at(time.monotonic() - start, limit)
        assert isinstance(caught.value, theirs)


@pytest.mark.anyio
async def test_a_cut_in_httpcore2s_cleanup_leaks_nothing() -> None:
    """Cut in the headers phase, then again as httpcore2 cleans up: nothing is lost."""
    cuts: list[float] = []
    with SilentServer() as server, HealthyServer() as healthy:
        async with dhttpx2.AsyncClient(DEP) as client:
            task: asyncio.Task[object] | None = None

            async def trace(event: str, info: object) -> None:
                if event in (
                    "http11.receive_response_headers.started",
                    "http11.response_closed.started",
                ):
                    cuts.append(time.monotonic())
                    assert task is not None
                    task.cancel()

            task = asyncio.create_task(client.get(server.url, extensions={"trace": trace}))
            with pytest.raises(asyncio.CancelledError):
                await task
            assert len(cuts) == 2
            assert await eventually(lambda: server.peer_closed == 1)
            pool = client._transport._pool  # type: ignore[attr-defined]
            assert len(pool.connections) == sockets_to(server.port) == 0
            assert (await client.get(healthy.url)).status_code == 200


@pytest.mark.anyio
async def test_mocks_and_proxies_over_httpx2(monkeypatch: pytest.MonkeyPatch) -> None:
    """An httpx2.MockTransport gets the deadline header; a proxy= forwards plain HTTP."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    seen: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(200, text="mocked")

    mock = httpx2.MockTransport(handler)
    async with dhttpx2.AsyncClient(DEP, transport=mock) as client, deadlines.scope(0.5):
        assert (await client.get("http://mocked/")).text == "mocked"
    assert 0 < int(seen[0].headers[HEADER]) <= 500
    with ProxyServer() as proxy, HealthyServer(body=b"proxied") as origin:
        async with dhttpx2.AsyncClient(DEP, proxy=proxy.url) as client:
            assert (await client.get(origin.url)).text == "proxied"
    assert proxy.asked == [f"GET {origin.url}/"]


def test_both_packages_live_side_by_side() -> None:
    """deadlines.httpx and deadlines.httpx2 are separate classes over separate libraries."""
    assert dhttpx.AsyncClient is not dhttpx2.AsyncClient
    assert issubclass(dhttpx.AsyncClient, httpx.AsyncClient)
    assert issubclass(dhttpx2.AsyncClient, httpx2.AsyncClient)
    assert not issubclass(dhttpx2.AsyncClient, httpx.AsyncClient)
    assert dhttpx2.POOL_WAIT == dhttpx.POOL_WAIT


def _stub() -> dict[str, ast.ClassDef]:
    path = Path(dhttpx2.__file__).with_suffix(".pyi")
    tree = ast.parse(path.read_text())
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def test_the_type_stub_matches_the_runtime() -> None:
    """Every public class of the stub exists at run time, with the same __init__."""
    classes = _stub()
    assert sorted([*classes, "POOL_WAIT"]) == sorted(dhttpx2.__all__)
    for name, node in classes.items():
        runtime = getattr(dhttpx2, name)
        init = next(
            item
            for item in node.body
            if isinstance(item, ast.FunctionDef) and item.name == "__init__"
        )
        stub_params = [a.arg for a in [*init.args.args, *init.args.kwonlyargs]]
        if init.args.kwarg is not None:
            stub_params.append(init.args.kwarg.arg)
        assert stub_params == list(inspect.signature(runtime.__init__).parameters), name
        for base in node.bases:  # e.g. httpx2.AsyncBaseTransport
            assert isinstance(base, ast.Attribute), name
            assert issubclass(runtime, getattr(httpx2, base.attr)), (name, base.attr)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_under_trio(anyio_backend: str) -> None:
    """Under trio the same limits fire."""
    with SilentServer() as server:
        async with dhttpx2.AsyncClient(DEP) as client:
            with pytest.raises(HeadersTimeout):
                await client.get(server.url)
