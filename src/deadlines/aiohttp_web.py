"""`DeadlineMiddleware` for aiohttp.web: one deadline per request, 504, stop when the caller leaves.

    from aiohttp import web
    from deadlines.aiohttp_web import DeadlineMiddleware

    app = web.Application(middlewares=[DeadlineMiddleware(default=2.0, maximum=10.0)])

Same behaviour as `deadlines.asgi.DeadlineMiddleware`: the budget comes from the
headers (``x-request-timeout-ms``, ``grpc-timeout``, Envoy's) capped at the route's
maximum, minus a reserve; the handler runs inside `deadlines.scope`; a deadline that
passes before the response starts gives a JSON 504, after it started the connection is
closed; an already expired request is answered 504 without running the handler.

Caller left: since aiohttp 3.7 a closed connection no longer cancels the handler (unless
the server runs with ``handler_cancellation=True``), so work goes on for nobody. The
middleware checks the connection every `watch_every` seconds while the handler runs and,
once it is gone, cancels the handler's task with a `CallerLeft` reason. aiohttp has no
public callback for a lost connection; the check reads `request.transport`, which
aiohttp clears when the connection is lost.

A body made by an async iterator (``web.Response(body=agen())``), which aiohttp would
make after the middleware returned, is sent by the middleware itself, inside the
deadline and the connection watch (and a gate's turn), as if the handler had written
it. A request that upgrades to a WebSocket keeps its deadline until the
`WebSocketResponse` is prepared; the handler then leaves it and the session runs
without one (tasks the handler started before keep it: a deadline only ever shrinks).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta
from typing import Any

from . import _clock, _loop, _validate, wire
from ._alarms import clock_for
from ._errors import DeadlineExceeded
from ._events import RequestOutcome
from ._extras import missing
from ._gate import Gate
from ._inbound import UNMATCHED, Limits, RouteTable, header_name, limits, limits_of
from ._private.aiohttp_web import ended, headers_held, on_prepare
from ._request import Request, answer_outcome, budget, deadline_outcome
from ._scope import Frame, exceeded, frame_var

try:
    from aiohttp import HttpVersion11, web
    from aiohttp.payload import AsyncIterablePayload
except ImportError as exc:  # pragma: no cover - exercised without aiohttp installed
    raise missing("deadlines.aiohttp_web", "aiohttp", "aiohttp") from exc

__all__ = ["DeadlineMiddleware", "Limits", "limits"]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_log = logging.getLogger(__name__)


class DeadlineMiddleware:
    """An aiohttp.web middleware giving each request one deadline (see the module docs).

    Args:
        default: Budget in seconds when the request carries no valid deadline header.
        maximum: The most a caller may ask for; larger header values are capped.
        reserve: Subtracted from the budget for the time on the wire and for the reply.
        header: The milliseconds header to read in place of ``x-request-timeout-ms``.
        routes: Limits per path pattern (``"/reports/*"``, ``"POST /upload"``); a handler
            marked with `limits` takes precedence.
        watch_every: Seconds between two checks of the caller's connection.
        gate: A `deadlines.Gate` in front of the handlers: it refuses at once what
            cannot be answered in time (503 with ``Retry-After``; 504 for a deadline
            that passed while the request waited) and queues requests beyond its
            limit. None (the default): every request goes straight to its handler.
            A request that asks to upgrade to a WebSocket bypasses it (its session
            would hold a turn for its whole length), as in the ASGI middleware.
    """

    __middleware_version__ = 1  # a new-style aiohttp middleware

    def __init__(
        self,
        *,
        default: float | timedelta,
        maximum: float | timedelta,
        reserve: float | timedelta = 0.05,
        header: str = wire.HEADER,
        routes: Mapping[str, Limits] | None = None,
        watch_every: float | timedelta = 0.01,
        gate: Gate | None = None,
    ) -> None:
        if gate is not None and not isinstance(gate, Gate):
            raise TypeError(f"gate must be a deadlines.Gate, not {gate!r}")
        self._gate = gate
        self._table = RouteTable(routes, Limits(default=default, maximum=maximum))
        self._reserve = _validate.seconds(reserve, "reserve")
        self._header = header_name(header)
        self._names = (self._header, wire.GRPC_HEADER, wire.ENVOY_HEADER)
        self._watch_every = _validate.seconds(watch_every, "watch_every", allow_zero=False)
        # A plain dict: each poller holds its loop (for the request path's `call_later`),
        # so weak keys would never let go anyway. A loop not seen before first clears out
        # the pollers of closed loops; until a new loop comes along, the last one seen
        # stays referenced even once closed (here and in `_last`): one loop at most.
        self._pollers: dict[asyncio.AbstractEventLoop, _Poller] = {}
        self._last: tuple[asyncio.AbstractEventLoop | None, _Poller | None] = (None, None)

    async def __call__(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Run `handler` under the request's deadline (a WebSocket it accepts runs on
        without one)."""
        started = _clock.now()
        route, limits_, headers, budget = self._arrival(request)
        watch = _Watch(route, budget, started, request, self._poller())
        outcome: RequestOutcome = "error"
        try:
            if budget <= 0.0:
                outcome = "budget_exhausted"
                return self._timeout(watch, headers, limits_)
            if request.headers.get("Upgrade", "").lower() == "websocket":
                watch.await_upgrade()
            try:
                if self._gate is None or watch.upgrading:  # a session is no request at work
                    response = await watch.run(handler)
                else:
                    response = await watch.run(self._gated(watch, handler, headers, limits_))
                    if watch.refusal is not None:  # answered without the handler
                        outcome = watch.refusal.outcome
                        return response
            except asyncio.CancelledError:
                if watch.caller_left is not None:
                    outcome = "caller_left"
                elif _delivered(request):  # aiohttp's own cancellation, after the answer
                    outcome = "ok"
                raise
            except web.HTTPException as exc:
                # aiohttp's way to answer (a redirect, a 404): a response, not a failure,
                # unless it is a server error.
                outcome = answer_outcome(exc.status)
                raise
            except DeadlineExceeded as exc:
                outcome = deadline_outcome(exc)
                if watch.late_in_gate():  # passed while it waited: the handler never ran
                    outcome = "late"
                if not _response_started(request):
                    return self._timeout(watch, headers, limits_)
                if not _delivered(request):
                    raise  # the response is half out: aiohttp closes the connection
                if watch.apps_own:  # after a whole response: the handler's own error
                    outcome = "error"
                    raise
                # Our deadline cut only what the handler did after a whole response.
                outcome = "ok"
                return _Delivered(_keeps(request))
            if watch.caller_left is not None:
                outcome = "caller_left"
            else:  # a server error the handler answered with is an error
                outcome = answer_outcome(getattr(response, "status", 200))
            return response
        finally:
            watch.finish(outcome)

    async def expect_handler(self, request: web.Request) -> web.StreamResponse | None:
        """A route's ``expect_handler``: no ``100 Continue`` for a request that arrived
        with its deadline already passed (aiohttp asks a route's expect handler before
        any middleware runs).

            app.router.add_post("/upload", upload, expect_handler=middleware.expect_handler)

        An expired request is answered the middleware's 504 at once; any other gets
        aiohttp's usual answer to ``Expect``.
        """
        started = _clock.now()
        route, limits_, headers, budget = self._arrival(request)
        if budget > 0.0:
            await _expect_continue(request)
            return None
        # The middleware will not run for this request: it is reported here.
        expired = Request(route, budget, started)
        expired.finish("budget_exhausted")
        return self._timeout(expired, headers, limits_)

    def _arrival(self, request: web.Request) -> tuple[str, Limits, list[tuple[str, str]], float]:
        """The request's route label and limits, its deadline headers, and its budget."""
        route, limits_ = self._route(request)
        getall = request.headers.getall
        headers = [
            (wire.HEADER if name == self._header else name, value)
            for name in self._names
            for value in getall(name, ())
        ]
        return route, limits_, headers, budget(wire.header_budget(headers), limits_, self._reserve)

    def _poller(self) -> _Poller:
        loop = _loop.running() or asyncio.get_running_loop()
        last_loop, last = self._last
        if last_loop is loop and last is not None:
            return last
        poller = self._pollers.get(loop)
        if poller is None:
            _loop.forget_closed(self._pollers, _Poller.close)
            poller = self._pollers[loop] = _Poller(loop, self._watch_every)
        self._last = (loop, poller)
        return poller

    def _route(self, request: web.Request) -> tuple[str, Limits]:
        route = request.match_info.route
        resource = getattr(route, "resource", None)
        template = resource.canonical if resource is not None else None
        pattern, table_limits = self._table.match(request.method, request.path)
        handler = getattr(route, "handler", None)
        marked = limits_of(handler)
        if isinstance(handler, type):  # a class-based view: its method's mark wins
            method = getattr(handler, request.method.lower(), None)
            marked = limits_of(method) or marked
        return template or pattern or UNMATCHED, marked or table_limits

    def _gated(self, watch: _Watch, handler: Handler, headers: Any, limits_: Limits) -> Handler:
        """`handler` behind the gate: run once the gate lets the request through, else
        the refusal's answer (noted in `watch.refusal`)."""
        gate = self._gate
        assert gate is not None

        async def gated(request: web.Request) -> web.StreamResponse:
            response: web.StreamResponse | None = None

            async def work() -> bool:
                nonlocal response
                response = await handler(request)
                await watch.complete(response)  # a body made later is work in the turn
                return watch.caller_left is None and answer_outcome(response.status) == "ok"

            refusal = await watch.through(gate, work)
            if refusal is None:
                assert response is not None
                return response
            if refusal.status == 504:
                return self._timeout(watch, headers, limits_)
            return web.Response(
                status=refusal.status,
                body=refusal.body(),
                content_type="application/json",
                headers={"cache-control": "no-store", "retry-after": str(refusal.retry_after)},
            )

        return gated

    def _timeout(self, request: Request, headers: Any, limits_: Limits) -> web.Response:
        body = request.timeout_body(headers, limits_, self._header)
        return web.Response(
            status=504,
            body=body,
            content_type="application/json",
            headers={"cache-control": "no-store"},
        )


