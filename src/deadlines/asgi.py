"""`DeadlineMiddleware`: the request's deadline for any ASGI app (Starlette, FastAPI, ...).

A pure ASGI middleware (never Starlette's `BaseHTTPMiddleware`, which stops context
variables from propagating and breaks disconnect detection). For each HTTP request it

1. computes the local deadline from the headers it understands (``x-request-timeout-ms``,
   ``grpc-timeout``, Envoy's) capped at the route's maximum, minus a reserve;
2. runs the app inside `deadlines.scope`, so `deadlines.current()` works in handlers and
   everything under the request is cancelled at the instant;
3. answers **504** with a short JSON body when the deadline passes before the response
   starts (and at once, without running the app, when it arrived already expired); when
   the response had started, it raises so that the server drops the connection;
4. cancels the handler the moment the caller leaves (``http.disconnect``).

How the caller's leaving is seen: an ASGI server reports a closed connection only
through ``receive()``, and only to someone waiting on it. Once a request has run for
`watch_after` seconds the middleware starts one watcher task that reads ahead of the app
(at most `read_ahead` bytes of body, so flow control still works) and hands the app
exactly the messages the server sent, in order. When the watcher receives
``http.disconnect`` before the response is complete, it cancels the request's task with
a `CallerLeft` reason. Requests that finish sooner never pay for a watcher.

The deadline's timer is armed on the same round: the deadline is set on arrival (the
handler sees it, outbound calls and statements are bounded by it), but the timer that
cancels the handler at the instant is armed when the request is still running after
`watch_after`, or at once when the deadline is nearer than that. Most requests end
sooner and never touch a timer.

Under trio (hypercorn's trio worker) the same happens with trio's means: the watcher
cancels the cancel scope the app runs in (the deadline's own), and it is a trio system
task, started after `watch_after` by one sweeper task per trio run, so that here too a
request that ends sooner starts no task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from datetime import timedelta
from typing import Any

from . import _clock, _inbound, _loop, _validate, wire
from ._errors import DeadlineExceeded
from ._events import RequestOutcome
from ._inbound import Limits, limits
from ._request import Request, answer_outcome, deadline_outcome
from ._request import budget as request_budget
from ._scope import running_trio

_get_ident = threading.get_ident

__all__ = ["DeadlineMiddleware", "Limits", "limits"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_log = logging.getLogger("deadlines.asgi")
_JSON_HEADERS = [(b"content-type", b"application/json"), (b"cache-control", b"no-store")]
_ROUTE_CACHE_SIZE = 1024
_PLAIN_CACHE_SIZE = 1024
_OUR_HEADER = wire.HEADER.encode()
_MAX_MS_DIGITS = 12  # as `wire.parse_ms`: longer is garbage, not a budget
_NO_WAITERS: list[Any] = []  # shared empty list: never appended to
# Messages an app may send before its response starts (103 Early Hints; TestClient's).
_BEFORE_START = frozenset({"http.response.early_hint", "http.response.debug"})
_HTTP1 = frozenset({"1.0", "1.1"})
# A route's label and its limits.
_Route = tuple[str, Limits]


class DeadlineMiddleware:
    """Give every HTTP request one deadline, answer 504 when it passes, stop when the caller leaves.

        app = Starlette(routes=..., middleware=[
            Middleware(DeadlineMiddleware, default=2.0, maximum=10.0),
        ])

    Args:
        app: The ASGI app to wrap. Lifespan and websocket scopes pass through untouched.
        default: Budget in seconds when the request carries no valid deadline header.
        maximum: The most a caller may ask for; larger header values are capped.
        reserve: Subtracted from the budget for the time on the wire and for the reply.
        header: The milliseconds header to read in place of ``x-request-timeout-ms``.
        routes: Limits per path pattern, e.g. ``{"/reports/*": Limits(default=10,
            maximum=30)}``; a handler marked with `limits` takes precedence.
        read_ahead: Most request-body bytes buffered ahead of the app while watching
            for the caller leaving.
        watch_after: Seconds before the caller-left watcher starts.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        default: float | timedelta,
        maximum: float | timedelta,
        reserve: float | timedelta = 0.05,
        header: str = wire.HEADER,
        routes: Mapping[str, Limits] | None = None,
        read_ahead: int = 1 << 20,
        watch_after: float | timedelta = 0.01,
    ) -> None:
        if not callable(app):
            raise TypeError(f"app must be an ASGI callable, not {app!r}")
        if isinstance(read_ahead, bool) or not isinstance(read_ahead, int) or read_ahead < 0:
            raise ValueError(f"read_ahead must be a number of bytes >= 0, got {read_ahead!r}")
        self.app = app
        self._table = _inbound.RouteTable(routes, Limits(default=default, maximum=maximum))
        self._reserve = _validate.seconds(reserve, "reserve")
        self._header = _inbound.header_name(header)
        self._header_bytes = self._header.encode()
        # The names `_scan` picks out: ours (or its stand-in), the others `wire` reads.
        others = (wire.GRPC_HEADER, wire.ENVOY_HEADER)
        self._known = frozenset({self._header_bytes, b"expect", *(n.encode() for n in others)})
        self._plain: dict[bytes, float] = {}  # values of our header parsed (`_remember`)
        self._read_ahead = read_ahead
        self._watch_after = _validate.seconds(watch_after, "watch_after")
        # A deadline that could pass before the sweeper comes round is armed on arrival
        # (2x: room for the sweeper's own lateness).
        self._arm_within = 2 * self._watch_after
        # The app's routes, if it has them itself; else each request's ``scope["app"]``.
        self._routed = app if _routes_of(app) is not None else None
        self._routes_app: object = self._routed  # the app `_routes` is for (fixed if routed)
        # Keyed on (method, path), or for an app that routes by host on (method, path,
        # Host header): `__call__`'s lookup on the pair then always misses to `_route`.
        self._routes: dict[tuple[str, ...], _Route] = {}
        self._by_host: bool | None = None  # whether `_routes_app` routes by host; None: unknown
        # A sweeper holds its loop (every request reads it), so weak keys would never let
        # go: closed loops are forgotten instead, when the next new loop arrives.
        self._sweepers: dict[asyncio.AbstractEventLoop, _Sweeper] = {}
        self._sweeper: _Sweeper | None = None  # the last one asked for (loops with `_thread_id`)
        self._trio_sweepers: Any = None  # a trio RunVar, made by the first request under trio

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run one ASGI connection scope; only ``http`` is handled, the rest pass through.

        The straight line below is what nearly every request runs: its deadline headers
        read in one pass, its route's limits taken from the cache, the deadline set, the
        request registered with the sweeper, the app awaited. What is rarer (a new route,
        an expired budget, trio, an error) is out of line. The app
        is called here, not in a helper coroutine: one coroutine of ours per request.
        """
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = _clock.now()
        found, expect = self._scan(scope)
        if self._routed is None and scope.get("app") is not self._routes_app:
            self._routes_app = scope.get("app")  # another app: its own routes
            self._routes = {}
            self._by_host = None
        try:
            route = self._routes[scope["method"], scope["path"]]
        except KeyError:
            route = self._route(scope)
        label, limits_ = route
        budget = request_budget(found, limits_, self._reserve)
        # The running loop's sweeper: the last one's while its loop runs in this thread
        # (`_loop.running`'s test, inline; only loops with a `_thread_id` are
        # remembered), else asked for. None under trio or without a loop.
        sweeper = self._sweeper
        if sweeper is None or sweeper._loop._thread_id != _get_ident():  # type: ignore[attr-defined]
            loop = _loop.running()
            sweeper = None if loop is None else self._sweeper_for(loop)
        if sweeper is not None:
            exchange = _Exchange(self, receive, send, label, budget, started)
        else:
            exchange = self._exchange_outside_asyncio(scope, receive, send, label, budget, started)
        if budget <= 0.0:
            try:
                await exchange._answer_timeout(scope, limits_)
            finally:
                exchange.finish("budget_exhausted")
            return
        frame = exchange.enter()
        outcome: RequestOutcome = "ok"
        try:
            if sweeper is not None:
                # The sweeper arms the deadline and starts the watcher when the request
                # is still running after `watch_after`; most end sooner and never touch
                # a timer. A deadline that could pass before it comes round is armed now.
                exchange._loop = loop = sweeper._loop
                exchange._host = host = _loop.current_task(loop)
                if expect:  # "100 Continue" goes out on the app's first read
                    exchange._may_read_ahead = False
                if host is None or frame.at <= started + self._arm_within:
                    exchange.arm(loop, host)  # without a task: fails as a scope
                sweeper._pending[exchange] = started
                if sweeper._handle is None:
                    sweeper._wake()
            else:
                exchange._register(expect)  # trio (or no loop: fails)
            await self.app(scope, exchange.receive, exchange.send)
        except BaseException as exc:
            outcome = "error"  # should settling it fail too
            outcome, error = await exchange._failed(exc, scope, limits_)
            if error is exc:
                raise
            if error is not None:
                raise error from None  # the deadline passed after the response started
        else:
            exchange._active = False  # before any await: see `_failed`
            exchange.leave(None, None)
            if exchange.caller_left is not None:
                outcome = "caller_left"
                await exchange._answer_gone()
        finally:
            if sweeper is not None:
                sweeper._pending.pop(exchange, None)
            elif exchange._sweeper is not None:
                exchange._sweeper._pending.pop(exchange, None)
            if exchange._pump is not None or exchange._cancels:
                exchange._stop_watching()
            if exchange.caller_left is not None:
                outcome = "caller_left"
            exchange.finish(outcome)

    def _exchange_outside_asyncio(
        self, scope: Scope, receive: Receive, send: Send, route: str, budget: float, started: float
    ) -> _Exchange:
        """Under trio, the trio exchange; with no loop at all, one that fails as a scope would."""
        trio = running_trio()
        if trio is None:
            return _Exchange(self, receive, send, route, budget, started)
        exchange = _TrioExchange(self, receive, send, route, budget, started, trio)
        exchange._shield = scope.get("http_version") in _HTTP1  # see `_TrioExchange.send`
        return exchange

    def _sweeper_for(self, loop: asyncio.AbstractEventLoop) -> _Sweeper:
        sweeper = self._sweepers.get(loop)
        if sweeper is None:
            _loop.forget_closed(self._sweepers, _Sweeper.close)
            sweeper = self._sweepers[loop] = _Sweeper(loop, self._watch_after)
        if hasattr(loop, "_thread_id"):  # asyncio's own loops; uvloop's are asked each time
            self._sweeper = sweeper
        return sweeper

    def _trio_sweeper_for(self, trio: Any) -> _TrioSweeper:
        runs = self._trio_sweepers
        if runs is None:
            runs = self._trio_sweepers = trio.lowlevel.RunVar("deadlines.asgi.sweeper")
        sweeper: _TrioSweeper | None = runs.get(None)
        if sweeper is None:
            sweeper = _TrioSweeper(trio, self._watch_after)
            runs.set(sweeper)
        return sweeper

    def _route(self, scope: Scope) -> _Route:
        """A route `__call__` did not find in the cache: resolved, and kept there.

        The cache, keyed on method and path, holds one app's routes (`__call__` empties
        it when requests come from another: one middleware serves one app, in practice)
        and at most `_ROUTE_CACHE_SIZE` of them. An app that routes by host (Starlette's
        `Host`) has its routes cached under the Host header as well.
        """
        try:
            method, path = scope["method"], scope["path"]  # both required in an http scope
        except KeyError:
            method, path = scope.get("method", "GET"), scope.get("path", "/")
        by_host = self._by_host
        if by_host is None:
            by_host = self._by_host = _routes_by_host(self._routes_app)
        key: tuple[str, ...] = (method, path, _host_of(scope)) if by_host else (method, path)
        found = self._routes.get(key)
        if found is None:
            found = self._resolve(self._routes_app, scope, method, path)
            if len(self._routes) >= _ROUTE_CACHE_SIZE:
                self._routes.clear()
            self._routes[key] = found
        return found

    def _resolve(self, app: Any, scope: Scope, method: str, path: str) -> _Route:
        pattern, table_limits = self._table.match(method, _route_path(scope, path))
        template, marked = _match_framework_route(app, scope)
        return template or pattern or _inbound.UNMATCHED, marked or table_limits

    def _scan(self, scope: Scope) -> tuple[float | None, bool]:
        """The smallest valid deadline among the request's headers, and Expect: 100-continue.

        ASGI header names are lower-case bytes. One set lookup per header picks out the
        few names known here (every value of a repeated one counts); `_parse` reads them.
        """
        known = self._known
        first: tuple[bytes, bytes] | None = None
        found: list[tuple[bytes, bytes]] | None = None
        for pair in scope.get("headers") or ():
            if pair[0] in known:
                if first is None:
                    first = pair
                elif found is None:
                    found = [first, pair]
                else:
                    found.append(pair)
        if first is None:
            return None, False
        if found is None:  # the common case: one plain value of our header
            name, value = first
            if name == self._header_bytes:
                seconds = self._plain.get(value)
                if seconds is not None:
                    return seconds, False
                if len(value) <= _MAX_MS_DIGITS and value.isdigit():
                    return self._remember(value), False
            found = [first]
        return self._parse(found)

    def _remember(self, value: bytes) -> float:
        """Seconds of a plain value of our header, kept for the next request carrying it.

        Callers send the same values over and over (a client's fixed timeout, the
        millisecond counts a chain of hops has left): a dict lookup costs a fraction of
        parsing the digits. At most `_PLAIN_CACHE_SIZE` values are kept.
        """
        seconds = int(value) / 1000.0
        if len(self._plain) >= _PLAIN_CACHE_SIZE:
            self._plain.clear()
        self._plain[value] = seconds
        return seconds

    def _parse(self, found: list[tuple[bytes, bytes]]) -> tuple[float | None, bool]:
        """`_scan`'s reading of the known headers it found, in order.

        A plain value of our header (the common case, sent by every `deadlines` hop) is
        parsed here with the rule of `wire.parse_ms` (1-12 ASCII digits:
        ``bytes.isdigit`` is ASCII-only); anything else (lists, grpc-timeout, Envoy's)
        goes through `wire.header_budget`.
        """
        best: float | None = None
        others: list[tuple[bytes, bytes]] | None = None
        expect = False
        for name, value in found:
            if name == b"expect":
                expect = value.lower() == b"100-continue"
                continue
            if name == self._header_bytes:
                if len(value) <= _MAX_MS_DIGITS and value.isdigit():
                    seconds = int(value) / 1000.0
                    if best is None or seconds < best:
                        best = seconds
                    continue
                name = _OUR_HEADER  # a list or garbage: wire decides
            if others is None:
                others = []
            others.append((name, value))
        if others is not None:
            parsed = wire.header_budget(others)
            if parsed is not None and (best is None or parsed < best):
                best = parsed
        return best, expect


class _Exchange(Request):
    """One request: its deadline scope, the wrapped receive and send, the watcher, the outcome.

    The exchange is the request's `deadlines.scope`, one object less per request:
    `__call__` sets its frame and keeps the token; it is armed at once, or by the
    sweeper when the request is still running after `watch_after` (`_watch`), and left
    with `_leave`.
    """

    # Most requests end before the watcher starts and never change most of this state:
    # class-level defaults, so a request stores only what it sets (no __slots__ here).
    _last: Message | None = None  # the last message the app sent (see `started`)
    _start: Message | None = None  # the app's response start (its status, its trailers)
    # The watcher's state.
    buffer: deque[Message] | None = None
    _bytes = 0
    _waiters: list[asyncio.Future[None]] = _NO_WAITERS
    _room: asyncio.Future[None] | None = None
    _pump: Any = None  # the watcher once started: its asyncio Task (trio: its CancelScope)
    _pump_error: BaseException | None = None
    _pump_wanted = False
    _direct = 0
    _eof = False
    _host: asyncio.Task[Any] | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _sweeper: _TrioSweeper | None = None  # under trio: registered with, until the end
    _cancels = 0
    _active = True
    _may_read_ahead = True

    def __init__(
        self,
        mw: DeadlineMiddleware,
        receive: Receive,
        send: Send,
        route: str,
        budget: float,
        started: float,
    ) -> None:
        super().__init__(route, budget, started)
        self._mw = mw
        self._receive = receive
        self._send = send

    @property
    def started(self) -> bool:
        """The response has started: the app sent its start (hints and debug don't count)."""
        last = self._last
        return last is not None and last["type"] not in _BEFORE_START

    @property
    def complete(self) -> bool:
        """The response is complete: its last body chunk (its file, its trailers) went out."""
        last = self._last
        if last is None:
            return False
        kind: str = last["type"]
        if kind == "http.response.body":
            if last.get("more_body", False):
                return False
            start = self._start  # a start that promised trailers ends with them
            return start is None or not start.get("trailers", False)
        if kind == "http.response.trailers":
            return not last.get("more_trailers", False)
        return kind == "http.response.pathsend"

    async def _failed(
        self,
        exc: BaseException,
        scope: Scope,
        limits_: Limits,
    ) -> tuple[RequestOutcome, BaseException | None]:
        """The app raised `exc`: leave the deadline, answer if we can, settle the outcome.

        Returns the request's outcome and what `__call__` raises: `exc` when it is not
        ours to handle, the `DeadlineExceeded` when the deadline passed after the
        response had started (the server then drops the connection), else None.
        """
        # The app is done: from here on neither the sweeper (`_watch`) nor a caller-left
        # cancellation already queued (`_cancel_host`) may touch the task, which goes on
        # to answer and then to whatever called us.
        self._active = False
        ours = False
        try:
            self.leave(type(exc), exc)
        except DeadlineExceeded as fired:  # our own timer ended the app
            exc, ours = fired, True
        if isinstance(exc, asyncio.CancelledError):
            if not self._cancels:
                return "error", exc
            self._uncancel()
            assert self._host is not None
            if self._host.cancelling():
                return "error", exc  # somebody else cancelled us too (server shutdown)
        elif isinstance(exc, DeadlineExceeded):
            if self.caller_left is None and not self.complete:
                outcome = deadline_outcome(exc)
                if self.started:
                    return outcome, exc
                await self._answer_timeout(scope, limits_)
                return outcome, None
            if self.caller_left is None:
                # After a complete response our timer cut only cleanup; a deadline error
                # the app raised itself there is its own, raised as any other would be.
                return ("ok", None) if ours else ("error", exc)
        elif isinstance(exc, Exception) and self.caller_left is not None:
            # The app failed because its caller went away (a send or read on a closed
            # connection; under trio, an exception group that held the cancellation):
            # nobody is left to tell.
            _log.debug("error after the caller left", exc_info=exc)
        else:
            return "error", exc
        await self._answer_gone()
        return "caller_left", None

    async def _answer_timeout(self, scope: Scope, limits_: Limits) -> None:
        mw = self._mw
        asked = _inbound.renamed(scope.get("headers") or (), mw._header_bytes)
        body = self.timeout_body(asked, limits_, mw._header)
        headers = [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())]
        await self._answer(504, headers, body)

    async def _answer_gone(self) -> None:
        """Complete the exchange for outer middlewares; the server drops the bytes."""
        if not self.started:
            await self._answer(499, [], b"")

    async def _answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """Send a whole response of our own; a caller already gone is nobody to tell."""
        end: Message = {"type": "http.response.body", "body": body, "more_body": False}
        self._last = end
        try:
            await self._send({"type": "http.response.start", "status": status, "headers": headers})
            await self._send(end)
        except OSError:  # ASGI 2.4: send on a closed connection raises an OSError
            pass

    def finish(self, outcome: RequestOutcome) -> None:
        """Report the end; a server error the app answered with is an error."""
        start = self._start
        if outcome == "ok" and start is not None:
            outcome = answer_outcome(start.get("status", 200))
        super().finish(outcome)

    # Watching for the caller leaving.

    def _register(self, expect_continue: bool) -> None:
        """Without a running asyncio loop or trio: fail as a `deadlines.scope` would.

        (Under asyncio `__call__` registers with the sweeper inline; `_TrioExchange`
        registers with trio's.)
        """
        self.arm(None, None)

    def _stop_watching(self) -> None:
        """The request ended while watched: stop the watcher, take back our cancellations."""
        if self._pump is not None and not self._pump.done():
            self._pump.cancel()
        if self._cancels:
            self._uncancel()

    def _watch(self) -> None:
        """Due at `watch_after`: arm the deadline if it waited, and start the watcher."""
        if not self._active:  # the app is done; the request is answering on its way out
            return
        if self.timeout is None:  # not armed on arrival: the deadline was far
            self.arm(self._loop, self._host)
        self._start_pump()

    def _start_pump(self) -> None:
        if not self._active or self._eof or self.complete or self._pump is not None:
            return
        if self._direct or not self._may_read_ahead:
            self._pump_wanted = True  # start when the app's own read returns
            return
        self._pump = self._spawn_pump()

    def _spawn_pump(self) -> Any:
        assert self._loop is not None
        return self._loop.create_task(self._run_pump(), name="deadlines-asgi-watch")

    async def _run_pump(self) -> None:
        """Read ahead of the app (at most `read_ahead` bytes) until the caller leaves."""
        try:
            while True:
                while self._bytes >= self._mw._read_ahead and self._bytes:
                    await self._room_to_read()
                message = await self._receive()
                if self.buffer is None:
                    self.buffer = deque()
                self.buffer.append(message)
                self._bytes += len(message.get("body", b""))
                self._wake_readers()
                self._note(message)
                if message["type"] == "http.disconnect":
                    return
        except Exception as exc:  # the server's receive failed: hand it to the app
            self._pump_error = exc
            self._wake_readers()

    # The waiting between the app's reads and the watcher: futures here, trio Events in
    # `_TrioExchange`.

    async def _room_to_read(self) -> None:
        """The watcher waits for the app to take body from a full buffer."""
        assert self._loop is not None
        self._room = self._loop.create_future()
        await self._room

    def _made_room(self) -> None:
        room = self._room
        if room is not None and not room.done():
            room.set_result(None)

    async def _arrival(self) -> None:
        """A reader waits for the watcher to buffer the next message."""
        assert self._loop is not None
        waiter = self._loop.create_future()
        if self._waiters is _NO_WAITERS:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if not waiter.done() or waiter.cancelled():  # e.g. is_disconnected() polls
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)

    def _wake_readers(self) -> None:
        waiters, self._waiters = self._waiters, _NO_WAITERS
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _note(self, message: Message) -> None:
        if message["type"] == "http.disconnect":
            self._eof = True
            if not self.complete and self.caller_left is None and self._active:
                self.left()
                if self._loop is not None:
                    # Cancel from the loop, never from inside the request's own task.
                    self._loop.call_soon(self._cancel_host)

    def _cancel_host(self) -> None:
        host = self._host
        if self._active and host is not None and not host.done():
            host.cancel(msg=self.caller_left)
            self._cancels += 1

    def _uncancel(self) -> None:
        while self._cancels and self._host is not None:
            self._host.uncancel()
            self._cancels -= 1

    # What the app sees.

    async def receive(self) -> Message:
        """The next message the server sent: read straight from it until the watcher
        starts, from the watcher's buffer after."""
        if self._pump is None:  # the app's own read (the watcher waits until it returns)
            self._direct += 1
            try:
                message = await self._receive()
            finally:
                self._direct -= 1
            self._may_read_ahead = True
            if message["type"] == "http.disconnect":
                self._note(message)
            if self._pump_wanted and not self._direct:
                self._pump_wanted = False
                self._start_pump()
            return message
        while True:
            buffer = self.buffer
            if buffer:
                message = buffer[0]
                if message["type"] != "http.disconnect":  # repeat disconnect forever
                    buffer.popleft()
                    self._bytes -= len(message.get("body", b""))
                    self._made_room()
                return message
            if self._pump_error is not None:
                raise self._pump_error
            await self._arrival()

    def send(self, message: Message) -> Awaitable[None]:
        """Pass `message` on, keeping it as the last one sent (`started`, `complete`).

        A plain function returning the server's own awaitable: the app awaits that
        directly, with no coroutine of ours in between.
        """
        self._last = message
        if message["type"] == "http.response.start":
            self._start = message
        return self._send(message)


