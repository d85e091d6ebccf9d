"""What every inbound middleware configures the same way: route limits, the 504's body.

`Limits` and `limits` (a route's own budget), `RouteTable` (limits per path pattern),
the header name a server reads, and the 504's JSON body naming the limit that ran out.
A request's own deadline is `_request.Request`. Standard library only.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from . import _validate, wire

F = TypeVar("F", bound=Callable[..., Any])

#: Attribute that `limits` puts on a handler (or a FastAPI dependency).
LIMITS_ATTRIBUTE = "__deadlines_limits__"

#: Route label for requests that match no known route (keeps metrics cardinality low).
UNMATCHED = "*"


@dataclass(frozen=True, slots=True, init=False)
class Limits:
    """A route's own budget: `default` without a valid header, never more than `maximum`."""

    default: float
    maximum: float

    def __init__(self, *, default: float | timedelta, maximum: float | timedelta) -> None:
        """Validate both (seconds or timedelta, finite, > 0) and that default <= maximum."""
        default_s = _validate.seconds(default, "default", allow_zero=False)
        maximum_s = _validate.seconds(maximum, "maximum", allow_zero=False)
        if default_s > maximum_s:
            raise ValueError(f"default ({default_s} s) must not exceed maximum ({maximum_s} s)")
        object.__setattr__(self, "default", default_s)
        object.__setattr__(self, "maximum", maximum_s)


def limits(*, default: float | timedelta, maximum: float | timedelta) -> Callable[[F], F]:
    """Decorate a handler with its own default budget and maximum.

        @deadlines.asgi.limits(default=10, maximum=30)
        async def report(request): ...

    The inbound middleware reads the mark before the handler runs, so the route's
    limits apply from arrival (Starlette and FastAPI routes, aiohttp.web handlers).
    """
    mark = Limits(default=default, maximum=maximum)

    def decorate(handler: F) -> F:
        setattr(handler, LIMITS_ATTRIBUTE, mark)
        return handler

    return decorate


def limits_of(handler: object) -> Limits | None:
    """The `Limits` a handler was marked with, or None."""
    found = getattr(handler, LIMITS_ATTRIBUTE, None)
    return found if isinstance(found, Limits) else None


class RouteTable:
    """Limits per path pattern: ``"/exact"``, ``"/prefix/*"``, optionally ``"POST /path"``.

    Exact paths win over prefixes, a longer prefix over a shorter one, and a pattern
    with a method over the same pattern without one.
    """

    __slots__ = ("_exact", "_prefixes", "fallback")

    def __init__(self, routes: Mapping[str, Limits] | None, fallback: Limits) -> None:
        self.fallback = fallback
        self._exact: dict[tuple[str, str], tuple[str, Limits]] = {}
        prefixes: list[tuple[int, int, str, str, str, Limits]] = []
        for key, value in (routes or {}).items():
            if not isinstance(key, str) or not key.strip():
                raise ValueError(f"route patterns must be non-empty strings, got {key!r}")
            if not isinstance(value, Limits):
                raise TypeError(f"route {key!r} must map to a Limits, not {value!r}")
            method, _, path = key.strip().rpartition(" ")
            method = method.strip().upper()
            if not path.startswith("/"):
                raise ValueError(f"route pattern {key!r} must start with '/' (after a method)")
            if path.endswith("*"):
                prefix = path[:-1]
                prefixes.append((len(prefix), bool(method), method, prefix, key, value))
            else:
                self._exact[(method, path)] = (key, value)
        prefixes.sort(key=lambda item: (item[0], item[1]), reverse=True)
        self._prefixes = [
            (method, prefix, key, value) for _, _, method, prefix, key, value in prefixes
        ]

    def match(self, method: str, path: str) -> tuple[str | None, Limits]:
        """The matching pattern (None when none matched) and its limits.

        HEAD is matched as GET unless a pattern names HEAD: frameworks answer HEAD with
        the GET handler, so it does the same work.
        """
        if method == "HEAD" and not self._names(method, path):
            method = "GET"
        hit = self._exact.get((method, path)) or self._exact.get(("", path))
        if hit is not None:
            return hit
        for wanted, prefix, key, value in self._prefixes:
            if path.startswith(prefix) and (not wanted or wanted == method):
                return key, value
        return None, self.fallback

    def _names(self, method: str, path: str) -> bool:
        """Whether a pattern naming `method` matches `path`."""
        if (method, path) in self._exact:
            return True
        return any(w == method and path.startswith(p) for w, p, _, _ in self._prefixes)


def header_name(header: str) -> str:
    """Validate the name of the milliseconds header and return it lower-case."""
    if not isinstance(header, str) or not header.strip() or not header.isascii():
        raise ValueError(f"header must be a non-empty ASCII header name, got {header!r}")
    return header.strip().lower()


def renamed(pairs: Iterable[tuple[bytes, bytes]], header: bytes) -> list[tuple[bytes, bytes]]:
    """Header pairs where `header` stands in for ``x-request-timeout-ms``.

    A server configured with its own header name reads that one instead of ours;
    grpc-timeout and Envoy's header are always understood.
    """
    ours = wire.HEADER.encode()
    out: list[tuple[bytes, bytes]] = []
    for key, value in pairs:
        lowered = key.lower()
        if lowered == header:
            out.append((ours, value))
        elif lowered != ours:
            out.append((key, value))
    return out


def binding_limit(headers: Iterable[tuple[Any, Any]], limits: Limits, header: str) -> str:
    """Which limit set the budget: a header's name, "route maximum" or "route default".

    `headers` are the request's deadline headers as (name, value) pairs, str or bytes,
    with ``x-request-timeout-ms`` standing for `header` (see `renamed`). The name given
    is the header whose value was the smallest valid one (`header` for ours): the one a
    caller has to look at. Only a 504 asks, so each pair is parsed on its own.
    """
    best: float | None = None
    name = ""
    for pair in headers:
        seconds = wire.header_budget((pair,))
        if seconds is not None and (best is None or seconds < best):
            best, name = seconds, _text(pair[0]).lower()
    if best is None:
        return "route default"
    if best > limits.maximum:
        return "route maximum"
    return header if name == wire.HEADER else name


def _text(name: str | bytes) -> str:
    return name.decode("latin-1") if isinstance(name, bytes) else name


def timeout_body(*, limit: str, budget: float, elapsed: float) -> bytes:
    """The short JSON body of a 504 answer, naming the limit that ran out."""
    return json.dumps(
        {
            "error": "deadline exceeded",
            "limit": limit,
            # Rounded, not truncated: a 60 ms header less a 50 ms reserve is 0.00999... s.
            "budget_ms": round(budget * 1000),
            "elapsed_ms": round(elapsed * 1000),
        },
        separators=(",", ":"),
    ).encode()