async def _expect_continue(request: web.Request) -> None:
    """aiohttp's answer to ``Expect`` (what a route without an expect handler gets):
    ``100 Continue``, or 417 for an expectation it does not know."""
    expect = request.headers.get("Expect", "")
    if request.version != HttpVersion11:
        return
    if expect.lower() != "100-continue":
        raise web.HTTPExpectationFailed(text=f"Unknown Expect: {expect}")
    await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    request.writer.output_size = 0  # the response itself has not started


def _response_started(request: web.Request) -> bool:
    """Whether a response was begun on the connection: bytes written, or headers that
    aiohttp holds back to send with the first chunk (its writer's `_headers_buf`). A
    504 can no longer take its place: the writer is set for that response (its length,
    its chunking)."""
    writer = request.writer
    return writer.output_size > 0 or headers_held(writer)


def _keeps(request: web.Request) -> bool:
    """Whether the connection may serve the caller's next request after a whole response
    the handler's lost response sent: the caller asked for it and the body was framed
    (a length, or chunks). An HTTP/1.0 body without a length ends with the connection.
    A handler's own `force_close()` is not known here: the caller, told ``Connection:
    close``, closes it."""
    writer = request.writer
    framed = bool(getattr(writer, "chunked", False)) or getattr(writer, "length", None) is not None
    return request.keep_alive and framed


