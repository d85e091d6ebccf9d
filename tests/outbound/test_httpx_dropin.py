"""deadlines.httpx as a drop-in: httpx's own options, the user's transports, proxies.

A user swaps ``httpx.AsyncClient(...)`` for ``deadlines.httpx.AsyncClient(dep, ...)``
and keeps the rest: ``timeout=``, ``limits=``, ``transport=`` (httpx.MockTransport,
respx), ``mounts=``, ``proxy=`` and the environment's proxies behave as in httpx, with
the dependency's limits around them. Proxies are real ones on loopback.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from pathlib import Path

import anyio
import httpx
import pytest
import respx
from outbound_helpers import UploadStallServer, eventually, fired_at, write_self_signed
from proxies import ProxyServer, Socks5Server, TLSServer

import deadlines
import deadlines.httpx as dhttpx
from deadlines import ConnectTimeout, Dependency, HeadersTimeout, PoolTimeout, TotalTimeout
from deadlines.lab.servers import BlackholeServer, HealthyServer, SilentServer
from deadlines.wire import HEADER

pytestmark = pytest.mark.realtime

DEP = Dependency("d", connect=0.5, headers=0.6, idle=0.6, total=1.0, pool_size=2, pool_wait=0.2)


@pytest.fixture
def tls_files(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and its key."""
    return write_self_signed(tmp_path)


def trusting(cert: Path) -> ssl.SSLContext:
    """A client context that trusts `cert`."""
    return ssl.create_default_context(cafile=str(cert))


@pytest.fixture
def no_env_proxies(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No proxy from the environment, unless the test sets one."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    return monkeypatch


# httpx's own options


@pytest.mark.anyio
async def test_a_shorter_httpx_timeout_lowers_the_caps() -> None:
    """timeout=0.2 on the client, or on the request, cuts the headers wait at 0.2 s."""
    with SilentServer() as server:
        async with dhttpx.AsyncClient(DEP, timeout=0.2) as client:
            start = time.monotonic()
            with pytest.raises(HeadersTimeout) as caught:
                await client.get(server.url)
            assert fired_at(time.monotonic() - start, 0.2)
            assert caught.value.limit == pytest.approx(0.2)
            assert isinstance(caught.value, httpx.ReadTimeout)
        async with dhttpx.AsyncClient(DEP) as client:
            with pytest.raises(HeadersTimeout) as caught:
                await client.get(server.url, timeout=httpx.Timeout(5, read=0.3))
            assert caught.value.limit == pytest.approx(0.3)
            with pytest.raises(HeadersTimeout) as caught:
                await client.get(server.url, timeout=30)  # longer: the dependency's cap
            assert caught.value.limit == pytest.approx(DEP.headers)


@pytest.mark.anyio
async def test_limits_can_lower_the_pool_size() -> None:
    """limits=Limits(max_connections=1): a second call waits its pool_wait, then PoolTimeout."""
    with SilentServer() as server:
        async with dhttpx.AsyncClient(DEP, limits=httpx.Limits(max_connections=1)) as client:
            first = asyncio.create_task(client.get(server.url))
            await asyncio.sleep(0.05)
            with pytest.raises(PoolTimeout) as caught:
                await client.get(server.url)
            assert isinstance(caught.value, httpx.PoolTimeout)
            with pytest.raises(HeadersTimeout):
                await first


@pytest.mark.anyio
async def test_without_limits_the_pool_size_is_the_dependencys() -> None:
    """No limits=: httpx's default (100 connections) caps nothing; 150 calls hang at once."""
    dep = Dependency("wide", headers=5.0, total=5.0, pool_size=150, pool_wait=0.1)
    with SilentServer() as server:
        async with dhttpx.AsyncClient(dep) as client:
            calls = [asyncio.create_task(client.get(server.url)) for _ in range(150)]
            assert await eventually(lambda: server.opened == 150, timeout=4.0), server.opened
            assert not any(call.done() for call in calls)  # no PoolTimeout at the 101st
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)


@pytest.mark.anyio
async def test_no_keepalive_closes_each_connection_after_its_call() -> None:
    """limits=Limits(max_keepalive_connections=0): nothing is kept idle."""
    with HealthyServer() as server:
        limits = httpx.Limits(max_keepalive_connections=0)
        async with dhttpx.AsyncClient(DEP, limits=limits) as client:
            for _ in range(3):
                assert (await client.get(server.url)).text == "ok"
            assert server.opened == 3
            assert await eventually(lambda: server.peer_closed == 3)


# The user's transports


@pytest.mark.anyio
async def test_a_mock_transport_gets_the_header_and_the_budget() -> None:
    """transport=httpx.MockTransport: the handler sees the time left; the deadline cuts it."""
    seen: list[httpx.Request] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        if request.url.path == "/hang":
            await anyio.sleep(60)
        return httpx.Response(200, json={"ok": True})

    async with dhttpx.AsyncClient(DEP, transport=httpx.MockTransport(handler)) as client:
        async with deadlines.scope(0.8):
            response = await client.get("http://mocked/price")
        assert response.json() == {"ok": True}
        assert 0 < int(seen[0].headers[HEADER]) <= 800
        start = time.monotonic()
        with pytest.raises(TotalTimeout) as caught:
            await client.get("http://mocked/hang")
        assert fired_at(time.monotonic() - start, DEP.total)
        assert isinstance(caught.value, httpx.ReadTimeout)
        assert caught.value.phase == "headers"


