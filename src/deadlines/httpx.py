"""httpx with every phase of a call bounded, inside the request's deadline.

    import deadlines, deadlines.httpx

    pricing = deadlines.Dependency("pricing", connect=0.5, headers=1.0, total=2.0, pool_size=10)

    async with deadlines.httpx.AsyncClient(pricing, base_url="http://pricing") as client:
        async with deadlines.scope(2.0):
            response = await client.get("/prices/42")

`AsyncTransport` and `Transport` compose with any httpx client (pass them as
``transport=``); `AsyncClient` and `Client` are httpx clients built on them. For every
request, from the `Dependency` and the current deadline (`deadlines.CallBudget`):

* below `min_useful` remaining → `BudgetExhausted`, nothing sent;
* pool acquire ≤ min(pool_wait, time left); the pool holds `pool_size` connections for
  this dependency alone, and the time spent in it counts toward the call's total;
* DNS + TCP connect + TLS ≤ min(connect, time left), as one window;
* sending the request and waiting for the first byte of the response ≤ min(headers,
  time left), as one window (a server trickling its headers cannot stretch it);
* each gap in the body ≤ idle; the whole call, body included, also when streamed,
  ≤ min(total, the request's deadline);
* ``x-request-timeout-ms`` carries the time left: set once the call is admitted to the
  pool, refreshed after a new connection is up.

The blocking transport resolves names in a thread (`_Resolver`), so that DNS too ends
with the connect window. With ``http2=True`` the requests to one origin are streams on
one connection, and each keeps its own limits: a stream whose limit fires is reset
(RST_STREAM) and the connection serves the others on.

Each limit that fires is raised as the matching `CallTimeout` subclass (or
`DeadlineExceeded` when the request's deadline was the binding limit), translated from
httpcore's errors at one boundary. Other transport errors are httpx's own
(`httpx.ConnectError`, `httpx.ReadError`, ...). The time spent waiting for a pooled
connection is in ``response.extensions["deadlines.pool_wait"]`` (seconds) and in the
error's ``pool_wait``. With ``dependency.retry`` set, failed attempts are retried inside
the budget by the rules of `deadlines.retry`.

The limits come from the `Dependency` only: an httpx ``timeout=`` on a client that uses
these transports is ignored. Cancelling the surrounding task (a `deadlines.scope`
firing, or the caller leaving) closes the socket at once in every phase, the TLS
handshake included.
"""

from __future__ import annotations

import contextlib
import contextvars
import ipaddress
import socket
import ssl
import threading
import typing
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, Literal, NoReturn

try:
    import anyio
    import httpcore
    import httpx
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "deadlines.httpx needs httpx: install it with `pip install 'deadlines[httpx]'`"
    ) from exc

from . import _clock, retry
from ._budget import CallBudget, Limit
from ._dependency import Dependency
from .wire import HEADER

__all__ = ["POOL_WAIT", "AsyncClient", "AsyncTransport", "Client", "Transport"]

#: Key of ``response.extensions`` holding the seconds spent waiting for a pooled connection.
POOL_WAIT = "deadlines.pool_wait"

_HEADER_BYTES = HEADER.encode("ascii")
_SEND_EVENTS = frozenset(
    {"http11.send_request_headers.started", "http2.send_request_headers.started"}
)
_MIN_SYNC_TIMEOUT = 1e-6  # socket.settimeout(0) would mean non-blocking, not "expired"

_Phase = Literal["pool", "connect", "headers", "body"]