def _made_later(response: object) -> bool:
    """Whether `response` is a `web.Response` whose body an async iterator makes while
    aiohttp sends it (``web.Response(body=agen())``), not sent yet."""
    return (
        isinstance(response, web.Response)
        and not response.prepared
        and isinstance(response.body, AsyncIterablePayload)
    )


def _delivered(request: web.Request) -> bool:
    """Whether the whole response went out (`StreamResponse.write_eof` ran)."""
    return ended(request.writer)


class _Delivered(web.StreamResponse):
    """What the middleware gives aiohttp for a response that went out whole before the
    deadline cut the handler's later work: nothing more is written.

    The handler's own response is lost with its exception, so aiohttp's access log
    shows this stand-in's status (200) and no body. The connection is kept when the
    handler's response would have kept it (`_keeps`).
    """

    def __init__(self, keep_alive: bool) -> None:
        super().__init__()
        self._kept = keep_alive

    @property
    def keep_alive(self) -> bool:
        """Whether aiohttp keeps the connection for the caller's next request."""
        return self._kept

    async def prepare(self, request: web.BaseRequest) -> None:
        return None

    async def write_eof(self, data: bytes = b"") -> None:
        return None


class _Poller:
    """Checks the connections of every handler running on one loop, every `every` seconds.

    One timer for all requests in flight instead of one per request, an `Alarm` on the
    loop's clock (`_alarms`): a request costs a dict insert and delete, and the timer
    runs only while some request is in flight.
    """

    __slots__ = ("_clock", "_entry", "_every", "_loop", "_watches")

    def __init__(self, loop: asyncio.AbstractEventLoop, every: float) -> None:
        self._loop = loop
        self._every = every
        self._clock = clock_for(loop)
        self._watches: dict[_Watch, None] = {}
        self._entry: list[Any] | None = None  # on the loop's clock while requests run

    def add(self, watch: _Watch) -> None:
        self._watches[watch] = None
        if self._entry is None:
            self._entry = self._clock.arm(self._loop.time() + self._every, self)

    def discard(self, watch: _Watch) -> None:
        self._watches.pop(watch, None)

    def close(self) -> None:
        """The loop is closed (and with it the loop's clock): let go of its requests."""
        self._entry = None
        self._watches.clear()

    def fire(self) -> None:
        """Cancel the handlers whose connection is gone, look again later."""
        self._entry = None
        lost = [watch for watch in self._watches if watch.request.transport is None]
        for watch in lost:
            del self._watches[watch]
            if watch.gone():  # a caller gone after its whole answer did not leave
                watch.cancel_host()
        if self._watches:
            self._entry = self._clock.arm(self._loop.time() + self._every, self)