def test_a_blocking_mock_transport_gets_the_header() -> None:
    """The blocking client wraps a mock too: the deadline header is sent."""
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(204)

    with dhttpx.Client(DEP, transport=httpx.MockTransport(handler)) as client, deadlines.scope(0.5):
        assert client.get("http://mocked/").status_code == 204
    assert 0 < int(seen[0].headers[HEADER]) <= 500


@pytest.mark.anyio
async def test_mounts_route_some_urls_to_the_users_transport() -> None:
    """mounts={...: MockTransport}: matching URLs go to the mock, the rest to ours."""

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=f"mock {request.headers[HEADER]}")

    with SilentServer() as server:
        mounts = {"http://mocked": httpx.MockTransport(handler)}
        async with dhttpx.AsyncClient(DEP, mounts=mounts) as client:
            assert (await client.get("http://mocked/x")).text.startswith("mock ")
            with pytest.raises(HeadersTimeout):  # ours, with its per-phase caps
                await client.get(server.url)


@pytest.mark.anyio
@pytest.mark.parametrize("using", ["httpcore", "httpx"])
async def test_respx_mocks_our_client(using: str) -> None:
    """respx, with either of its mockers, answers our client's calls; none leaves."""
    with respx.mock(using=using, assert_all_called=True) as mock:
        route = mock.get("http://pricing.test/prices/42").respond(json={"price": 7})
        async with dhttpx.AsyncClient(DEP) as client, deadlines.scope(0.7):
            response = await client.get("http://pricing.test/prices/42")
    assert response.json() == {"price": 7}
    assert 0 < int(route.calls.last.request.headers[HEADER]) <= 700


# Proxies


@pytest.mark.anyio
async def test_a_forward_proxy_carries_plain_http(no_env_proxies: pytest.MonkeyPatch) -> None:
    """proxy= for http://: the absolute-form request goes through the proxy."""
    with ProxyServer() as proxy, HealthyServer(body=b"via proxy") as origin:
        async with dhttpx.AsyncClient(DEP, proxy=proxy.url) as client:
            assert (await client.get(origin.url + "/a")).text == "via proxy"
    assert proxy.asked == [f"GET {origin.url}/a"]
    assert HEADER in origin.requests[0].headers


@pytest.mark.anyio
async def test_a_connect_proxy_tunnels_tls(
    no_env_proxies: pytest.MonkeyPatch, tls_files: tuple[Path, Path]
) -> None:
    """proxy= for https://: CONNECT, then TLS to the origin through the tunnel."""
    cert, key = tls_files
    with ProxyServer() as proxy, TLSServer(cert, key, body=b"tunnelled") as origin:
        async with dhttpx.AsyncClient(DEP, proxy=proxy.url, verify=trusting(cert)) as client:
            response = await client.get(origin.url + "/b")
            assert response.text == "tunnelled"
            assert (await client.get(origin.url + "/c")).text == "tunnelled"  # reused
    host = origin.url.removeprefix("https://")
    assert proxy.asked == [f"CONNECT {host}"]


@pytest.mark.anyio
@pytest.mark.parametrize("scheme", ["http", "https"])
async def test_a_proxy_that_never_answers(
    scheme: str, no_env_proxies: pytest.MonkeyPatch, tls_files: tuple[Path, Path]
) -> None:
    """A proxy that reads and never answers: the tunnel within connect, nothing sent;
    a forwarded request within headers, sent."""
    cert, key = tls_files
    with ProxyServer(silent=True) as proxy, TLSServer(cert, key) as tls, HealthyServer() as web:
        origin = tls.url if scheme == "https" else web.url
        async with dhttpx.AsyncClient(DEP, proxy=proxy.url, verify=trusting(cert)) as client:
            start = time.monotonic()
            expected = ConnectTimeout if scheme == "https" else HeadersTimeout
            with pytest.raises(expected) as caught:
                await client.get(origin)
            limit = DEP.connect if scheme == "https" else DEP.headers
            assert fired_at(time.monotonic() - start, limit)
            assert caught.value.request_sent is (scheme == "http")
            assert await eventually(lambda: proxy.peer_closed == 1)


@pytest.mark.anyio
async def test_a_blackholed_proxy_is_a_connect_timeout(no_env_proxies: pytest.MonkeyPatch) -> None:
    """A proxy whose SYNs are dropped: ConnectTimeout at the connect cap."""
    with BlackholeServer() as proxy, HealthyServer() as origin:
        async with dhttpx.AsyncClient(DEP, proxy=proxy.url) as client:
            start = time.monotonic()
            with pytest.raises(ConnectTimeout) as caught:
                await client.get(origin.url)
            assert fired_at(time.monotonic() - start, DEP.connect)
            assert isinstance(caught.value, httpx.ConnectTimeout)