class _Call:
    """One attempt's limits and progress, shared by the transport, backend and trace hook.

    The network backend asks it for the timeout of each socket operation, so every wait
    is bounded by the limit of its phase *and* by the call's end; the boundary asks it
    which limit was in force when httpcore reported a timeout.
    """

    __slots__ = (
        "budget",
        "connect_end",
        "headers",
        "headers_end",
        "limit",
        "phase",
        "request_sent",
        "scope",
        "stream",
        "stream_id",
    )

    def __init__(self, budget: CallBudget) -> None:
        self.budget = budget
        self.phase: _Phase = "pool"
        self.limit: Limit = "pool"
        self.request_sent = False
        self.connect_end = 0.0
        self.headers_end = 0.0
        #: The outgoing request's header list, while the header is ours to refresh.
        self.headers: list[tuple[bytes, bytes]] | None = None
        #: Async with HTTP/2 enabled: the cancel scope bounding the wait for the response
        #: head, its deadline moved along as the phases begin (`follow`).
        self.scope: anyio.CancelScope | None = None
        #: HTTP/2: the shared connection's stream and this request's stream id on it.
        self.stream: _AsyncStream | _SyncStream | None = None
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

    def io_timeout(self) -> float:
        """Timeout for one read or write: the headers window, or an idle gap in the body."""
        if self.phase in ("pool", "connect"):
            self.begin_headers()
        if self.phase == "headers":
            self.limit = "headers"
            return max(0.0, self.headers_end - _clock.now())
        self.limit = "idle"
        return self.budget.limit("idle")

    def error(self) -> TimeoutError:
        """The taxonomy error for the limit in force when a timeout fired."""
        return self.budget.timeout(self.limit, request_sent=self.request_sent)

    def header_value(self) -> bytes:
        """The remaining time to send onward, whole ms."""
        return self.budget.header_ms().encode("ascii")

    def connected(self) -> None:
        """A new connection is up: the time it took is no longer the next hop's."""
        if self.headers is not None:
            _set_header(self.headers, self.header_value())


def _set_header(headers: list[tuple[bytes, bytes]], value: bytes) -> None:
    for i, (key, _) in enumerate(headers):
        if key.lower() == _HEADER_BYTES:
            headers[i] = (key, value)


_current: contextvars.ContextVar[_Call | None] = contextvars.ContextVar(
    "deadlines.httpx.call", default=None
)


# The one boundary where httpcore's errors become ours (timeouts) or httpx's (the rest).

_NETWORK_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.ProtocolError, httpx.ProtocolError),
    (httpcore.NetworkError, httpx.NetworkError),
)


class _Expired(BaseException):
    """This request's limit ran out while it was reading for a shared HTTP/2 connection.

    Raised instead of httpcore's ``ReadTimeout``, which httpcore would keep and raise on
    every stream of the connection: as a `BaseException` (like a cancellation) it only
    ends this request's stream. Always translated at the boundary (`_translate`).
    """


def _translate(call: _Call, exc: BaseException) -> Exception | None:
    """Our error for httpcore's `exc` (a timeout: the taxonomy; else httpx's), or None."""
    if isinstance(exc, httpcore.TimeoutException | _Expired):
        return call.error()
    for theirs, ours in _NETWORK_ERRORS:
        if isinstance(exc, theirs):
            return ours(str(exc))
    return None


def _raise_translated(call: _Call, exc: BaseException, *, finish: bool = False) -> NoReturn:
    """Raise our error for `exc`, or `exc` itself when it is not httpcore's.

    With `finish`, first report the end of the call (a body read that failed).
    """
    error = _translate(call, exc)
    if finish:
        call.budget.finish(exc if error is None else error)
    if error is None:
        raise exc
    raise error from (None if isinstance(exc, _Expired) else exc)


def _fail(call: _Call, exc: BaseException) -> NoReturn:
    """A body read failed: report the end of the call and raise our error for it."""
    _raise_translated(call, exc, finish=True)


def _request_sent(exc: BaseException) -> bool | None:
    """For retries: whether `exc` may have reached the server (None: do not retry)."""
    if isinstance(exc, httpx.ConnectError):
        return False
    if isinstance(exc, httpx.ReadError | httpx.WriteError | httpx.RemoteProtocolError):
        return True
    return retry.request_sent(exc)


# Network backends: each socket operation bounded by the current call's limits.
#
# On an HTTP/2 connection ("shared": its requests are streams on one socket) a read is
# done by whichever request holds httpcore's read lock, for all of them, and httpcore
# keeps a read or write error and raises it on every stream. So no one request's limit
# may become a socket timeout there: async reads are bounded by the reading request's
# cancel scope instead (cancelling a read loses nothing), blocking reads raise
# `_Expired`, and writes are never cut midway (half a frame would break the connection
# for all): they are bounded by the writing call's end, but given at least
# `_SHARED_WRITE_MIN` seconds, after which the connection is given up.

_SHARED_WRITE_MIN = 1.0


def _shared_write_timeout(call: _Call | None) -> float:
    return max(_SHARED_WRITE_MIN, 0.0 if call is None else call.budget.left())


def _negotiated_h2(stream: httpcore.AsyncNetworkStream | httpcore.NetworkStream) -> bool:
    ssl_object = stream.get_extra_info("ssl_object")
    return ssl_object is not None and ssl_object.selected_alpn_protocol() == "h2"


