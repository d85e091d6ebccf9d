"""aiohttp with every phase of a call bounded, inside the request's deadline.

    import deadlines, deadlines.aiohttp

    pricing = deadlines.Dependency("pricing", connect=0.5, headers=1.0, total=2.0, pool_size=10)

    async with deadlines.aiohttp.session(pricing) as http:
        async with deadlines.scope(2.0):
            async with http.get("http://pricing/prices/42") as response:
                price = await response.json()

`session` returns a `Session`: a thin wrapper over an `aiohttp.ClientSession` (its
``client``) with the same request methods, returning ordinary `aiohttp.ClientResponse`
objects. For every request, from the `Dependency` and the deadline (`CallBudget`):

* below `min_useful` remaining → `BudgetExhausted`, nothing sent;
* waiting in the pool (``TCPConnector(limit=pool_size)``, this dependency's alone) ≤
  min(pool_wait, time left), measured where the connector queues the request for a
  free place, and reported as ``response.pool_wait`` and the error's ``pool_wait``;
* DNS + TCP + TLS ≤ min(connect, time left); sending the request and waiting for the
  response head ≤ min(headers, time left);
* each silence in the body ≤ idle (aiohttp's own ``sock_read`` timer, started once
  the head has arrived), and the whole call, body included, ≤ min(total, the
  request's deadline);
* ``x-request-timeout-ms`` carries the time left, computed once a connection is ready.

aiohttp's own timers round any timeout above ``ceil_threshold`` (5 s by default) up to
a whole second of loop time, so a 5.2 s limit could fire at 6 s. Here they are all
switched off (a `ClientTimeout` without limits, ``ceil_threshold=inf``) except the
unrounded ``sock_read`` for the body: one precise timer per call, moved along by the
session's connector as each phase begins (queued, connecting, connected), bounds
everything up to the response head, and a timer at the call's end bounds each read of
the body that has to wait. A limit that fires is raised as the matching `CallTimeout`
subclass or `DeadlineExceeded`, translated at one boundary; other errors are aiohttp's
own (`aiohttp.ClientConnectorError`, ...).
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import weakref
from collections.abc import AsyncIterator, Coroutine, Generator
from types import TracebackType
from typing import Any, TypeVar

from ._extras import missing

try:
    import aiohttp
    from multidict import CIMultiDict
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise missing("deadlines.aiohttp", "aiohttp", "aiohttp") from exc

from . import _alarms, _clock, retry
from ._budget import CallBudget, Limit
from ._dependency import Dependency
from ._errors import also
from .wire import HEADER

__all__ = ["Response", "Session", "session"]

T = TypeVar("T")

#: aiohttp's timers, all off: this module keeps the time itself, without rounding.
_NO_TIMEOUT = aiohttp.ClientTimeout(  # deadlines: ignore[DLN101] every phase bounded below
    total=None, connect=None, sock_read=None, sock_connect=None, ceil_threshold=math.inf
)


class _Call(CallBudget):
    """One attempt: its budget, the limit in force, and the one timer that bounds it to the head.

    A `CallBudget` itself (one object per call, not two).
    """

    __slots__ = ("guard", "in_force", "loop", "queued_at")

    def __init__(self, dependency: Dependency, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(dependency)  # BudgetExhausted here: nothing was sent
        self.loop = loop
        self.in_force: Limit = "pool"
        self.queued_at: float | None = None
        self.guard: _alarms.Timeout | None = None

    def at(self, seconds: float) -> float:
        """Loop time `seconds` from now (the budget may run on another monotonic clock)."""
        return self.loop.time() + seconds

    def arm(self, limit: Limit) -> None:
        """Enter the phase bounded by `limit`: start the guard, or move it, to its end."""
        self.in_force = limit
        when = self.at(self.limit(limit))
        if self.guard is None:
            self.guard = _alarms.Timeout(when)
            self.guard.enter(self.loop)  # left by `Session._attempt` once the head is in
        else:
            self.guard.reschedule(when)

    def connection_ready(self, request: aiohttp.ClientRequest) -> None:
        """A connection is ours: the request goes out now, with the time left in it."""
        if self.pool_wait is None:
            self.pool_wait = 0.0
        request.headers[HEADER] = self.header_ms()
        self.request_sent = True  # conservatively: from here on it may reach the server
        self.arm("headers")

    def error(self) -> TimeoutError:
        """The taxonomy error for the limit in force."""
        if self.pool_wait is None and self.queued_at is not None:
            self.pool_wait = _clock.now() - self.queued_at  # still queued
        error = self.timeout(self.in_force, request_sent=self.request_sent)
        return also(error, _AIOHTTP_TIMEOUTS[error.phase or "body"])


#: aiohttp's own timeout for the phase a limit cut (aiohttp counts the pool as connecting).
_AIOHTTP_TIMEOUTS: dict[str, type[aiohttp.ServerTimeoutError]] = {
    "pool": aiohttp.ConnectionTimeoutError,
    "connect": aiohttp.ConnectionTimeoutError,
    "headers": aiohttp.SocketTimeoutError,
    "body": aiohttp.SocketTimeoutError,
}

_current: contextvars.ContextVar[_Call | None] = contextvars.ContextVar(
    "deadlines.aiohttp.call", default=None
)


class _Connector(aiohttp.TCPConnector):
    """The dependency's pool, telling the call in this task when each phase begins.

    aiohttp's public seam for this, `TraceConfig`, makes every request build and await
    all of its ~10 trace events once any trace config is set: that cost more than half
    of aiohttp's own time per call. Instead, `connect` (public) brackets the pool wait
    and the connect phase, and two of its steps are overridden to split them:
    ``_wait_for_available_connection`` (queued for a free place) and
    ``_create_connection`` (DNS, TCP, TLS). Both are private to aiohttp, stable since
    aiohttp 3.0 and exactly where its own ``connection_queued_*`` and
    ``connection_create_*`` trace events are sent; tests/outbound pin their names,
    signatures and use, so an aiohttp that changes them fails the tests loudly.
    """

    async def connect(
        self, req: aiohttp.ClientRequest, traces: list[Any], timeout: aiohttp.ClientTimeout
    ) -> aiohttp.connector.Connection:
        """A pooled or new connection; then the request goes out with the header set."""
        connection = await super().connect(req, traces, timeout)
        call = _current.get()
        if call is not None:
            call.connection_ready(req)
        return connection

    async def _wait_for_available_connection(self, key: Any, traces: list[Any]) -> None:
        call = _current.get()
        if call is None:
            return await super()._wait_for_available_connection(key, traces)
        call.queued_at = _clock.now()
        if call.guard is None:
            call.arm("pool")  # the guard was not started until something could wait
        await super()._wait_for_available_connection(key, traces)
        call.pool_wait = _clock.now() - call.queued_at
        return None

    async def _create_connection(
        self, req: aiohttp.ClientRequest, traces: list[Any], timeout: aiohttp.ClientTimeout
    ) -> Any:
        call = _current.get()
        if call is not None:
            if call.pool_wait is None:
                call.pool_wait = 0.0
            call.arm("connect")
        return await super()._create_connection(req, traces, timeout)


# The one boundary: a timer of ours that fired becomes the taxonomy error.


def _translate(call: _Call, timer: _alarms.Timeout | None, exc: TimeoutError) -> TimeoutError:
    """The taxonomy error for `exc` if one of our limits fired, else `exc` itself."""
    if timer is not None and timer.expired():
        return call.error()
    if isinstance(exc, aiohttp.SocketTimeoutError):  # the body's idle timer (sock_read)
        call.in_force = "idle"
        return call.error()
    return exc


class _Content:
    """The response body stream, each read bounded by the idle gap and the call's end.

    Stands in for ``response.content`` (an `aiohttp.StreamReader`); everything but
    reading is passed through. It refers to its response weakly: the response holds it,
    and a strong reference back would make every call a cycle for the garbage collector.
    """

    __slots__ = ("_call", "_inner", "_response")

    def __init__(self, inner: aiohttp.StreamReader, call: _Call, response: Response) -> None:
        self._inner = inner
        self._call = call
        self._response = weakref.ref(response)

    def exception(self) -> BaseException | None:
        """The stream's error, if any (asked by aiohttp on every release)."""
        return self._inner.exception()

    def set_exception(self, *args: Any) -> None:
        """Fail pending and later reads (aiohttp's release does, on every call)."""
        self._inner.set_exception(*args)

    async def _bounded(self, read: Coroutine[Any, Any, T]) -> T:
        call = self._call
        call.in_force, call.phase = "total", "body"
        try:
            if self._inner.is_eof():  # the rest of the body is buffered: no wait, no timer
                return await read
            timer = _alarms.Timeout(call.at(call.limit("total")))
            try:
                async with timer:
                    return await read
            except TimeoutError as exc:
                error = _translate(call, timer, exc)
                if error is exc:
                    raise
                raise error from exc
        except BaseException as exc:
            call.finish(exc)  # first: closing the response reports the call too, as ok
            response = self._response()
            if response is not None:
                response.close()  # a broken or abandoned body: close the socket now
            raise

    # The reads return `_bounded`'s coroutine rather than being coroutines themselves:
    # one coroutine less per read.

    def read(self, n: int = -1) -> Coroutine[Any, Any, bytes]:
        """Up to `n` bytes (all with -1)."""
        return self._bounded(self._inner.read(n))

    def readany(self) -> Coroutine[Any, Any, bytes]:
        """The next bytes that arrive."""
        return self._bounded(self._inner.readany())

    def readchunk(self) -> Coroutine[Any, Any, tuple[bytes, bool]]:
        """The next HTTP chunk and whether it ended."""
        return self._bounded(self._inner.readchunk())

    def readexactly(self, n: int) -> Coroutine[Any, Any, bytes]:
        """Exactly `n` bytes."""
        return self._bounded(self._inner.readexactly(n))

    def readline(self) -> Coroutine[Any, Any, bytes]:
        """The next line."""
        return self._bounded(self._inner.readline())

    def readuntil(self, separator: bytes = b"\n") -> Coroutine[Any, Any, bytes]:
        """Bytes up to and including `separator`."""
        return self._bounded(self._inner.readuntil(separator))

    async def iter_chunked(self, n: int) -> AsyncIterator[bytes]:
        """Chunks of at most `n` bytes."""
        while chunk := await self.read(n):
            yield chunk

    async def iter_any(self) -> AsyncIterator[bytes]:
        """Bytes as they arrive."""
        while chunk := await self.readany():
            yield chunk

    async def iter_chunks(self) -> AsyncIterator[tuple[bytes, bool]]:
        """HTTP chunks with their end-of-chunk flag."""
        while (chunk := await self.readchunk()) != (b"", False):
            yield chunk

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while line := await self.readline():
            yield line

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class Response(aiohttp.ClientResponse):
    """An `aiohttp.ClientResponse` whose body reads are bounded by the call's limits.

    ``pool_wait`` is the seconds this call waited for a pooled connection.
    """

    _deadlines_call: _Call | None = None

    @property
    def pool_wait(self) -> float | None:
        """Seconds spent waiting for a pooled connection (None if unknown)."""
        call = self._deadlines_call
        return None if call is None else call.pool_wait

    def release(self) -> Any:
        """Release the connection and report the end of the call."""
        if self._deadlines_call is not None:
            self._deadlines_call.finish()  # once: aiohttp releases twice per call
        return super().release()

    def close(self) -> None:
        """Close the connection and report the end of the call."""
        if self._deadlines_call is not None:
            self._deadlines_call.finish()
        super().close()


