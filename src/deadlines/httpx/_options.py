"""What a client or transport takes: the dependency, httpx's own options, the retry rule."""

from __future__ import annotations

import importlib.util
import ssl
from typing import Any

from .._dependency import Dependency
from ._boundary import request_sent
from ._lib import httpcore, httpx

#: What our transports take beyond the options an httpx client passes them.
TRANSPORT_ONLY = ("uds", "local_address", "socket_options", "retries")


def check_dependency(dependency: Dependency) -> None:
    """Refuse anything but a `Dependency`, with a message that says so."""
    if not isinstance(dependency, Dependency):
        raise TypeError(f"dependency must be a deadlines.Dependency, not {dependency!r}")


def pool_size(dependency: Dependency, limits: httpx.Limits) -> int:
    """Connections and calls at once: the dependency's pool, or fewer if `limits` says so."""
    most = limits.max_connections
    return dependency.pool_size if most is None else max(1, min(dependency.pool_size, most))


def check_url(request: httpx.Request) -> None:
    """Refuse a URL no connection can serve, as httpcore's own pool does, before anything."""
    scheme = request.url.scheme
    if scheme == "":
        raise httpx.UnsupportedProtocol(
            "Request URL is missing an 'http://' or 'https://' protocol.", request=request
        )
    if scheme not in ("http", "https", "ws", "wss"):
        raise httpx.UnsupportedProtocol(
            f"Request URL has an unsupported protocol '{scheme}://'.", request=request
        )
    if not request.url.host:
        raise httpx.LocalProtocolError("Request URL has no host.", request=request)


def factory_options(
    *,
    verify: ssl.SSLContext | str | bool,
    cert: Any,
    trust_env: bool,
    http1: bool,
    http2: bool,
    size: int,
    limits: httpx.Limits,
    proxy: httpx.Proxy | None,
    local_address: str | None,
    uds: str | None,
    socket_options: Any,
    retries: int,
) -> dict[str, Any]:
    """The keyword arguments of the httpcore pool (or proxy) that makes the connections.

    As httpx's own transport builds it; sized to the dependency's pool.
    """
    options: dict[str, Any] = {
        "ssl_context": httpx.create_ssl_context(verify=verify, cert=cert, trust_env=trust_env),
        "max_connections": size,
        "max_keepalive_connections": size,
        "keepalive_expiry": limits.keepalive_expiry,
        "http1": http1,
        "http2": http2,
        "retries": retries,
    }
    if proxy is None or proxy.url.scheme in ("http", "https"):
        options.update(local_address=local_address, uds=uds, socket_options=socket_options)
    if proxy is not None:
        options["proxy_url"] = httpcore.URL(
            scheme=proxy.url.raw_scheme,
            host=proxy.url.raw_host,
            port=proxy.url.port,
            target=proxy.url.raw_path,
        )
        options["proxy_auth"] = proxy.raw_auth
        if proxy.url.scheme in ("http", "https"):
            options["proxy_headers"] = proxy.headers.raw
            options["proxy_ssl_context"] = proxy.ssl_context
    return options


def proxy_kind(proxy: httpx.Proxy | None) -> str | None:
    """None (direct), "http" (an HTTP or HTTPS proxy) or "socks"; httpx's error otherwise."""
    if proxy is None:
        return None
    scheme = proxy.url.scheme
    if scheme in ("http", "https"):
        return "http"
    if scheme in ("socks5", "socks5h"):
        if importlib.util.find_spec("socksio") is None:
            raise ImportError(
                "Using SOCKS proxy, but the 'socksio' package is not installed. "
                "Make sure to install httpx using `pip install httpx[socks]`."
            )
        return "socks"
    raise ValueError(
        "Proxy protocol must be either 'http', 'https', 'socks5', or 'socks5h',"
        f" but got {scheme!r}."
    )


def as_proxy(proxy: httpx.Proxy | httpx.URL | str | None) -> httpx.Proxy | None:
    """A `httpx.Proxy` for what httpx's ``proxy=`` takes."""
    if proxy is None or isinstance(proxy, httpx.Proxy):
        return proxy
    return httpx.Proxy(url=proxy)


def retry_options(dependency: Dependency, request: httpx.Request) -> dict[str, Any]:
    """The arguments of `deadlines.retry.run_async` / `run_sync` for `request`."""
    return {
        "policy": dependency.retry,
        "method": request.method,
        "idempotency_key": "idempotency-key" in request.headers,
        "replayable": isinstance(request.stream, httpx.ByteStream),
        "request_sent": request_sent,
        "dependency": dependency,
    }