class _AsyncStream(httpcore.AsyncNetworkStream):
    def __init__(self, inner: httpcore.AsyncNetworkStream, *, shared: bool = False) -> None:
        self._inner = inner
        self.shared = shared

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        call = _current.get()
        if self.shared:
            return await self._inner.read(max_bytes, None if call is not None else timeout)
        return await self._inner.read(max_bytes, timeout if call is None else call.io_timeout())

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        call = _current.get()
        if self.shared:
            if call is not None:
                call.stream = self
            with anyio.CancelScope(shield=True):
                await self._inner.write(buffer, _shared_write_timeout(call))
            return
        await self._inner.write(buffer, timeout if call is None else call.io_timeout())

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        call = _current.get()
        if call is not None:
            timeout = call.connect_left()
        try:
            stream = await self._inner.start_tls(ssl_context, server_hostname, timeout)
        except BaseException:
            # httpcore closes the TCP stream when the handshake fails but not when it is
            # cancelled: the socket then stayed open until garbage collection.
            with anyio.CancelScope(shield=True):
                await self._inner.aclose()
            raise
        if call is not None:
            call.connected()
        return _AsyncStream(stream, shared=_negotiated_h2(stream))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _AsyncBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, *, prior_knowledge: bool = False) -> None:
        self._inner = httpcore.AnyIOBackend()  # asyncio and trio alike
        #: HTTP/2 without TLS (``http1=False``): every TCP connection is shared.
        self._shared = prior_knowledge

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        call = _current.get()
        if call is not None:
            timeout = call.connect_timeout()
        stream = await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        if call is not None:
            call.connected()
        return _AsyncStream(stream, shared=self._shared)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        call = _current.get()
        if call is not None:
            timeout = call.connect_timeout()
        stream = await self._inner.connect_unix_socket(path, timeout, socket_options)
        if call is not None:
            call.connected()
        return _AsyncStream(stream, shared=self._shared)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def _sync_timeout(timeout: float) -> float:
    return max(_MIN_SYNC_TIMEOUT, timeout)


class _SyncStream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream, *, shared: bool = False) -> None:
        self._inner = inner
        self.shared = shared

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        call = _current.get()
        if call is None:
            return self._inner.read(max_bytes, timeout)
        timeout = _sync_timeout(call.io_timeout())
        if not self.shared:
            return self._inner.read(max_bytes, timeout)
        try:
            return self._inner.read(max_bytes, timeout)
        except httpcore.ReadTimeout:
            raise _Expired from None  # this request's limit, not the connection's

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        call = _current.get()
        if self.shared:
            if call is not None:
                call.stream = self
            self._inner.write(buffer, _shared_write_timeout(call))
            return
        if call is not None:
            timeout = _sync_timeout(call.io_timeout())
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        call = _current.get()
        if call is not None:
            timeout = _sync_timeout(call.connect_left())
        try:
            stream = self._inner.start_tls(ssl_context, server_hostname, timeout)
        except BaseException:
            self._inner.close()
            raise
        if call is not None:
            call.connected()
        return _SyncStream(stream, shared=_negotiated_h2(stream))

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


