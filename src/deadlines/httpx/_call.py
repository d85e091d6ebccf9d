"""`Call`: one attempt's limits and progress, shared by the transport, pool and backend.

The network backend asks the current call (a context variable, `current`) for the
timeout of each socket operation, so every wait is bounded by the limit of its phase
*and* by the call's end; the boundary asks it which limit was in force when a timeout
fired.
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import Mapping
from typing import Any

from .. import _clock
from .._budget import CallBudget, Limit
from .._dependency import Dependency
from .._errors import Phase, also
from ..wire import HEADER
from ._lib import anyio, httpcore, httpx

_HEADER_BYTES = HEADER.encode("ascii")


class Call:
    """One attempt: its `CallBudget`, the phase it is in, and what it holds.

    ``connection`` is the httpcore connection the pool gave it; ``opened`` the socket
    stream it opened itself, if any (closed with the connection when that is dropped,
    whatever state httpcore was left in).
    """

    __slots__ = (
        "budget",
        "connect_end",
        "connection",
        "headers",
        "headers_end",
        "limit",
        "op_cap",
        "opened",
        "phase",
        "proxied",
        "read_cap",
        "request_sent",
        "scope",
        "stream",
        "stream_id",
        "write_cap",
    )

    def __init__(self, budget: CallBudget) -> None:
        self.budget = budget
        self.phase: Phase = "pool"
        self.limit: Limit = "pool"
        self.request_sent = False
        self.connect_end = 0.0
        self.headers_end = 0.0
        #: The outgoing request's header list, while the header is ours to refresh.
        self.headers: list[tuple[bytes, bytes]] | None = None
        #: Async with HTTP/2 enabled: the cancel scope bounding the wait for the response
        #: head, its deadline moved along as the phases begin (`follow`).
        self.scope: anyio.CancelScope | None = None
        self.connection: Any = None
        self.opened: Any = None
        #: Through a proxy, the I/O before the request head (a CONNECT, a SOCKS
        #: handshake) is part of connecting: only the trace hook's send event, for a
        #: request that is not a CONNECT, begins the headers window.
        self.proxied = False
        #: httpx's own read and write timeouts (``timeout=``): each read or write of the
        #: request and its head is bounded by them too, as httpx bounds it.
        self.read_cap: float | None = None
        self.write_cap: float | None = None
        #: The per-operation cap that bounds the operation in progress, if it is shorter.
        self.op_cap: float | None = None
        #: HTTP/2: the shared connection's stream and this request's stream id on it.
        self.stream: Any = None
        self.stream_id: int | None = None

    def follow(self, seconds: float) -> None:
        """Move the cancel scope's deadline (if any) to `seconds` from now."""
        if self.scope is not None:
            self.scope.deadline = anyio.current_time() + seconds

    def connect_timeout(self) -> float:
        """Start the connect window (DNS, TCP, TLS) and return its length."""
        self.phase, self.limit = "connect", "connect"
        timeout = self.budget.limit("connect")
        self.connect_end = _clock.now() + timeout
        self.follow(timeout)
        return timeout

    def connect_left(self) -> float:
        """What is left of the connect window (for the TCP connect after DNS, for TLS)."""
        self.limit = "connect"
        return max(0.0, self.connect_end - _clock.now())

    def begin_headers(self) -> None:
        """The request is being sent: start the window for the response to begin."""
        if self.phase in ("pool", "connect"):
            self.phase, self.limit = "headers", "headers"
            self.request_sent = self.budget.request_sent = True
            timeout = self.budget.limit("headers")
            self.headers_end = _clock.now() + timeout
            self.follow(timeout)

    def begin_body(self) -> None:
        """The response headers arrived; from now on each read is an idle gap."""
        self.phase, self.limit = "body", "idle"

    def io_timeout(self, *, writing: bool = False) -> float:
        """Timeout for one read or write: the headers window, or an idle gap in the body.

        In the headers window a read (or write) is also bounded by httpx's own read (or
        write) timeout, where that is shorter.
        """
        if self.phase in ("pool", "connect"):
            if self.proxied and self.phase == "connect":  # still reaching the origin
                return self.connect_left()
            self.begin_headers()
        self.op_cap = None
        if self.phase == "headers":
            self.limit = "headers"
            left = max(0.0, self.headers_end - _clock.now())
            cap = self.write_cap if writing else self.read_cap
            if cap is not None and cap < left:
                self.op_cap = cap
                return cap
            return left
        self.limit = "idle"
        return self.budget.limit("idle")

    def error(self, cause: BaseException | None = None, phase: Phase | None = None) -> TimeoutError:
        """The error for the limit in force when a timeout fired: ours, and httpx's too.

        httpx's class is that of httpcore's (or httpx's) timeout `cause` when there is
        one, else that of the phase the limit cut: pool, connect, or a read. `phase`
        says where the call was, when the limit is the total.
        """
        error = self.budget.timeout(
            self.limit, request_sent=self.request_sent, phase=phase, cap=self.op_cap
        )
        theirs = _HTTPX_TIMEOUTS.get(type(cause)) if cause is not None else None
        return also(error, theirs or _PHASE_TIMEOUTS[error.phase or "body"])

    def header_value(self) -> bytes:
        """The remaining time to send onward, whole ms."""
        return self.budget.header_ms().encode("ascii")

    def connected(self, stream: Any) -> None:
        """This call opened `stream`: the time it took is no longer the next hop's."""
        if self.opened is None:
            self.opened = stream
        if self.headers is not None:
            set_header(self.headers, self.header_value())

    def on_send(self, name: str, info: Any) -> None:
        """Trace hook: the request head is about to go out; refresh the header, start headers."""
        if name not in _SEND_EVENTS or info["request"].method == b"CONNECT":
            return
        self.begin_headers()
        self.stream_id = info.get("stream_id")  # HTTP/2 only
        set_header(info["request"].headers, self.header_value())


