"""`DeadlineMiddleware`: reads a request's deadline headers and route, and runs the app
under the request's deadline (the package docs tell the whole story)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from .. import _clock, _events, _inbound, _loop, _validate, wire
from .._events import RequestOutcome
from .._gate import Gate
from .._inbound import Limits
from .._scope import running_trio
from ._exchange import ASGIApp, Exchange, Receive, Scope, Send, Sweeper
from ._routes import host_of, match_framework_route, route_path, routes_by_host, routes_of
from ._trio import TrioExchange, TrioSweeper

_get_ident = threading.get_ident
_ROUTE_CACHE_SIZE = 1024
_PLAIN_CACHE_SIZE = 1024
_OUR_HEADER = wire.HEADER.encode()
_MAX_MS_DIGITS = 12  # as `wire.parse_ms`: longer is garbage, not a budget
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
        gate: A `deadlines.Gate` in front of the app (asyncio only): it refuses at once
            what cannot be answered in time (503 with ``Retry-After``; 504 for a
            deadline that passed while the request waited) and queues requests beyond
            its limit. None (the default): every request goes straight to the app.
            WebSocket scopes bypass it, as they bypass the deadline: a session would
            hold a turn for its whole length.
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
        gate: Gate | None = None,
    ) -> None:
        if not callable(app):
            raise TypeError(f"app must be an ASGI callable, not {app!r}")
        if isinstance(read_ahead, bool) or not isinstance(read_ahead, int) or read_ahead < 0:
            raise ValueError(f"read_ahead must be a number of bytes >= 0, got {read_ahead!r}")
        if gate is not None and not isinstance(gate, Gate):
            raise TypeError(f"gate must be a deadlines.Gate, not {gate!r}")
        self.app = app
        self.gate = gate
        self._table = _inbound.RouteTable(routes, Limits(default=default, maximum=maximum))
        self._reserve = _validate.seconds(reserve, "reserve")
        self.header = _inbound.header_name(header)
        self.header_bytes = self.header.encode()
        # The names `_scan` picks out: ours (or its stand-in), the others `wire` reads.
        others = (wire.GRPC_HEADER, wire.ENVOY_HEADER)
        self._known = frozenset({self.header_bytes, b"expect", *(n.encode() for n in others)})
        self._plain: dict[bytes, float] = {}  # values of our header parsed (`_remember`)
        self.read_ahead = read_ahead
        self._watch_after = _validate.seconds(watch_after, "watch_after")
        # A deadline that could pass before the sweeper comes round is armed on arrival
        # (2x: room for the sweeper's own lateness).
        self._arm_within = 2 * self._watch_after
        # The app's routes, if it has them itself; else each request's ``scope["app"]``.
        self._routed = app if routes_of(app) is not None else None
        self._routes_app: object = self._routed  # the app `_routes` is for (fixed if routed)
        # Keyed on (method, path), or for an app that routes by host on (method, path,
        # Host header): `__call__`'s lookup on the pair then always misses to `_route`.
        self._routes: dict[tuple[str, ...], _Route] = {}
        self._by_host: bool | None = None  # whether `_routes_app` routes by host; None: unknown
        # A sweeper holds its loop (every request reads it), so weak keys would never let
        # go: closed loops are forgotten instead, when the next new loop arrives.
        self._sweepers: dict[asyncio.AbstractEventLoop, Sweeper] = {}
        self._sweeper: Sweeper | None = None  # the last one asked for (loops with `_thread_id`)
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
        budget = wire.capped_budget(
            found, default=limits_.default, maximum=limits_.maximum, reserve=self._reserve
        )
        # The running loop's sweeper: the last one's while its loop runs in this thread
        # (`_loop.running`'s test, inline; only loops with a `_thread_id` are
        # remembered), else asked for. None under trio or without a loop.
        sweeper = self._sweeper
        if sweeper is None or sweeper.loop._thread_id != _get_ident():  # type: ignore[attr-defined]
            loop = _loop.running()
            sweeper = None if loop is None else self._sweeper_for(loop)
        if sweeper is not None:
            exchange = Exchange(self, receive, send, label, budget, started)
        else:
            exchange = self._exchange_outside_asyncio(scope, receive, send, label, budget, started)
        if budget <= 0.0:
            try:
                await exchange.answer_timeout(scope, limits_)
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
                exchange.loop = loop = sweeper.loop
                exchange.host = host = _loop.current_task(loop)
                if expect:  # "100 Continue" goes out on the app's first read
                    exchange.may_read_ahead = False
                if host is None or frame.at <= started + self._arm_within:
                    exchange.arm(loop, host)  # without a task: fails as a scope
                sweeper.pending[exchange] = started
                if sweeper.entry is None:
                    sweeper.wake()
            else:
                exchange.register(expect)  # trio (or no loop: fails)
            if self.gate is None:
                await self.app(scope, exchange.receive, exchange.send)
            else:
                outcome = await exchange.gated(self.gate, self.app, scope, limits_)
        except BaseException as exc:
            outcome = "error"  # should settling it fail too
            outcome, error = await exchange.failed(exc, scope, limits_)
            if outcome in ("deadline", "budget_exhausted") and exchange.late_in_gate():
                outcome = "late"  # the deadline passed while it waited in the gate
            if error is exc:
                raise
            if error is not None:
                raise error from None  # the deadline passed after the response started
        else:
            exchange.active = False  # before any await: see `_failed`
            exchange.leave(None, None)
            if exchange.caller_left is not None:
                outcome = "caller_left"
                await exchange.answer_gone()
        finally:
            if sweeper is not None:
                sweeper.pending.pop(exchange, None)
            elif exchange.trio_sweeper is not None:
                exchange.trio_sweeper.pending.pop(exchange, None)
            if exchange.watcher is not None or exchange.cancels:
                exchange.stop_watching()
            if _events.observers:  # else `finish` reports nothing (a few calls saved)
                if exchange.caller_left is not None:
                    outcome = "caller_left"
                exchange.finish(outcome)

    def _exchange_outside_asyncio(
        self, scope: Scope, receive: Receive, send: Send, route: str, budget: float, started: float
    ) -> Exchange:
        """Under trio, the trio exchange; with no loop at all, one that fails as a scope would."""
        trio = running_trio()
        if trio is None:
            return Exchange(self, receive, send, route, budget, started)
        if self.gate is not None:
            raise RuntimeError(
                "DeadlineMiddleware(gate=...) runs under asyncio only (a Gate's queue is"
                " made of asyncio futures): under trio, leave the gate out"
            )
        version = scope.get("http_version")
        return TrioExchange(self, receive, send, route, budget, started, trio, version)

    def _sweeper_for(self, loop: asyncio.AbstractEventLoop) -> Sweeper:
        sweeper = self._sweepers.get(loop)
        if sweeper is None:
            _loop.forget_closed(self._sweepers, Sweeper.close)
            sweeper = self._sweepers[loop] = Sweeper(loop, self._watch_after)
        if hasattr(loop, "_thread_id"):  # asyncio's own loops; uvloop's are asked each time
            self._sweeper = sweeper
        return sweeper

    def trio_sweeper_for(self, trio: Any) -> TrioSweeper:
        runs = self._trio_sweepers
        if runs is None:
            runs = self._trio_sweepers = trio.lowlevel.RunVar("deadlines.asgi.sweeper")
        sweeper: TrioSweeper | None = runs.get(None)
        if sweeper is None:
            sweeper = TrioSweeper(trio, self._watch_after)
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
            by_host = self._by_host = routes_by_host(self._routes_app)
        key: tuple[str, ...] = (method, path, host_of(scope)) if by_host else (method, path)
        found = self._routes.get(key)
        if found is None:
            found = self._resolve(self._routes_app, scope, method, path)
            if len(self._routes) >= _ROUTE_CACHE_SIZE:
                self._routes.clear()
            self._routes[key] = found
        return found

    def _resolve(self, app: Any, scope: Scope, method: str, path: str) -> _Route:
        pattern, table_limits = self._table.match(method, route_path(scope, path))
        template, marked = match_framework_route(app, scope)
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
            if name == self.header_bytes:
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
            if name == self.header_bytes:
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
