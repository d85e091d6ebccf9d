"""What a client or transport takes: the dependency, httpx's options, the retry rule."""

from __future__ import annotations

import ssl
import typing
from typing import Any

from .._dependency import Dependency
from ._boundary import request_sent
from ._lib import httpx

_TRANSPORT_OPTIONS = frozenset(
    {
        "verify",
        "cert",
        "trust_env",
        "http1",
        "http2",
        "keepalive_expiry",
        "local_address",
        "uds",
        "socket_options",
    }
)
_DECIDED_BY_DEPENDENCY = ("timeout", "limits", "transport", "mounts", "proxy")


def check_dependency(dependency: Dependency) -> None:
    """Refuse anything but a `Dependency`, with a message that says so."""
    if not isinstance(dependency, Dependency):
        raise TypeError(f"dependency must be a deadlines.Dependency, not {dependency!r}")


def split_options(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take the transport's options out of `kwargs`; refuse what the dependency decides."""
    for name in _DECIDED_BY_DEPENDENCY:
        if name in kwargs:
            raise TypeError(
                f"{name}= is decided by the deadlines.Dependency (limits, pool size) and"
                " cannot be passed to a deadlines.httpx client"
            )
    options = {key: kwargs.pop(key) for key in list(kwargs) if key in _TRANSPORT_OPTIONS}
    if "trust_env" in options:
        kwargs["trust_env"] = options["trust_env"]
    return options


def factory_options(
    dependency: Dependency,
    *,
    verify: ssl.SSLContext | str | bool,
    cert: Any,
    trust_env: bool,
    http1: bool,
    http2: bool,
    keepalive_expiry: float | None,
    local_address: str | None,
    uds: str | None,
    socket_options: typing.Iterable[Any] | None,
) -> dict[str, Any]:
    """The options of the httpcore pool that makes this dependency's connections."""
    return {
        "ssl_context": httpx.create_ssl_context(verify=verify, cert=cert, trust_env=trust_env),
        "max_connections": dependency.pool_size,
        "max_keepalive_connections": dependency.pool_size,
        "keepalive_expiry": keepalive_expiry,
        "http1": http1,
        "http2": http2,
        "local_address": local_address,
        "uds": uds,
        "socket_options": socket_options,
    }


def retry_options(dependency: Dependency, request: httpx.Request) -> dict[str, Any]:
    """The arguments of `deadlines.retry.run_async` / `run_sync` for `request`."""
    return {
        "policy": dependency.retry,
        "method": request.method,
        "idempotency_key": "idempotency-key" in request.headers,
        "replayable": isinstance(request.stream, httpx.ByteStream),
        "min_attempt": dependency.min_useful,
        "request_sent": request_sent,
    }
