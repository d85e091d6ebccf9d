"""`Request`: one inbound request's deadline, whichever framework it came through.

Every inbound middleware (ASGI, aiohttp.web, WSGI, Django, gRPC) makes one per request
and keeps only its framework's input and output. The request owns:

- its arrival time, route label and budget (`wire.capped_budget`, the one budget rule);
- its deadline frame in the context (`enter`, `leave`), nearer outer deadlines binding;
- the timer that cancels the work at the instant (`arm`: at once, or late, from a loop
  callback, for middlewares that arm only requests still running after a while);
- the caller leaving (`left`), the 504's body (`timeout_body`) and the outcome of a
  deadline error (`deadline_outcome`);
- its two events, `RequestStarted` when made and `RequestFinished` once (`finish`);
- its pass through a `Gate`, if the middleware has one (`through`, `late_in_gate`).

Standard library only, so the WSGI middleware stays dependency-free.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from . import _alarms, _clock, _events, _inbound, _loop, wire
from ._errors import BudgetExhausted, CallerLeft, DeadlineExceeded
from ._events import RequestOutcome, RequestRefused
from ._gate import Gate, GateRefusal
from ._inbound import Limits
from ._scope import Canceller, Frame, exceeded, frame_var


def budget(found: float | None, limits: Limits, reserve: float) -> float:
    """Seconds for a request whose headers asked for `found` (None: no valid header)."""
    return wire.capped_budget(
        found, default=limits.default, maximum=limits.maximum, reserve=reserve
    )


def deadline_outcome(exc: DeadlineExceeded) -> RequestOutcome:
    """The request outcome for a deadline error that ended a handler."""
    return "budget_exhausted" if isinstance(exc, BudgetExhausted) else "deadline"


def answer_outcome(status: int) -> RequestOutcome:
    """The outcome of a request answered with HTTP `status`: a server error (5xx) is an
    error; anything else, a 4xx included, is an answer."""
    return "error" if status >= 500 else "ok"


class Request:
    """One request's deadline from arrival to its last event (see the module docs).

    No ``__slots__``: the ASGI middleware's exchange extends it, and most requests never
    set most of this state, so it stays at the class-level defaults.
    """

    frame: Frame | None = None  # the deadline in force inside the request (ours or outer)
    caller_left: CallerLeft | None = None
    timeout: _alarms.Timeout | None = None  # the armed asyncio timer
    canceller: Canceller | None = None  # the armed trio timer (its `cancel_scope`)
    _token: contextvars.Token[Frame | None] | None = None
    _reported = False
    queued = False  # waiting in a gate: a deadline then is "late" (`late_in_gate`)
    refusal: GateRefusal | None = None  # what the gate refused the request with

    def __init__(self, route: str, budget: float, arrived: float) -> None:
        self.route, self.budget, self.arrived = route, budget, arrived
        if _events.observers:
            _events.emit(_events.RequestStarted(route, budget))

    def enter(self) -> Frame:
        """Set the request's deadline in the current context (a nearer outer one binds)."""
        frame = frame_var.get()
        at = self.arrived + self.budget
        if frame is None or at < frame.at:
            frame = Frame(at, self.budget, self.arrived)
        self.frame = frame
        self._token = frame_var.set(frame)
        return frame

    def arm(self, loop: asyncio.AbstractEventLoop | None, task: asyncio.Task[Any] | None) -> None:
        """Arm the cancellation of `task` (default: the current one) at the deadline.

        `loop` is the running asyncio loop, None under trio. Called on arrival, or later
        from a loop callback with the request's `task` while the deadline is still far.
        """
        assert self.frame is not None
        left = self.frame.remaining()  # the binding frame may be an outer one
        if loop is not None:
            timeout = _alarms.Timeout(loop.time() + left)
            timeout.enter(loop, task)
            self.timeout = timeout
        else:
            self.canceller = Canceller.start(left)

    def leave(self, exc_type: type[BaseException] | None, exc: BaseException | None) -> None:
        """Disarm and restore the context; raise `DeadlineExceeded` when our own timer's
        cancellation ended the work."""
        token, self._token = self._token, None
        timeout, canceller = self.timeout, self.canceller
        if timeout is None and canceller is None:  # never armed: most ASGI requests
            if token is not None:
                frame_var.reset(token)
            return
        try:
            if timeout is not None:
                fired = timeout.leave(exc_type)
            else:
                assert canceller is not None
                fired = canceller.stop(exc_type, exc)
        finally:
            if token is not None:
                frame_var.reset(token)
        if fired:
            assert self.frame is not None
            raise exceeded(self.frame) from None

    # As a context manager: ``with`` sets the deadline (sync code checks it); ``async
    # with`` also arms it at once, as `deadlines.scope` does.

    def __enter__(self) -> Frame:
        return self.enter()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        self.leave(exc_type, exc)

    async def __aenter__(self) -> Frame:
        frame = self.enter()
        try:
            self.arm(_loop.running(), None)
        except BaseException:
            self.leave(None, None)
            raise
        return frame

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        self.leave(exc_type, exc)

    def left(self) -> CallerLeft:
        """Note that the caller left before the response was complete; the reason given."""
        elapsed = _clock.now() - self.arrived
        self.caller_left = CallerLeft(
            f"the caller left after {elapsed * 1000:.0f} ms, before the response was complete"
        )
        return self.caller_left

    def timeout_body(self, asked: Iterable[tuple[Any, Any]], limits: Limits, header: str) -> bytes:
        """The 504's JSON body: the limit that ran out (of the deadline headers `asked`,
        ours named `header`: see `_inbound.binding_limit`), the budget, the time taken."""
        return _inbound.timeout_body(
            limit=_inbound.binding_limit(asked, limits, header),
            budget=self.budget,
            elapsed=_clock.now() - self.arrived,
        )

    async def through(self, gate: Gate, work: Callable[[], Awaitable[bool]]) -> GateRefusal | None:
        """Await `work()` once `gate` lets the request through; `work` says whether its
        service time is worth learning (an answer, not a server error, its caller still
        there). The gate's refusal instead, kept in `refusal`: the work never ran, and
        the middleware answers it."""
        assert self.frame is not None
        self.queued = True
        refusal = await gate.enter(self.route, self.arrived, self.frame.at)
        if refusal is not None:  # still `queued`: the deadline passing now is late
            self.refusal = refusal
            return refusal
        self.queued = False
        started = _clock.now()
        learn = False
        try:
            learn = await work()
        finally:
            gate.leave(self.route, started, learn=learn)
        return None

    def late_in_gate(self) -> bool:
        """Whether the deadline that ended the request passed while it waited in a gate:
        its outcome is then "late", and it is reported as refused, unless the gate
        refused it itself (and reported it)."""
        if not self.queued:
            return False
        if self.refusal is None and _events.observers:
            _events.emit(RequestRefused(self.route, "late"))
        return True

    def finish(self, outcome: RequestOutcome) -> None:
        """Emit `RequestFinished` with `outcome`, unless it was emitted already."""
        if self._reported:
            return
        self._reported = True
        if _events.observers:
            duration = _clock.now() - self.arrived
            _events.emit(_events.RequestFinished(self.route, outcome, duration, self.budget))
