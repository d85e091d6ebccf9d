"""`session` and `middleware`: an aiohttp `ClientSession` whose every request is bounded."""

from __future__ import annotations

import math
from typing import Any

from .._dependency import Dependency
from ._aiohttp import Connector
from ._lib import aiohttp
from ._middleware import Middleware
from ._response import Response

#: aiohttp's timers, all off unless the user sets some: this package keeps the time
#: itself, without rounding.
_NO_TIMEOUT = aiohttp.ClientTimeout(  # deadlines: ignore[DLN101] every phase bounded here
    total=None, connect=None, sock_read=None, sock_connect=None, ceil_threshold=math.inf
)
#: Options of aiohttp's `TCPConnector` that `session` takes, for the pool it makes.
_CONNECTOR_OPTIONS = frozenset(
    {
        "ssl",
        "verify_ssl",
        "fingerprint",
        "use_dns_cache",
        "ttl_dns_cache",
        "family",
        "ssl_context",
        "local_addr",
        "resolver",
        "keepalive_timeout",
        "force_close",
        "enable_cleanup_closed",
        "happy_eyeballs_delay",
        "interleave",
        "socket_factory",
        "ssl_shutdown_timeout",
    }
)


def session(dependency: Dependency, **kwargs: Any) -> aiohttp.ClientSession:
    """An `aiohttp.ClientSession` whose every request is bounded by `dependency`.

    The session is aiohttp's own class, used as usual: ``get``, ``post``, ``request``,
    ``ws_connect``, ``cookie_jar``, ... Takes every `aiohttp.ClientSession` argument,
    and the options of aiohttp's ``TCPConnector`` (``ssl=``, ``resolver=``,
    ``family=``, ...) for the pool it makes for the dependency: ``limit=pool_size``,
    every phase told apart. Its first middleware is a `Middleware` of `dependency`; the
    caller's own middlewares and trace configs run inside it.

    What the caller may also pass: ``timeout=`` (aiohttp's own timers, on top of the
    dependency's limits; none by default), ``connector=`` (then the middleware cannot
    tell the pool, connect and headers phases apart: the head is bounded by the call's
    total and the deadline), ``response_class=`` (a subclass of `Response` keeps the
    end-of-call report at release). A request given its own ``middlewares=`` replaces
    the session's, ours included: put ``deadlines.aiohttp.middleware(dependency)``
    first in it. Create the session inside a running event loop.
    """
    if not isinstance(dependency, Dependency):
        raise TypeError(f"dependency must be a deadlines.Dependency, not {dependency!r}")
    connector_options = {k: kwargs.pop(k) for k in list(kwargs) if k in _CONNECTOR_OPTIONS}
    own_connector = kwargs.get("connector") is None
    if own_connector:
        kwargs["connector"] = Connector(
            limit=dependency.pool_size,
            limit_per_host=0,
            timeout_ceil_threshold=math.inf,
            **connector_options,
        )
    elif connector_options:
        raise TypeError(
            f"{', '.join(sorted(connector_options))}: options of the connector this"
            " session makes; with connector= of your own, set them on it"
        )
    kwargs.setdefault("timeout", _NO_TIMEOUT)
    kwargs["response_class"] = _response_class(kwargs.get("response_class"))
    ours = Middleware(
        dependency,
        own_connector=own_connector,
        eager=bool(kwargs.get("middlewares") or kwargs.get("trace_configs")),
    )
    kwargs["middlewares"] = (ours, *kwargs.get("middlewares", ()))
    return aiohttp.ClientSession(**kwargs)


def middleware(dependency: Dependency) -> Middleware:
    """The `Middleware` bounding a request by `dependency`, for a session of your own.

    ``aiohttp.ClientSession(middlewares=[deadlines.aiohttp.middleware(dep)],
    response_class=deadlines.aiohttp.Response)``: every request inside the deadline and
    the dependency's total, the body's reads by its idle gap; for the pool and connect
    phases apart, use `session`, whose connector reports them.
    """
    return Middleware(dependency, own_connector=False, eager=True)


_MIXED: dict[type[aiohttp.ClientResponse], type[Response]] = {}


def _response_class(given: type[aiohttp.ClientResponse] | None) -> type[Response]:
    """`Response`, or the caller's response class with it mixed in (made once)."""
    if given is None or issubclass(given, Response):
        return given or Response
    mixed = _MIXED.get(given)
    if mixed is None:
        mixed = _MIXED[given] = type(given.__name__, (Response, given), {})
    return mixed