def _is_ip(host: str) -> bool:
    """Whether `host` is an IP literal, which needs no name resolution."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class _Lookup:
    """One `getaddrinfo` running in its thread; its answer or error once `done` is set."""

    __slots__ = ("addresses", "done", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.addresses: list[str] = []
        self.error: OSError | None = None


class _Resolver:
    """Name resolution for the blocking transport, each wait bounded by the caller.

    A blocking ``getaddrinfo`` cannot be interrupted, and `socket.create_connection`
    calls it with no timeout: a hung resolver held a call for as long as the system
    resolver retries (glibc: 5 s × 2 attempts per nameserver by default). Here each
    lookup runs in a daemon thread and the caller waits for it at most what is left of
    its connect window. A lookup abandoned that way runs on until the system resolver
    gives up, then its thread ends and its answer is dropped (nothing is cached). Hung
    lookups cannot pile up: a caller asking for a name and port already being looked up
    waits for that lookup instead of starting another, and at most `max_lookups` run at
    once (a caller beyond that waits for a place, inside its own window).
    """

    def __init__(self, max_lookups: int) -> None:
        self._lock = threading.Lock()
        self._places = threading.BoundedSemaphore(max_lookups)
        self._running: dict[tuple[str, int], _Lookup] = {}
        #: Lookups started so far (for tests: an IP literal starts none).
        self.started = 0

    def resolve(self, host: str, port: int, timeout: float) -> list[str]:
        """The addresses of `host`, in the resolver's order; ``ConnectTimeout`` after `timeout`."""
        end = _clock.now() + timeout
        lookup = self._lookup(host, port, timeout)
        if lookup is None or not lookup.done.wait(max(0.0, end - _clock.now())):
            raise httpcore.ConnectTimeout(
                f"resolving {host!r} took longer than the {timeout * 1000:.0f} ms left to connect"
            )
        if lookup.error is not None:
            raise httpcore.ConnectError(str(lookup.error)) from lookup.error
        return lookup.addresses

    def _lookup(self, host: str, port: int, timeout: float) -> _Lookup | None:
        """The running lookup of (`host`, `port`), started if needed; None: no place in time."""
        key = (host, port)
        with self._lock:
            lookup = self._running.get(key)
        if lookup is not None:
            return lookup
        if not self._places.acquire(timeout=timeout):
            return None
        with self._lock:
            lookup = self._running.get(key)
            if lookup is not None:  # started by another caller meanwhile
                self._places.release()
                return lookup
            lookup = self._running[key] = _Lookup()
            self.started += 1
        thread = threading.Thread(
            target=self._run, args=(key, lookup), name="deadlines-resolve", daemon=True
        )
        try:
            thread.start()
        except BaseException:
            self._done(key, lookup)
            raise
        return lookup

    def _run(self, key: tuple[str, int], lookup: _Lookup) -> None:
        try:
            infos = socket.getaddrinfo(*key, type=socket.SOCK_STREAM)
            lookup.addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        except OSError as exc:
            lookup.error = exc
        finally:
            self._done(key, lookup)

    def _done(self, key: tuple[str, int], lookup: _Lookup) -> None:
        with self._lock:
            del self._running[key]
        self._places.release()
        lookup.done.set()


#: Distinct names the blocking transports may be resolving at once, hung ones included.
_MAX_LOOKUPS = 16
_resolver = _Resolver(_MAX_LOOKUPS)


class _SyncBackend(httpcore.NetworkBackend):
    def __init__(self, *, prior_knowledge: bool = False) -> None:
        self._inner = httpcore.SyncBackend()
        self._shared = prior_knowledge

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        call = _current.get()
        if call is None or _is_ip(host):
            if call is not None:
                timeout = _sync_timeout(call.connect_timeout())
            stream = self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        else:
            stream = self._connect_by_name(call, host, port, local_address, socket_options)
        if call is not None:
            call.connected()
        return _SyncStream(stream, shared=self._shared)

    def _connect_by_name(
        self,
        call: _Call,
        host: str,
        port: int,
        local_address: str | None,
        socket_options: typing.Iterable[Any] | None,
    ) -> httpcore.NetworkStream:
        """Resolve in a thread, then try each address, all inside the connect window."""
        addresses = _resolver.resolve(host, port, call.connect_timeout())
        options = None if socket_options is None else list(socket_options)
        error: Exception | None = None
        for address in addresses:
            left = call.connect_left()
            if left <= 0.0:
                raise httpcore.ConnectTimeout(f"no time left to connect to {host!r}")
            try:
                return self._inner.connect_tcp(
                    address, port, _sync_timeout(left), local_address, options
                )
            except httpcore.ConnectError as exc:  # refused, unreachable: try the next one
                error = exc
        raise error or httpcore.ConnectError(f"{host!r} resolved to no address")

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        call = _current.get()
        if call is not None:
            timeout = _sync_timeout(call.connect_timeout())
        stream = self._inner.connect_unix_socket(path, timeout, socket_options)
        if call is not None:
            call.connected()
        return _SyncStream(stream, shared=self._shared)

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


# Shared request plumbing.


def _core_request(
    request: httpx.Request, call: _Call, stream: Any, trace: Callable[..., Any] | None
) -> httpcore.Request:
    extensions = dict(request.extensions)
    if trace is not None:
        extensions["trace"] = trace
    left = call.budget.left()  # fallbacks: the backend refines each operation's timeout
    extensions["timeout"] = {"pool": left, "connect": left, "read": left, "write": left}
    return httpcore.Request(
        method=request.method,
        url=httpcore.URL(
            scheme=request.url.raw_scheme,
            host=request.url.raw_host,
            port=request.url.port,
            target=request.url.raw_path,
        ),
        headers=request.headers.raw,
        content=stream,
        extensions=extensions,
    )


