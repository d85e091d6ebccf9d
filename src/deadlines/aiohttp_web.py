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
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta
from typing import Any

from . import _clock, _events, _inbound, _loop, _validate, wire
from ._errors import CallerLeft, DeadlineExceeded
from ._events import RequestOutcome
from ._inbound import Limits, limits
from ._scope import scope as deadline_scope

try:
    from aiohttp import web
except ImportError as exc:  # pragma: no cover - exercised without aiohttp installed
    raise ImportError(
        "deadlines.aiohttp_web needs aiohttp: pip install 'deadlines[aiohttp]'"
    ) from exc

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
    ) -> None:
        self._table = _inbound.RouteTable(routes, Limits(default=default, maximum=maximum))
        self._reserve = _validate.seconds(reserve, "reserve")
        self._header = _inbound.header_name(header)
        self._names = (self._header, wire.GRPC_HEADER, wire.ENVOY_HEADER)
        self._watch_every = _validate.seconds(watch_every, "watch_every", allow_zero=False)
        # A plain dict: each poller holds its loop (for the request path's `call_later`),
        # so weak keys would never let go anyway. A loop not seen before first clears out
        # the pollers of closed loops; until a new loop comes along, the last one seen
        # stays referenced even once closed (here and in `_last`): one loop at most.
        self._pollers: dict[asyncio.AbstractEventLoop, _Poller] = {}
        self._last: tuple[asyncio.AbstractEventLoop | None, _Poller | None] = (None, None)

    async def __call__(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Run `handler` under the request's deadline (WebSocket upgrades pass through)."""
        if request.headers.get("Upgrade", "").lower() == "websocket" and _handshake(request):
            # A WebSocket session outlives any request budget (ASGI's websocket scopes
            # pass through the same way); browsers cannot even send a deadline header.
            return await handler(request)
        started = _clock.now()
        route, limits_ = self._route(request)
        getall = request.headers.getall
        headers = [
            (wire.HEADER if name == self._header else name, value)
            for name in self._names
            for value in getall(name, ())
        ]
        budget = _inbound.budget(headers, limits_, self._reserve)
        if _events.active():
            _events.emit(_events.RequestStarted(route, budget))
        outcome: RequestOutcome = "error"
        try:
            if budget <= 0.0:
                outcome = "budget_exhausted"
                return self._timeout(headers, limits_, budget, started)
            watch = _Watch(request, self._poller(), started)
            try:
                response = await watch.run(handler, budget)
            except asyncio.CancelledError:
                if watch.caller_left is not None:
                    outcome = "caller_left"
                elif _delivered(request):  # aiohttp's own cancellation, after the answer
                    outcome = "ok"
                raise
            except web.HTTPException as exc:
                # aiohttp's way to answer (a redirect, a 404): a response, not a failure,
                # unless it is a server error.
                outcome = _inbound.answer_outcome(exc.status)
                raise
            except DeadlineExceeded as exc:
                outcome = _inbound.deadline_outcome(exc)
                if request.writer.output_size == 0:
                    return self._timeout(headers, limits_, budget, started)
                if not _delivered(request):
                    raise  # the response is half out: aiohttp closes the connection
                if watch.apps_own:  # after a whole response: the handler's own error
                    outcome = "error"
                    raise
                # Our deadline cut only what the handler did after a whole response.
                outcome = "ok"
                return _Delivered()
            if watch.caller_left is not None:
                outcome = "caller_left"
            else:  # a server error the handler answered with is an error
                outcome = _inbound.answer_outcome(getattr(response, "status", 200))
            return response
        finally:
            if _events.active():
                duration = _clock.now() - started
                _events.emit(_events.RequestFinished(route, outcome, duration, budget))

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
        marked = _inbound.limits_of(getattr(route, "handler", None))
        return template or pattern or _inbound.UNMATCHED, marked or table_limits

    def _timeout(
        self, headers: Any, limits_: Limits, budget: float, started: float
    ) -> web.Response:
        body = _inbound.timeout_body(
            limit=_inbound.binding_limit(headers, limits_, self._header),
            budget=budget,
            elapsed=_clock.now() - started,
        )
        return web.Response(
            status=504,
            body=body,
            content_type="application/json",
            headers={"cache-control": "no-store"},
        )


def _handshake(request: web.Request) -> bool:
    """Whether the request is a whole WebSocket handshake (RFC 6455: GET, ``Connection:
    upgrade``, version 13, a 16-byte key; the caller checked ``Upgrade``): a lone
    ``Upgrade`` header does not skip the deadline.

    Checked here rather than with aiohttp's `WebSocketResponse.can_prepare`, which
    warns about every subprotocol a client offers that its probe does not know.
    """
    headers = request.headers
    if request.method != "GET" or headers.get("Sec-WebSocket-Version") != "13":
        return False
    tokens = {token.strip().lower() for token in headers.get("Connection", "").split(",")}
    if "upgrade" not in tokens:
        return False
    try:
        return len(base64.b64decode(headers.get("Sec-WebSocket-Key", ""), validate=True)) == 16
    except binascii.Error:
        return False


def _delivered(request: web.Request) -> bool:
    """Whether the whole response went out (`StreamResponse.write_eof` ran).

    aiohttp has no public way to ask; its writer's ``_eof`` flag says it. Without the
    flag (another aiohttp) the answer is no, and aiohttp closes the connection.
    """
    return getattr(request.writer, "_eof", False) is True


class _Delivered(web.StreamResponse):
    """What the middleware gives aiohttp for a response that went out whole before the
    deadline cut the handler's later work: nothing more is written.

    The handler's own response is lost with its exception, so aiohttp's access log
    shows this stand-in's status (200) and no body; the connection is then closed.
    """

    async def prepare(self, request: web.BaseRequest) -> None:
        return None

    async def write_eof(self, data: bytes = b"") -> None:
        return None


class _Poller:
    """Checks the connections of every handler running on one loop, every `every` seconds.

    One timer for all requests in flight instead of one per request: a request costs a
    dict insert and delete, and the timer runs only while some request is in flight.
    """

    __slots__ = ("_every", "_handle", "_loop", "_watches")

    def __init__(self, loop: asyncio.AbstractEventLoop, every: float) -> None:
        self._loop = loop
        self._every = every
        self._watches: dict[_Watch, None] = {}
        self._handle: asyncio.TimerHandle | None = None

    def add(self, watch: _Watch) -> None:
        self._watches[watch] = None
        if self._handle is None:
            self._handle = self._loop.call_later(self._every, self._check)

    def discard(self, watch: _Watch) -> None:
        self._watches.pop(watch, None)

    def close(self) -> None:
        """The loop is closed: let go of its timer and of the requests it was watching."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._watches.clear()

    def _check(self) -> None:
        """Timer callback: cancel the handlers whose connection is gone, look again later."""
        self._handle = None
        lost = [watch for watch in self._watches if watch.request.transport is None]
        for watch in lost:
            del self._watches[watch]
            if watch.gone():  # a caller gone after its whole answer did not leave
                watch.cancel_host()
        if self._watches:
            self._handle = self._loop.call_later(self._every, self._check)


class _Watch:
    """Runs one handler under the deadline and cancels it when the connection is lost."""

    __slots__ = ("_cancels", "_host", "_poller", "_started", "apps_own", "caller_left", "request")

    def __init__(self, request: web.Request, poller: _Poller, started: float) -> None:
        self.request = request
        self._poller = poller
        self._started = started
        self._host: asyncio.Task[Any] | None = None
        self._cancels = 0
        self.caller_left: CallerLeft | None = None
        self.apps_own = False  # the handler raised a DeadlineExceeded of its own

    async def run(self, handler: Handler, budget: float) -> web.StreamResponse:
        self._host = asyncio.current_task(_loop.running() or asyncio.get_running_loop())
        self._poller.add(self)
        try:
            async with deadline_scope(budget):
                try:
                    response = await handler(self.request)
                except DeadlineExceeded:  # ours reaches the handler as a cancellation
                    self.apps_own = True
                    raise
        except asyncio.CancelledError:
            if not self._cancels:
                if self.gone():  # aiohttp's handler_cancellation=True
                    self.caller_left = self._left()
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
                self.caller_left = self._left()
                return web.Response(status=499)
            raise
        finally:
            self._poller.discard(self)
            self._uncancel()
        return response

    def gone(self) -> bool:
        """The connection is lost and the response was not whole: the caller left."""
        return self.request.transport is None and not _delivered(self.request)

    def cancel_host(self) -> None:
        """The connection is gone: cancel the handler with a `CallerLeft` reason."""
        host = self._host
        if host is None or host.done():
            return
        self.caller_left = self._left()
        host.cancel(msg=self.caller_left)
        self._cancels += 1

    def _left(self) -> CallerLeft:
        elapsed = _clock.now() - self._started
        return CallerLeft(
            f"the caller left after {elapsed * 1000:.0f} ms, before the response was complete"
        )

    def _uncancel(self) -> None:
        while self._cancels and self._host is not None:
            self._host.uncancel()
            self._cancels -= 1