class _Sweeper:
    """Starts the watcher of each request that has run for `after` seconds; one per loop.

    One timer for all requests in flight instead of one per request: a request that
    ends sooner costs a dict insert and delete (made inline by `_Exchange`). Arrival
    times are `_clock` readings, the clock a request's deadline is on.
    """

    __slots__ = ("_after", "_handle", "_loop", "_pending")

    def __init__(self, loop: asyncio.AbstractEventLoop, after: float) -> None:
        self._loop = loop
        self._after = after
        self._pending: dict[_Exchange, float] = {}  # insertion order = arrival order
        self._handle: asyncio.TimerHandle | None = None

    def close(self) -> None:
        """Its loop is closed: let go of what it scheduled there."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._pending.clear()

    def _wake(self) -> None:
        """Come round `after` from now: the first request since the sweeper was idle."""
        self._handle = self._loop.call_later(self._after, self._sweep)

    def _sweep(self) -> None:
        self._handle = None
        pending = self._pending
        now = _clock.now()
        while pending:
            exchange, arrived = next(iter(pending.items()))
            if arrived > now - self._after:
                self._handle = self._loop.call_later(arrived + self._after - now, self._sweep)
                return
            del pending[exchange]
            exchange._watch()


class _TrioExchange(_Exchange):
    """`_Exchange` under trio: the watcher cancels the cancel scope the app runs in.

    The watcher is a trio system task (a request's task has no nursery to start it in)
    with its own cancel scope, closed when the request ends; readers and the watcher
    wait on trio Events where the asyncio exchange uses futures.
    """

    __slots__ = ("_arrived", "_gone", "_shield", "_space", "_trio")

    def __init__(
        self,
        mw: DeadlineMiddleware,
        receive: Receive,
        send: Send,
        route: str,
        budget: float,
        started: float,
        trio: Any,
    ) -> None:
        super().__init__(mw, receive, send, route, budget, started)
        self._trio = trio
        self._gone: Any = None  # the CancelScope around the app (the deadline's)
        self._arrived: Any = None  # Event: a message reached the buffer (readers wait)
        self._space: Any = None  # Event: the app took body from the buffer (the watcher waits)
        self._shield = False  # shield the server's send (`send`): HTTP/1, until the headers

    def _register(self, expect_continue: bool) -> None:
        """Register with the trio sweeper, then arm the deadline at once (a trio CancelScope).

        The caller leaving cancels the deadline's own CancelScope (one scope per
        request, not two: each costs microseconds); its exit then raises
        DeadlineExceeded, which `caller_left` turns into that outcome.
        """
        # With "Expect: 100-continue", read ahead only after the app asked.
        self._may_read_ahead = not expect_continue
        self._sweeper = self._mw._trio_sweeper_for(self._trio)
        self._sweeper.add(self)
        self.arm(None, None)
        assert self.canceller is not None
        self._gone = self.canceller.cancel_scope

    def _stop_watching(self) -> None:
        if self._pump is not None:
            self._pump.cancel()

    async def send(self, message: Message) -> None:
        """Pass `message` on, as `_Exchange.send` does, with two guards trio needs.

        A deadline that passed while the app ran without a checkpoint (a sync endpoint's
        thread, a shielded block) cuts here, before the server sees the start, so the
        504 still fits. And over HTTP/1, until a message after the start is through, the
        server's send is shielded: hypercorn writes the headers with the first body
        message, and cut half way there, its state and h11's part ways and its trio
        worker dies trying to answer 500 on a response h11 has begun. (Over HTTP/2 that
        send may wait for the caller's flow-control window: it stays cancellable.)
        """
        kind = message["type"]
        if kind == "http.response.start":
            await self._trio.lowlevel.checkpoint_if_cancelled()
        if not self._shield:
            await super().send(message)
            return
        with self._trio.CancelScope(shield=True):
            await super().send(message)
        self._shield = kind == "http.response.start" or kind in _BEFORE_START

    def _spawn_pump(self) -> Any:
        """A system task (a request's task has no nursery), in a CancelScope of its own."""
        scope = self._trio.CancelScope()
        self._trio.lowlevel.spawn_system_task(self._pump_in, scope, name="deadlines-asgi-watch")
        return scope

    async def _pump_in(self, scope: Any) -> None:
        with scope:
            await self._run_pump()

    async def _room_to_read(self) -> None:
        space = self._space = self._trio.Event()
        await space.wait()

    def _made_room(self) -> None:
        space, self._space = self._space, None
        if space is not None:
            space.set()

    async def _arrival(self) -> None:
        arrived = self._arrived
        if arrived is None:
            arrived = self._arrived = self._trio.Event()
        await arrived.wait()

    def _wake_readers(self) -> None:
        arrived, self._arrived = self._arrived, None
        if arrived is not None:
            arrived.set()

    def _note(self, message: Message) -> None:
        super()._note(message)
        if self.caller_left is not None and self._gone is not None:
            self._gone.cancel()  # from any task, the request's own included


class _TrioSweeper:
    """`_Sweeper` under trio: one system task per trio run starts the due watchers.

    A request that ends within `after` costs a dict insert and delete, and wakes the
    task only when it was idle.
    """

    __slots__ = ("_after", "_idle", "_pending", "_trio")

    def __init__(self, trio: Any, after: float) -> None:
        self._trio = trio
        self._after = after
        self._pending: dict[_Exchange, float] = {}  # insertion order = arrival order
        self._idle: Any = None  # the Event the task waits on while nothing is pending
        trio.lowlevel.spawn_system_task(self._run, name="deadlines-asgi-sweeper")

    def add(self, exchange: _TrioExchange) -> None:
        self._pending[exchange] = self._trio.current_time()
        idle, self._idle = self._idle, None
        if idle is not None:
            idle.set()

    async def _run(self) -> None:
        trio, pending = self._trio, self._pending
        while True:
            if not pending:
                idle = self._idle = trio.Event()
                await idle.wait()
                continue
            exchange, arrived = next(iter(pending.items()))
            due = arrived + self._after
            if due > trio.current_time():
                await trio.sleep_until(due)
                continue
            del pending[exchange]
            try:
                exchange._start_pump()
            except Exception:  # never let a system task fail: that ends the whole run
                _log.exception("could not start the caller-left watcher")


def _routes_of(app: Any) -> list[Any] | None:
    """The routes of a Starlette-like app or router, or None."""
    router = getattr(app, "router", app)
    routes = getattr(router, "routes", None)
    return routes if isinstance(routes, list) else None


def _routes_by_host(app: Any, depth: int = 0) -> bool:
    """Whether a Starlette-like app's routing depends on more than method and path.

    Routes that match on a path have one (`Route`, `Mount`, FastAPI's); one without
    (`Host`, or a custom route) may match on anything, the Host header for `Host`.
    """
    for route in _routes_of(app) or ():
        included = getattr(route, "original_router", None)  # FastAPI's included router
        if included is not None:
            if depth < 3 and _routes_by_host(included, depth + 1):
                return True
            continue
        if not isinstance(getattr(route, "path", None), str):
            return True
        if depth < 3 and _routes_of(route) is not None and _routes_by_host(route, depth + 1):
            return True
    return False


def _route_path(scope: Scope, path: str) -> str:
    """`path` without the app's ``root_path`` (which ASGI servers include in it, behind
    a proxy's prefix), as the app's own routing sees it: what `routes=` patterns name."""
    root = scope.get("root_path") or ""
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("", "/"):
        return path[len(root) :] or "/"
    return path


def _host_of(scope: Scope) -> str:
    """The request's Host header, as the route cache's key for host-routed apps."""
    for name, value in scope.get("headers") or ():
        if name == b"host":
            return str(value.decode("latin-1"))
    return ""


def _match_framework_route(
    app: Any, scope: Scope, prefix: str = "", depth: int = 0
) -> tuple[str | None, Limits | None]:
    """The matching Starlette/FastAPI route's path template and marked limits, if any.

    Uses the framework's own `route.matches(scope)`, which does not change the scope.
    """
    routes = _routes_of(app)
    if routes is None or depth > 3:
        return None, None
    partial: tuple[str | None, Limits | None] | None = None
    for route in routes:
        if getattr(route, "original_router", None) is not None:
            name, result = _match_included(route, scope, prefix, depth)
            if name == "FULL":
                return result
            if name == "PARTIAL":
                partial = partial or result
            continue
        matches = getattr(route, "matches", None)
        if matches is None:
            continue
        try:
            match, child = matches(scope)
        except Exception:  # a custom route that cannot match this scope
            continue
        name = getattr(match, "name", "")
        if name not in ("FULL", "PARTIAL"):
            continue
        template = prefix + str(getattr(route, "path", ""))
        inner = _routes_of(route)
        if inner and getattr(route, "endpoint", None) is None:
            found = _match_framework_route(route, {**scope, **child}, template, depth + 1)
            if found[0] is not None:
                return found
            continue
        # A route, or a mount of an app without routes of its own (StaticFiles): the
        # mount's path is the template.
        result = (template or None, _route_limits(route))
        if name == "FULL":
            return result
        partial = partial or result
    return partial or (None, None)


def _match_included(
    router: Any, scope: Scope, prefix: str, depth: int
) -> tuple[str, tuple[str | None, Limits | None]]:
    """A FastAPI included router's match: "FULL", "PARTIAL" or "NONE", and the route's
    template and limits. Recent FastAPI releases (0.165 here) keep included routers as
    such, no longer copying their routes into the app.

    Its public `matches` says only whether a route matched; `_match` names the route
    and its effective context: the full path template, the endpoint, and the
    dependencies of the route, its routers and the include.
    """
    try:
        match, _, route, context = router._match(scope)
    except Exception:  # another FastAPI: no route found, as with an unknown route
        return "NONE", (None, None)
    name = getattr(match, "name", "NONE")
    if name not in ("FULL", "PARTIAL") or depth > 3:
        return "NONE", (None, None)
    if context is None:  # an included router within the included router
        return _match_included(route, scope, prefix, depth + 1)
    template = getattr(context, "path_format", None) or getattr(route, "path", "")
    return name, (prefix + str(template) or None, _route_limits(context))


def _route_limits(route: Any) -> Limits | None:
    """Limits marked on the endpoint, or on one of its FastAPI dependencies.

    FastAPI lists the app's and the routers' dependencies before the route's own, so
    they are searched last first: the most specific mark wins. A mark on a
    sub-dependency (a dependency of a dependency) counts too.
    """
    found = _inbound.limits_of(getattr(route, "endpoint", None))
    if found is not None:
        return found
    return _dependency_limits(getattr(route, "dependant", None), 0)


def _dependency_limits(dependant: Any, depth: int) -> Limits | None:
    for dependency in reversed(getattr(dependant, "dependencies", None) or ()):
        found = _inbound.limits_of(getattr(dependency, "call", None))
        if found is None and depth < 8:
            found = _dependency_limits(dependency, depth + 1)
        if found is not None:
            return found
    return None