class _Watch(Request):
    """One request's deadline (`Request`): runs the handler under it and cancels it when
    the connection is lost (a WebSocket's request is reported at its upgrade)."""

    def __init__(
        self, route: str, budget: float, started: float, request: web.Request, poller: _Poller
    ) -> None:
        super().__init__(route, budget, started)
        self.request = request
        self._poller = poller
        self._host: asyncio.Task[Any] | None = None
        self._outer: Frame | None = None
        self._cancels = 0
        self.apps_own = False  # the handler raised a DeadlineExceeded of its own
        self.upgraded = False  # a WebSocketResponse was prepared: no deadline from then
        self.upgrading = False  # the request asks to upgrade (`await_upgrade`)
        # The context the handler of a request that asks to upgrade runs in.
        self._session: contextvars.Context | None = None
        self._session_task: asyncio.Task[web.StreamResponse] | None = None

    async def run(self, handler: Handler) -> web.StreamResponse:
        self._host = asyncio.current_task(_loop.running() or asyncio.get_running_loop())
        self._poller.add(self)
        self._outer = frame_var.get()  # an outer scope's frame binds if nearer
        try:
            async with self:
                try:
                    if not self.upgrading:
                        response = await handler(self.request)
                    else:
                        response = await self._in_session_context(handler)
                    await self.complete(response)
                except DeadlineExceeded:  # ours reaches the handler as a cancellation
                    self.apps_own = True
                    raise
        except asyncio.CancelledError:
            if not self._cancels:
                if self.gone():  # aiohttp's handler_cancellation=True
                    self.left()
                raise  # not ours: aiohttp's own, or server shutdown
            self._uncancel()
            if self._host is not None and self._host.cancelling():
                raise
            return web.Response(status=499)  # nobody reads it; aiohttp logs the access
        except DeadlineExceeded:
            if self.caller_left is not None:
                return web.Response(status=499)
            raise
        except Exception as exc:
            if self.gone():
                # The caller went away: aiohttp fails the body read (or a write) with a
                # connection error before the poller comes round. Nobody is left to tell.
                _log.debug("error after the caller left", exc_info=exc)
                self.left()
                return web.Response(status=499)
            raise
        finally:
            self._poller.discard(self)
            self._uncancel()
        return response

    async def complete(self, response: web.StreamResponse) -> None:
        """The handler returned `response`: too late for it (`_check_in_time`), or its
        body, if made later, sent now. Again on a response it completed: nothing."""
        self._check_in_time(response)
        if _made_later(response):
            await self._send_made_later(response)

    def _check_in_time(self, response: web.StreamResponse) -> None:
        """Nobody waits for an answer begun after the deadline (a handler that caught its
        call's timeout, or ran without a checkpoint): 504, whichever timer ran first."""
        frame = self.frame
        if not response.prepared and frame is not None and frame.at <= _clock.now():
            raise exceeded(frame)

    async def _send_made_later(self, response: web.StreamResponse) -> None:
        """Send a body aiohttp would make after we return, outside the deadline and the
        watch: here, as if the handler had written it.

        Once prepared, the connection's writer is set for this response (chunked,
        perhaps compressed), so if making the body fails, whatever answers the error
        (aiohttp, an outer middleware) would be framed wrongly: the connection then
        closes after that answer, or the caller's next request would be misread.
        """
        try:
            await response.prepare(self.request)
            await response.write_eof()
        except BaseException:
            force_close = getattr(self.request.protocol, "force_close", None)
            if force_close is not None:
                force_close()
            raise

    def gone(self) -> bool:
        """The connection is lost and the response was not whole: the caller left. (The
        peer of a WebSocket session closing it is not a caller leaving a request.)"""
        return self.request.transport is None and not _delivered(self.request) and not self.upgraded

    def cancel_host(self) -> None:
        """The connection is gone: cancel the handler with a `CallerLeft` reason."""
        host = self._host
        if host is None or host.done():
            return
        host.cancel(msg=self.left())
        self._cancels += 1

    def await_upgrade(self) -> None:
        """Leave the deadline once the handler prepares a `WebSocketResponse`: a session
        outlives any request budget, but a request that merely asks to upgrade keeps it.

        aiohttp tells of a prepared response from inside the handler (the request's
        prepare hook: an ``on_response_prepare`` signal cannot be added once the app is
        frozen). Only requests that ask to upgrade get the hook, and their handler runs
        in a context of its own (`_in_session_context`).
        """
        self.upgrading = True
        on_prepare(self.request, self._prepared)

    def _in_session_context(self, handler: Handler) -> asyncio.Task[web.StreamResponse]:
        """The handler as a task in the session's context, awaited by the request's own
        task (so the deadline and the caller leaving still cancel it): the deadline can
        then be left in that context whichever task prepares the socket."""

        async def handle() -> web.StreamResponse:
            return await handler(self.request)

        self._session = contextvars.copy_context()
        task = asyncio.get_running_loop().create_task(handle(), context=self._session)
        self._session_task = task
        return task

    def _prepared(self, response: web.StreamResponse) -> None:
        if isinstance(response, web.WebSocketResponse):
            self._lift()

    def _lift(self) -> None:
        if self.frame is None or self.upgraded:
            return
        timeout = self.timeout
        if timeout is not None:
            if timeout.expired():
                return  # the deadline came first: it cuts the handshake
            timeout.reschedule(None)
        self.upgraded = True
        self._poller.discard(self)
        # Leave the request's deadline in the handler's context (tasks it started
        # before keep theirs: a deadline only ever shrinks). Prepared in a task of the
        # handler's own, that context is not running, and is entered here.
        if asyncio.current_task() is self._session_task:
            frame_var.set(self._outer)
        elif self._session is not None:
            self._session.run(frame_var.set, self._outer)
        self.finish("ok")  # the request was the handshake, answered 101

    def _uncancel(self) -> None:
        while self._cancels and self._host is not None:
            self._host.uncancel()
            self._cancels -= 1