# httpx's timeout for each of httpcore's, and for each phase a limit of ours can cut.
_HTTPX_TIMEOUTS: dict[type[BaseException], type[httpx.TimeoutException]] = {
    httpcore.PoolTimeout: httpx.PoolTimeout,
    httpcore.ConnectTimeout: httpx.ConnectTimeout,
    httpcore.ReadTimeout: httpx.ReadTimeout,
    httpcore.WriteTimeout: httpx.WriteTimeout,
    httpx.PoolTimeout: httpx.PoolTimeout,
    httpx.ConnectTimeout: httpx.ConnectTimeout,
    httpx.ReadTimeout: httpx.ReadTimeout,
    httpx.WriteTimeout: httpx.WriteTimeout,
}
_PHASE_TIMEOUTS: dict[str, type[httpx.TimeoutException]] = {
    "pool": httpx.PoolTimeout,
    "connect": httpx.ConnectTimeout,
    "headers": httpx.ReadTimeout,
    "body": httpx.ReadTimeout,
}
_SEND_EVENTS = frozenset(
    {"http11.send_request_headers.started", "http2.send_request_headers.started"}
)


def set_header(headers: list[tuple[bytes, bytes]], value: bytes) -> None:
    """Replace the value of ``x-request-timeout-ms`` in a raw header list."""
    for i, (key, _) in enumerate(headers):
        if key.lower() == _HEADER_BYTES:
            headers[i] = (key, value)


def start(
    dependency: Dependency, timeout: Mapping[str, float | None] | None, *, proxied: bool = False
) -> Call:
    """A new attempt under `dependency` and the request's httpx `timeout`, if any.

    Reported to observers (`BudgetExhausted` here: nothing was sent).
    """
    call = Call(CallBudget(narrowed(dependency, timeout)))
    if timeout:
        call.read_cap, call.write_cap = timeout.get("read"), timeout.get("write")
    call.proxied = proxied
    call.budget.__enter__()
    return call


def narrowed(dependency: Dependency, timeout: Mapping[str, float | None] | None) -> Dependency:
    """`dependency` with its caps lowered by an httpx timeout, where that is shorter.

    httpx's ``timeout=`` (the client's, or a request's) is a cap like the dependency's:
    connect caps the connect window, pool the wait for a place, read each silence in
    the body. Reads and writes of the request and its head are capped one by one
    (`Call.read_cap`, `Call.write_cap`), as httpx caps them.
    """
    if not timeout:
        return dependency
    return _narrowed(dependency, timeout.get("connect"), timeout.get("read"), timeout.get("pool"))


@functools.lru_cache(maxsize=64)
def _narrowed(
    dependency: Dependency, connect: float | None, read: float | None, pool: float | None
) -> Dependency:
    def lower(cap: float, given: float | None) -> float:
        return cap if given is None else max(min(cap, given), 1e-6)

    connect_cap, idle = lower(dependency.connect, connect), lower(dependency.idle, read)
    pool_wait = dependency.pool_wait if pool is None else min(dependency.pool_wait, pool)
    if (connect_cap, idle, pool_wait) == (
        dependency.connect,
        dependency.idle,
        dependency.pool_wait,
    ):
        return dependency
    return Dependency(
        dependency.name,
        connect=connect_cap,
        headers=dependency.headers,
        idle=idle,
        total=dependency.total,
        pool_size=dependency.pool_size,
        pool_wait=pool_wait,
        min_useful=dependency.min_useful,
        retry=dependency.retry,
        retry_budget=dependency.retry_budget,
        throttle=dependency.throttle,
        limit=dependency.limit,
        hedge=dependency.hedge,
    )


current: contextvars.ContextVar[Call | None] = contextvars.ContextVar(
    "deadlines.httpx.call", default=None
)