class _RequestContext:
    """What `Session.get` and friends return: await it, or use it with ``async with``."""

    __slots__ = ("_coro", "_response")

    def __init__(self, coro: Coroutine[Any, Any, Response]) -> None:
        self._coro = coro
        self._response: Response | None = None

    def __await__(self) -> Generator[Any, None, Response]:
        return self._coro.__await__()

    async def __aenter__(self) -> Response:
        self._response = await self._coro
        await self._response.__aenter__()
        return self._response

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._response is not None
        await self._response.__aexit__(exc_type, exc, tb)


def _request_sent(exc: BaseException) -> bool | None:
    """For retries: whether `exc` may have reached the server (None: do not retry)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return False
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return True
    return retry.request_sent(exc)


def _replayable(kwargs: dict[str, Any]) -> bool:
    data = kwargs.get("data")
    return data is None or isinstance(data, bytes | str | dict | list | tuple)


_DECIDED_BY_DEPENDENCY = ("timeout", "connector", "read_timeout", "conn_timeout")


class Session:
    """An `aiohttp.ClientSession` for one dependency, every call bounded by its limits.

    Args:
        dependency: The limits, pool size and retry rule for the service called.
        ssl: Passed to the `aiohttp.TCPConnector` (False to skip verification).
        **kwargs: Any other `aiohttp.ClientSession` argument, except those the
            dependency decides (``timeout``, ``connector``). ``trace_configs`` and
            ``middlewares`` are passed on.

    Request methods take aiohttp's arguments (``timeout=`` excepted) and return
    `Response` objects, used as usual (``async with`` or ``await``).
    """

    def __init__(self, dependency: Dependency, *, ssl: Any = True, **kwargs: Any) -> None:
        if not isinstance(dependency, Dependency):
            raise TypeError(f"dependency must be a deadlines.Dependency, not {dependency!r}")
        for name in _DECIDED_BY_DEPENDENCY:
            if name in kwargs:
                raise TypeError(
                    f"{name}= is decided by the deadlines.Dependency (limits, pool size) and"
                    " cannot be passed to a deadlines.aiohttp session"
                )
        self.dependency = dependency
        # Before the connector, aiohttp only awaits the caller's middlewares and trace
        # hooks and, with trust_env, a thread (netrc, proxy settings). Without those the
        # guard is not started until a phase that can wait begins (the connector arms
        # it). With them, it runs from the start, bounding them by the pool limit.
        self._eager = bool(
            kwargs.get("middlewares") or kwargs.get("trace_configs") or kwargs.get("trust_env")
        )
        # aiohttp binds the session to the running loop (its connector needs one).
        self._loop = asyncio.get_running_loop()
        connector = _Connector(
            limit=dependency.pool_size,
            limit_per_host=0,
            ssl=ssl,
            timeout_ceil_threshold=math.inf,
        )
        self.client = aiohttp.ClientSession(
            connector=connector,
            timeout=_NO_TIMEOUT,
            response_class=Response,
            **kwargs,
        )

    def request(self, method: str, url: Any, **kwargs: Any) -> _RequestContext:
        """Send `method` to `url` inside the budget; aiohttp's request arguments."""
        if "timeout" in kwargs:
            raise TypeError("timeout= is decided by the deadlines.Dependency")
        send = self._attempt if self.dependency.retry is None else self._with_retries
        return _RequestContext(send(method.upper(), url, kwargs))

    def get(self, url: Any, **kwargs: Any) -> _RequestContext:
        """GET `url`."""
        return self.request("GET", url, **kwargs)

    def head(self, url: Any, **kwargs: Any) -> _RequestContext:
        """HEAD `url`."""
        return self.request("HEAD", url, **kwargs)

    def options(self, url: Any, **kwargs: Any) -> _RequestContext:
        """OPTIONS `url`."""
        return self.request("OPTIONS", url, **kwargs)

    def post(self, url: Any, **kwargs: Any) -> _RequestContext:
        """POST to `url`."""
        return self.request("POST", url, **kwargs)

    def put(self, url: Any, **kwargs: Any) -> _RequestContext:
        """PUT to `url`."""
        return self.request("PUT", url, **kwargs)

    def patch(self, url: Any, **kwargs: Any) -> _RequestContext:
        """PATCH `url`."""
        return self.request("PATCH", url, **kwargs)

    def delete(self, url: Any, **kwargs: Any) -> _RequestContext:
        """DELETE `url`."""
        return self.request("DELETE", url, **kwargs)

    async def _with_retries(self, method: str, url: Any, kwargs: dict[str, Any]) -> Response:
        policy = self.dependency.retry
        assert policy is not None
        headers = CIMultiDict(kwargs.get("headers") or {})
        return await retry.run_async(
            lambda: self._attempt(method, url, kwargs),
            policy=policy,
            method=method,
            idempotency_key="idempotency-key" in headers,
            replayable=_replayable(kwargs),
            min_attempt=self.dependency.min_useful,
            request_sent=_request_sent,
            retry_response=lambda response: response.status in policy.statuses,
            discard=_release,
        )

    async def _attempt(self, method: str, url: Any, kwargs: dict[str, Any]) -> Response:
        call = _Call(self.dependency, self._loop)  # BudgetExhausted: nothing was sent
        call.__enter__()
        token = _current.set(call)
        try:
            if self._eager or "middlewares" in kwargs:
                call.arm("pool")
            # The guard, started by `arm`, is left here as ``async with`` would (two
            # coroutines less per call): the head has arrived, or the call failed.
            try:
                response: Response = await self.client._request(  # type: ignore[assignment]
                    method, url, timeout=_NO_TIMEOUT, **kwargs
                )
            except BaseException as exc:
                guard = call.guard
                if guard is not None and guard.leave(type(exc)):
                    raise call.error() from exc
                if (
                    isinstance(exc, TimeoutError)
                    and (error := _translate(call, guard, exc)) is not exc
                ):
                    raise error from exc
                raise
            if call.guard is not None:
                call.guard.leave(None)
        except BaseException as exc:
            call.finish(exc)
            raise
        finally:
            _current.reset(token)
            call.guard = None
        response._deadlines_call = call
        raw = response.content
        response.content = _Content(raw, call, response)  # type: ignore[assignment]
        if not raw.is_eof():
            _start_idle_timer(response, self.dependency.idle)
        return response

    async def close(self) -> None:
        """Close the session and its pooled connections."""
        await self.client.close()

    @property
    def closed(self) -> bool:
        """Whether the session is closed."""
        return self.client.closed

    async def __aenter__(self) -> Session:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


def _start_idle_timer(response: Response, idle: float) -> None:
    """Start aiohttp's own per-chunk read timer (sock_read) for the rest of the body.

    Called only while some of the body is still to come. It measures the silence since
    the last byte received, exactly, and aiohttp stops it at the end of the body. It is
    off while waiting for the head, which has its own window here, so a short idle cap
    cannot pose as a headers timeout.
    """
    connection = response.connection
    if connection is None or connection.protocol is None:
        return
    connection.protocol.read_timeout = idle
    connection.protocol.start_timeout()


async def _release(response: Response) -> None:
    response.release()


def session(dependency: Dependency, **kwargs: Any) -> Session:
    """A `Session` for `dependency`; `kwargs` as for `Session`. Use it with ``async with``."""
    return Session(dependency, **kwargs)