# Without a trace hook of the caller's (and on HTTP/1.1), none is installed: httpcore
# awaits a trace hook for ~10 events per request. The header set once admitted is then
# refreshed after a new connection (`_Call.connected`) and the first write starts the
# headers window (`_Call.io_timeout`). With HTTP/2, whose requests share a connection,
# the send event refreshes the header itself.


def _on_send(call: _Call, name: str, info: Mapping[str, Any]) -> None:
    """Trace hook: the request head is about to go out; refresh the header, start headers."""
    if name not in _SEND_EVENTS:
        return
    call.begin_headers()
    call.stream_id = info.get("stream_id")  # HTTP/2 only
    _set_header(info["request"].headers, call.header_value())


def _async_trace(call: _Call, user_trace: Any) -> Callable[..., Any]:
    async def trace(name: str, info: Mapping[str, Any]) -> None:
        _on_send(call, name, info)
        if user_trace is not None:
            await user_trace(name, info)

    return trace


def _sync_trace(call: _Call, user_trace: Any) -> Callable[..., Any]:
    def trace(name: str, info: Mapping[str, Any]) -> None:
        _on_send(call, name, info)
        if user_trace is not None:
            user_trace(name, info)

    return trace


# HTTP/2: a stream given up on (a limit fired, the caller left, the body was not read to
# its end) is reset. httpcore 1.0 forgets such a stream but neither sends RST_STREAM nor
# tells h2 (encode/httpcore#1022): the server worked on, and once 100 streams had been
# dropped that way h2 refused new ones on the connection ("Max outbound streams is 100,
# 100 open"). This reaches into httpcore's connection objects, and does nothing when
# they are not as expected.


def _h2_connection(connections: Iterable[Any], stream: object) -> Any | None:
    """The httpcore HTTP/2 connection that writes to our `stream`, if still pooled."""
    for connection in connections:
        inner = getattr(connection, "_connection", None)
        if getattr(inner, "_network_stream", None) is stream and hasattr(inner, "_h2_state"):
            return inner
    return None


def _reset_stream(connection: Any, stream_id: int) -> bool:
    """Reset `stream_id` in the connection's h2 state; False if it had ended already."""
    import h2.errors  # HTTP/2 is optional: imported once it is in use
    import h2.exceptions

    try:
        connection._h2_state.reset_stream(stream_id, error_code=h2.errors.ErrorCodes.CANCEL)
    except h2.exceptions.ProtocolError:  # closed: ended, reset by the server, or gone
        return False
    return True


async def _abandon_async(pool: httpcore.AsyncConnectionPool, call: _Call, core: Any) -> None:
    """Reset the call's HTTP/2 stream and send the RST_STREAM (shielded, bounded)."""
    if call.stream is None or call.stream_id is None:
        return
    connection = _h2_connection(pool.connections, call.stream)
    if connection is None or not _reset_stream(connection, call.stream_id):
        return
    # A failed write means a broken connection, which httpcore has marked so.
    with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
        await connection._write_outgoing_data(core)


def _abandon_sync(pool: httpcore.ConnectionPool, call: _Call, core: Any) -> None:
    """The blocking twin of `_abandon_async`."""
    if call.stream is None or call.stream_id is None:
        return
    connection = _h2_connection(pool.connections, call.stream)
    if connection is None or not _reset_stream(connection, call.stream_id):
        return
    with contextlib.suppress(Exception):  # broken: httpcore has marked it so
        connection._write_outgoing_data(core)


def _attempt_budget(dependency: Dependency) -> _Call:
    call = _Call(CallBudget(dependency))  # BudgetExhausted here: nothing was sent
    call.budget.__enter__()
    return call


def _response(call: _Call, core: httpcore.Response, stream: Any) -> httpx.Response:
    extensions = dict(core.extensions)
    extensions[POOL_WAIT] = call.budget.pool_wait
    return httpx.Response(
        status_code=core.status, headers=core.headers, stream=stream, extensions=extensions
    )


def _retry_options(dependency: Dependency, request: httpx.Request) -> dict[str, Any]:
    return {
        "policy": dependency.retry,
        "method": request.method,
        "idempotency_key": "idempotency-key" in request.headers,
        "replayable": isinstance(request.stream, httpx.ByteStream),
        "min_attempt": dependency.min_useful,
        "request_sent": _request_sent,
    }


