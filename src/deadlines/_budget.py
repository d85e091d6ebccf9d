"""`CallBudget`: one outbound call's limits, derived from a `Dependency` and the deadline.

Every outbound integration (httpx, aiohttp, gRPC, Postgres, streams) uses this one
object, so all of them agree on the rules: fail fast below `min_useful`; each phase
limited by min(its cap, time left); time in the pool counts toward the total; an error
says which limit was binding.
"""

from __future__ import annotations

import asyncio
import math
from types import TracebackType
from typing import Literal

from . import _clock, _events, _scope
from ._dependency import Dependency
from ._errors import (
    BudgetExhausted,
    CallRefused,
    CallTimeout,
    ConnectTimeout,
    DeadlineExceeded,
    HeadersTimeout,
    IdleTimeout,
    Phase,
    PoolTimeout,
    TotalTimeout,
)
from ._throttle import OVERLOAD_STATUSES
from .wire import format_ms

Limit = Literal["pool", "connect", "headers", "idle", "total"]
#: What bounds a phase: its own cap, the call's total cap, or the request's deadline.
Binding = Literal["cap", "total", "deadline"]

_CUT_TOLERANCE = 0.002  # seconds

_PHASE_OF: dict[Limit, Phase] = {
    "pool": "pool",
    "connect": "connect",
    "headers": "headers",
    "idle": "body",
    "total": "body",
}
#: The `Dependency` field capping each phase.
_CAP_FIELD: dict[Limit, str] = {
    "pool": "pool_wait",
    "connect": "connect",
    "headers": "headers",
    "idle": "idle",
    "total": "total",
}
_CAP_ERROR: dict[Limit, type[CallTimeout]] = {
    "pool": PoolTimeout,
    "connect": ConnectTimeout,
    "headers": HeadersTimeout,
    "idle": IdleTimeout,
    "total": TotalTimeout,
}