@pytest.mark.anyio
async def test_environment_proxies_as_httpx_reads_them(no_env_proxies: pytest.MonkeyPatch) -> None:
    """HTTP_PROXY with trust_env: through the proxy; NO_PROXY and trust_env=False: direct."""
    with ProxyServer() as proxy, HealthyServer() as origin:
        no_env_proxies.setenv("HTTP_PROXY", proxy.url)
        async with dhttpx.AsyncClient(DEP) as client:
            await client.get(origin.url + "/env")
        assert proxy.asked == [f"GET {origin.url}/env"]
        async with dhttpx.AsyncClient(DEP, trust_env=False) as client:
            await client.get(origin.url + "/direct")
        no_env_proxies.setenv("NO_PROXY", "127.0.0.1")
        async with dhttpx.AsyncClient(DEP) as client:
            await client.get(origin.url + "/excluded")
        assert proxy.asked == [f"GET {origin.url}/env"]
        assert [r.target for r in origin.requests] == ["/env", "/direct", "/excluded"]


def test_the_blocking_client_goes_through_a_proxy_too(no_env_proxies: pytest.MonkeyPatch) -> None:
    """The blocking client: proxy= forwards; a silent proxy is bounded by headers."""
    with (
        ProxyServer() as proxy,
        HealthyServer(body=b"sync") as origin,
        dhttpx.Client(DEP, proxy=proxy.url) as client,
    ):
        assert client.get(origin.url).text == "sync"
    with (
        ProxyServer(silent=True) as proxy,
        HealthyServer() as origin,
        dhttpx.Client(DEP, proxy=proxy.url) as client,
        pytest.raises(HeadersTimeout),
    ):
        client.get(origin.url)


@pytest.mark.anyio
async def test_a_socks5_proxy(no_env_proxies: pytest.MonkeyPatch) -> None:
    """proxy=socks5://: through it; a SOCKS proxy that never answers is a ConnectTimeout."""
    with Socks5Server() as proxy, HealthyServer(body=b"socks") as origin:
        socks = proxy.url.replace("http://", "socks5://")
        async with dhttpx.AsyncClient(DEP, proxy=socks) as client:
            assert (await client.get(origin.url)).text == "socks"
        assert proxy.asked == [origin.url.removeprefix("http://")]
    with Socks5Server(silent=True) as proxy, HealthyServer() as origin:
        socks = proxy.url.replace("http://", "socks5://")
        async with dhttpx.AsyncClient(DEP, proxy=socks) as client:
            start = time.monotonic()
            with pytest.raises(ConnectTimeout) as caught:
                await client.get(origin.url)
            assert fired_at(time.monotonic() - start, DEP.connect)
            assert caught.value.request_sent is False


@pytest.mark.anyio
@pytest.mark.parametrize("url", ["invalid://example.org", "://example.org", "http://"])
async def test_a_url_no_connection_can_serve_is_refused_as_httpx_does(url: str) -> None:
    """A bad scheme or no host: httpx's UnsupportedProtocol or LocalProtocolError, at once."""
    async with dhttpx.AsyncClient(DEP) as client:
        with pytest.raises((httpx.UnsupportedProtocol, httpx.LocalProtocolError)):
            await client.get(url)


@pytest.mark.anyio
async def test_httpx_read_and_write_timeouts_bound_each_operation() -> None:
    """timeout=Timeout(None, write=0.2): a stalled upload is a write timeout at 0.2 s;
    Timeout(None, read=0.2): the wait for the head is a read timeout at 0.2 s."""
    with UploadStallServer() as stall, SilentServer() as silent:
        async with dhttpx.AsyncClient(DEP) as client:
            start = time.monotonic()
            with pytest.raises(HeadersTimeout) as caught:
                await client.post(
                    stall.url, content=b"x" * (16 << 20), timeout=httpx.Timeout(None, write=0.2)
                )
            assert fired_at(time.monotonic() - start, 0.2)
            assert isinstance(caught.value, httpx.WriteTimeout)
            assert caught.value.limit == pytest.approx(0.2)
            with pytest.raises(HeadersTimeout) as caught:
                await client.get(silent.url, timeout=httpx.Timeout(None, read=0.2))
            assert isinstance(caught.value, httpx.ReadTimeout)
            assert caught.value.limit == pytest.approx(0.2)


def test_a_wrapped_transport_is_entered_and_exited_with_the_client() -> None:
    """The client's with-block enters and exits a transport of the user's, as httpx's does."""
    events: list[str] = []

    class Mine(httpx.BaseTransport):
        def handle_request(self, request: httpx.Request) -> httpx.Response:
            return httpx.Response(204)

        def __enter__(self) -> Mine:
            events.append("enter")
            return self

        def __exit__(self, *exc_info: object) -> None:
            events.append("exit")

    with dhttpx.Client(DEP, transport=Mine()) as client:
        assert client.get("http://mine/").status_code == 204
    assert events == ["enter", "exit"]