def _check_dependency(dependency: Dependency) -> None:
    if not isinstance(dependency, Dependency):
        raise TypeError(f"dependency must be a deadlines.Dependency, not {dependency!r}")


# The async transport.


class _AsyncGate:
    """The dependency's pool: at most `size` calls in flight, waits bounded and measured."""

    def __init__(self, size: int) -> None:
        self._semaphore = anyio.Semaphore(size)

    async def acquire(self, call: _Call) -> None:
        try:
            self._semaphore.acquire_nowait()
        except anyio.WouldBlock:
            start = _clock.now()
            try:
                with anyio.move_on_after(call.budget.limit("pool")) as waited:
                    await self._semaphore.acquire()
            finally:
                call.budget.pool_wait = _clock.now() - start
            if waited.cancelled_caught:
                raise call.error() from None
        else:
            call.budget.pool_wait = 0.0  # a free place: no wait at all

    def release(self) -> None:
        self._semaphore.release()


class _AsyncBody(httpx.AsyncByteStream):
    """The response body: each chunk read under the call's limits, errors translated.

    With `abandon` (HTTP/2 enabled) each chunk is also awaited in a cancel scope ending
    at the idle limit, and a body closed before its end has its stream reset.
    """

    def __init__(
        self,
        inner: Any,
        call: _Call,
        release: Callable[[], None],
        abandon: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._inner = inner
        self._call = call
        self._release: Callable[[], None] | None = release
        self._abandon = abandon
        self._ended = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        call = self._call
        iterator = self._inner.__aiter__()
        while True:
            token = _current.set(call)
            try:
                if self._abandon is None:
                    chunk = await iterator.__anext__()
                else:
                    chunk = await self._next_bounded(iterator)
            except StopAsyncIteration:
                self._ended = True
                break
            except BaseException as exc:
                _fail(call, exc)
            finally:
                _current.reset(token)
            yield chunk

    async def _next_bounded(self, iterator: AsyncIterator[bytes]) -> bytes:
        call = self._call
        with anyio.CancelScope(deadline=anyio.current_time() + call.budget.limit("idle")):
            return await iterator.__anext__()
        call.limit = "idle"
        raise call.error()

    async def aclose(self) -> None:
        try:
            try:
                await self._inner.aclose()
            except Exception as exc:
                _raise_translated(self._call, exc)
        finally:
            if self._release is not None:
                release, self._release = self._release, None
                if self._abandon is not None and not self._ended:
                    await self._abandon()
                release()
                self._call.budget.finish()


def _pool_options(
    dependency: Dependency,
    keepalive_expiry: float | None,
    http1: bool,
    http2: bool,
    local_address: str | None,
    uds: str | None,
) -> dict[str, Any]:
    """The httpcore pool settings both transports share: sized to the dependency's pool."""
    return {
        "max_connections": dependency.pool_size,
        "max_keepalive_connections": dependency.pool_size,
        "keepalive_expiry": keepalive_expiry,
        "http1": http1,
        "http2": http2,
        "local_address": local_address,
        "uds": uds,
    }


class AsyncTransport(httpx.AsyncBaseTransport):
    """An httpx async transport that bounds every phase of a call by `dependency`.

    Args:
        dependency: The limits, pool size and retry rule for the service called.
        verify, cert, trust_env: TLS settings, as for `httpx.AsyncHTTPTransport`.
        http1, http2: Protocols to offer (HTTP/2 needs the ``h2`` package).
        keepalive_expiry: Seconds an idle pooled connection is kept.
        local_address, uds, socket_options: As for `httpx.AsyncHTTPTransport`.

    Works under asyncio and trio. The pool holds at most ``dependency.pool_size``
    connections and admits that many calls at once; a response holds its place until
    it is closed.
    """

    def __init__(
        self,
        dependency: Dependency,
        *,
        verify: ssl.SSLContext | str | bool = True,
        cert: Any = None,
        trust_env: bool = True,
        http1: bool = True,
        http2: bool = False,
        keepalive_expiry: float | None = 5.0,
        local_address: str | None = None,
        uds: str | None = None,
        socket_options: typing.Iterable[Any] | None = None,
    ) -> None:
        _check_dependency(dependency)
        self.dependency = dependency
        self._http2 = http2
        self._gate = _AsyncGate(dependency.pool_size)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify, cert=cert, trust_env=trust_env),
            network_backend=_AsyncBackend(prior_knowledge=http2 and not http1),
            **_pool_options(dependency, keepalive_expiry, http1, http2, local_address, uds),
            socket_options=socket_options,
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send `request` inside the budget, retrying by ``dependency.retry`` if set."""
        if self.dependency.retry is None:
            return await self._attempt(request)
        return await retry.run_async(
            lambda: self._attempt(request),
            retry_response=lambda response: response.status_code in self.dependency.retry.statuses,  # type: ignore[union-attr]
            discard=_aclose_response,
            **_retry_options(self.dependency, request),
        )

    async def _attempt(self, request: httpx.Request) -> httpx.Response:
        call = _attempt_budget(self.dependency)
        token = _current.set(call)
        admitted = False
        core: httpcore.Request | None = None
        try:
            await self._gate.acquire(call)
            admitted = True
            request.headers[HEADER] = call.budget.header_ms()
            user_trace = request.extensions.get("trace")
            trace = None
            if user_trace is not None or self._http2:
                trace = _async_trace(call, user_trace)
            assert isinstance(request.stream, httpx.AsyncByteStream)
            core = _core_request(request, call, request.stream, trace)
            if trace is None:
                call.headers = core.headers
            try:
                if self._http2:
                    response = await self._send_bounded(call, core)
                else:
                    response = await self._pool.handle_async_request(core)
            except Exception as exc:
                _raise_translated(call, exc)
            call.begin_body()
        except BaseException as exc:
            if core is not None and call.stream_id is not None:
                await _abandon_async(self._pool, call, core)
            if admitted:
                self._gate.release()
            call.budget.finish(exc)
            raise
        finally:
            _current.reset(token)
        abandon = None
        if self._http2:
            pool, sent = self._pool, core

            async def abandon() -> None:
                await _abandon_async(pool, call, sent)

        body = _AsyncBody(response.stream, call, self._gate.release, abandon)
        return _response(call, response, body)

    async def _send_bounded(self, call: _Call, core: httpcore.Request) -> httpcore.Response:
        """The pool's response, each phase's limit enforced by cancelling (HTTP/2 enabled).

        On a shared connection a request may wait for another's reads, for the connection
        another request is opening, or for a free stream; a cancel scope whose deadline
        follows the phases bounds all of it. Until the connect or send begins, the wait
        counts as a pool wait: min(pool_wait, time left).
        """
        with anyio.CancelScope() as scope:
            call.scope = scope
            try:
                call.follow(call.budget.limit("pool"))
                return await self._pool.handle_async_request(core)
            finally:
                call.scope = None
        raise call.error()  # only when our own scope fired

    async def aclose(self) -> None:
        """Close every pooled connection."""
        await self._pool.aclose()


async def _aclose_response(response: httpx.Response) -> None:
    await response.aclose()


class AsyncClient(httpx.AsyncClient):
    """An `httpx.AsyncClient` whose every call is bounded by `dependency` and the deadline.

    Takes the `AsyncTransport` options (``verify``, ``http2``, ...) and any other
    `httpx.AsyncClient` argument except those the dependency decides (``timeout``,
    ``limits``, ``transport``, ``mounts``, ``proxy``).
    """

    def __init__(self, dependency: Dependency, **kwargs: Any) -> None:
        transport_options = _split_options(kwargs)
        self.dependency = dependency
        super().__init__(transport=AsyncTransport(dependency, **transport_options), **kwargs)


# The sync transport.


class _SyncGate:
    def __init__(self, size: int) -> None:
        self._semaphore = threading.BoundedSemaphore(size)

    def acquire(self, call: _Call) -> None:
        if self._semaphore.acquire(blocking=False):
            call.budget.pool_wait = 0.0  # a free place: no wait at all
            return
        start = _clock.now()
        acquired = self._semaphore.acquire(timeout=call.budget.limit("pool"))
        call.budget.pool_wait = _clock.now() - start
        if not acquired:
            raise call.error()

    def release(self) -> None:
        self._semaphore.release()


class _SyncBody(httpx.SyncByteStream):
    def __init__(
        self,
        inner: Any,
        call: _Call,
        release: Callable[[], None],
        abandon: Callable[[], None] | None = None,
    ) -> None:
        self._inner = inner
        self._call = call
        self._release: Callable[[], None] | None = release
        self._abandon = abandon
        self._ended = False

    def __iter__(self) -> Iterator[bytes]:
        call = self._call
        iterator = iter(self._inner)
        while True:
            token = _current.set(call)
            try:
                chunk = next(iterator)
            except StopIteration:
                self._ended = True
                break
            except BaseException as exc:
                _fail(call, exc)
            finally:
                _current.reset(token)
            yield chunk

    def close(self) -> None:
        try:
            try:
                self._inner.close()
            except Exception as exc:
                _raise_translated(self._call, exc)
        finally:
            if self._release is not None:
                release, self._release = self._release, None
                if self._abandon is not None and not self._ended:
                    self._abandon()
                release()
                self._call.budget.finish()


class Transport(httpx.BaseTransport):
    """The blocking twin of `AsyncTransport`, with the same options and limits.

    Blocking code cannot be cancelled: each socket operation gets as timeout what is
    left of its phase and of the call, so the call still ends by its limits. Name
    resolution runs in a daemon thread, waited for at most the connect window.

    With ``http2=True`` use one connection from one thread at a time: httpcore's blocking
    HTTP/2 shares one socket and one h2 state between threads without a lock around
    them, and a thread waiting for another's read can fire late.
    """

    def __init__(
        self,
        dependency: Dependency,
        *,
        verify: ssl.SSLContext | str | bool = True,
        cert: Any = None,
        trust_env: bool = True,
        http1: bool = True,
        http2: bool = False,
        keepalive_expiry: float | None = 5.0,
        local_address: str | None = None,
        uds: str | None = None,
        socket_options: typing.Iterable[Any] | None = None,
    ) -> None:
        _check_dependency(dependency)
        self.dependency = dependency
        self._http2 = http2
        self._gate = _SyncGate(dependency.pool_size)
        self._pool = httpcore.ConnectionPool(
            ssl_context=httpx.create_ssl_context(verify=verify, cert=cert, trust_env=trust_env),
            network_backend=_SyncBackend(prior_knowledge=http2 and not http1),
            **_pool_options(dependency, keepalive_expiry, http1, http2, local_address, uds),
            socket_options=socket_options,
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send `request` inside the budget, retrying by ``dependency.retry`` if set."""
        if self.dependency.retry is None:
            return self._attempt(request)
        return retry.run_sync(
            lambda: self._attempt(request),
            retry_response=lambda response: response.status_code in self.dependency.retry.statuses,  # type: ignore[union-attr]
            discard=httpx.Response.close,
            **_retry_options(self.dependency, request),
        )

    def _attempt(self, request: httpx.Request) -> httpx.Response:
        call = _attempt_budget(self.dependency)
        token = _current.set(call)
        admitted = False
        core: httpcore.Request | None = None
        try:
            self._gate.acquire(call)
            admitted = True
            request.headers[HEADER] = call.budget.header_ms()
            user_trace = request.extensions.get("trace")
            trace = None
            if user_trace is not None or self._http2:
                trace = _sync_trace(call, user_trace)
            assert isinstance(request.stream, httpx.SyncByteStream)
            core = _core_request(request, call, request.stream, trace)
            if trace is None:
                call.headers = core.headers
            try:
                response = self._pool.handle_request(core)
            except (Exception, _Expired) as exc:
                _raise_translated(call, exc)
            call.begin_body()
        except BaseException as exc:
            if core is not None and call.stream_id is not None:
                _abandon_sync(self._pool, call, core)
            if admitted:
                self._gate.release()
            call.budget.finish(exc)
            raise
        finally:
            _current.reset(token)
        abandon = None
        if self._http2:
            pool, sent = self._pool, core

            def abandon() -> None:
                _abandon_sync(pool, call, sent)

        body = _SyncBody(response.stream, call, self._gate.release, abandon)
        return _response(call, response, body)

    def close(self) -> None:
        """Close every pooled connection."""
        self._pool.close()


class Client(httpx.Client):
    """An `httpx.Client` whose every call is bounded by `dependency` and the deadline.

    Options as for `AsyncClient`. In threads, pass the deadline along with
    `deadlines.carry` (or `asyncio.to_thread`, which copies the context).
    """

    def __init__(self, dependency: Dependency, **kwargs: Any) -> None:
        transport_options = _split_options(kwargs)
        self.dependency = dependency
        super().__init__(transport=Transport(dependency, **transport_options), **kwargs)


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


def _split_options(kwargs: dict[str, Any]) -> dict[str, Any]:
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