class CallBudget:
    """The limits for one call, fixed when it starts. For integration authors.

        budget = CallBudget(dependency)          # raises BudgetExhausted when too late
        with budget:                             # reports start/finish to observers
            wait = budget.limit("connect")       # seconds: min(cap, time left)
            ...
            raise budget.timeout("connect")      # the right error for what fired

    The call's end is the earliest of the request's deadline and ``start + total``.
    """

    # Slots: one is made per outbound call, on every integration's hot path.
    __slots__ = (
        "_answered_at",
        "_end_source",
        "_frame",
        "_guarded",
        "_learns",
        "_overloaded",
        "_sources",
        "budget",
        "dependency",
        "end",
        "finished",
        "phase",
        "pool_wait",
        "request_budget",
        "request_end",
        "request_sent",
        "start",
    )

    def __init__(self, dependency: Dependency) -> None:
        self.dependency = dependency
        self.start = start = _clock.now()
        frame = _scope.frame_var.get()
        #: Clock instant of the request's deadline (inf without one).
        self.request_end = request_end = math.inf if frame is None else frame.at
        #: Seconds the request's deadline scope was given (None without one).
        self.request_budget = None if frame is None else frame.budget
        budget = request_end - start
        self.budget = budget = budget if budget > 0.0 else 0.0  # inf without a deadline
        own_end = start + dependency.total
        #: The call's end, and what sets it (ties go to the request's deadline).
        self.end = own_end if own_end < request_end else request_end
        self._end_source: Binding = "total" if own_end < request_end else "deadline"
        self.pool_wait: float | None = None
        self.request_sent = False
        #: The phase in progress: the one whose limit was computed last.
        self.phase: Phase | None = None
        self._frame = frame
        self._sources: dict[Limit, Binding] = {}
        #: Whether `finish` reported the call's end.
        self.finished = False
        if budget <= 0.0 or budget < dependency.min_useful:
            exc = BudgetExhausted(
                remaining=budget,
                min_useful=dependency.min_useful,
                dependency=dependency.name,
            )
            if _events.active():
                _events.emit(
                    _events.CallFinished(
                        dependency.name,
                        "budget_exhausted",
                        0.0,
                        self.budget,
                        request_sent=False,
                        error=exc,
                        started=False,
                    )
                )
            raise exc
        # The dependency's overload guards, if any: a place under the adaptive limit,
        # the throttle's draw. Refused: nothing started, CallRefused.
        guarded = dependency.limit is not None or dependency.throttle is not None
        self._guarded = guarded
        #: Whether anything learns from the call's outcome (the guards, a hedge).
        self._learns = learns = guarded or dependency.hedge is not None
        if learns:
            self._answered_at: float | None = None
            self._overloaded = False
            if guarded:
                self._admit()

    def _admit(self) -> None:
        dependency = self.dependency
        limit, throttle = dependency.limit, dependency.throttle
        if limit is not None and not limit.acquire():
            self._refuse("limit")
        if throttle is not None and not throttle.admit():
            if limit is not None:
                limit.release(None)  # the place taken above, given back unused
            self._refuse("throttled")

    def _refuse(self, reason: Literal["limit", "throttled"]) -> None:
        name = self.dependency.name
        if _events.active():
            _events.emit(_events.AttemptRefused(name, reason))
        raise CallRefused(reason=reason, dependency=name)

    def answered(self, status: int | None = None) -> None:
        """The response head arrived (with `status`): for the overload guards.

        Integrations call it when the head is in. The time to the head is the latency
        the adaptive limit and the hedge learn from; a status in `OVERLOAD_STATUSES`
        (429, 503) says the dependency refused the call for overload.
        """
        if self._learns:
            self._answered_at = _clock.now()
            self._overloaded = status in OVERLOAD_STATUSES

    def left(self) -> float:
        """Seconds until the call's end (the deadline or the total cap), never negative."""
        return max(0.0, self.end - _clock.now())

    def limit(self, which: Limit) -> float:
        """Seconds the phase `which` may take from now, and remember what bounds it."""
        now = _clock.now()
        # Ties go to the request's deadline, then to the call's own total.
        end, source = self.end, self._end_source
        if which != "total":
            cap_end = now + getattr(self.dependency, _CAP_FIELD[which])
            if cap_end < end:
                end, source = cap_end, "cap"
            self.phase = _PHASE_OF[which]
        self._sources[which] = source
        left = end - now
        return left if left > 0.0 else 0.0

    def binding(self, which: Limit) -> Binding:
        """What bounded phase `which` when its limit was last computed (`limit(which)`)."""
        return self._sources.get(which, "cap")

    def header_ms(self) -> str:
        """The remaining time to send onward (``x-request-timeout-ms``): until the call's end."""
        return format_ms(self.end - _clock.now())  # "0" once past

    def timeout(
        self,
        which: Limit,
        *,
        request_sent: bool | None = None,
        phase: Phase | None = None,
        cap: float | None = None,
    ) -> DeadlineExceeded | CallTimeout:
        """The error for limit `which` running out, naming the limit that was binding.

        The phase is the one `which` bounds, unless `phase` says where the call was
        when the total (or the deadline) ran out. `cap` is a shorter cap than the
        dependency's that bound it (a client's own per-operation timeout).
        """
        phase = _PHASE_OF[which] if phase is None else phase
        sent = (phase not in ("pool", "connect")) if request_sent is None else request_sent
        elapsed = _clock.now() - self.start
        source = "cap" if cap is not None else self.binding(which)
        name = self.dependency.name
        if source == "deadline":
            return DeadlineExceeded(
                limit=self.request_budget,
                elapsed=elapsed,
                phase=phase,
                dependency=name,
                request_sent=sent,
                pool_wait=self.pool_wait,
            )
        if source == "total":
            return TotalTimeout(
                limit=self.dependency.total,
                elapsed=elapsed,
                phase=phase,
                dependency=name,
                request_sent=sent,
                pool_wait=self.pool_wait,
            )
        limit = getattr(self.dependency, _CAP_FIELD[which]) if cap is None else cap
        return _CAP_ERROR[which](
            limit=limit,
            elapsed=elapsed,
            dependency=name,
            phase=phase,
            request_sent=sent,
            pool_wait=self.pool_wait,
        )

    # Reporting to observers (metrics, traces, logs).

    def __enter__(self) -> CallBudget:
        if _events.observers:  # as `_events.active()`, without the call: every call asks
            _events.emit(_events.CallStarted(self.dependency.name, self.budget, id(self)))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.finish(exc)

    def finish(self, error: BaseException | None = None) -> None:
        """Report the end of the call once (later calls are ignored)."""
        if self.finished:
            return
        self.finished = True
        cancelled = error is not None and _is_cancellation(error)
        cut = cancelled and self._note_cut()
        if self._learns:
            self._learn(error, cancelled and not cut)
        if not _events.observers:
            return
        outcome: _events.CallOutcome
        phase: str | None = None
        limit: float | None = None
        sent = self.request_sent or self.phase in ("headers", "body")
        if error is None:
            outcome = "ok"
        elif isinstance(error, BudgetExhausted):
            outcome = "budget_exhausted"
        elif isinstance(error, DeadlineExceeded | CallTimeout):
            outcome = "deadline" if isinstance(error, DeadlineExceeded) else "timeout"
            phase, limit = error.phase, error.limit
            sent = sent if error.request_sent is None else error.request_sent
        elif cut:
            outcome, phase, limit = "deadline", self.phase, self.request_budget
        elif _is_cancellation(error):
            outcome, phase = "cancelled", self.phase
        else:
            outcome, phase = "error", self.phase
        _events.emit(
            _events.CallFinished(
                self.dependency.name,
                outcome,
                _clock.now() - self.start,
                self.budget,
                phase=phase,
                pool_wait=self.pool_wait,
                request_sent=sent,
                limit=limit,
                error=error,
                call=id(self),
            )
        )

    def _learn(self, error: BaseException | None, cancelled: bool) -> None:
        """Tell the dependency's guards how the call went: its latency, or that it failed.

        A call cancelled before its answer (its caller left, another hedge won), not by
        the request's deadline, says nothing about the dependency: no sample.
        """
        dependency = self.dependency
        answered = self._answered_at
        if answered is None and error is None:
            answered = _clock.now()  # an integration that does not report the head
        ok = answered is not None and not self._overloaded
        latency = answered - self.start if answered is not None and ok else None
        silent = cancelled and answered is None
        if self._guarded:
            limit = dependency.limit
            if limit is not None:
                changed = limit.release(None if silent else latency, failed=not (ok or silent))
                if changed is not None and _events.active():
                    _events.emit(_events.LimitChanged(dependency.name, changed))
            throttle = dependency.throttle
            if throttle is not None and not silent:
                throttle.record(ok)
        hedge = dependency.hedge
        if hedge is not None and latency is not None:
            hedge.latency.add(latency)

    def _note_cut(self) -> bool:
        """Tell the request's scope where this call was if its deadline cancelled it."""
        frame = self._frame
        # The loop's timer and our clock may disagree by a hair about the instant.
        if frame is None or frame.at - _clock.now() > _CUT_TOLERANCE:
            return False
        sent = self.request_sent or self.phase in ("headers", "body")
        frame.cut = _scope.Cut(self.dependency.name, self.phase, sent, self.pool_wait)
        return True


def _is_cancellation(error: BaseException) -> bool:
    """asyncio's CancelledError, trio's Cancelled, or a generator closed mid-call."""
    if isinstance(error, asyncio.CancelledError | GeneratorExit):
        return True
    return type(error).__name__ == "Cancelled" and type(error).__module__.startswith("trio")
