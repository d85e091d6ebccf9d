"""One stream of events that integrations report to and exporters subscribe to.

Core defines the events and the subscription; `deadlines.prometheus`, `deadlines.otel`
and logging turn them into metrics, span attributes and log records. With nobody
subscribed, reporting an event costs one truthiness check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, TypeAlias

CallOutcome = Literal["ok", "timeout", "deadline", "budget_exhausted", "cancelled", "error"]
RequestOutcome = Literal["ok", "deadline", "caller_left", "budget_exhausted", "error"]


@dataclass(frozen=True, slots=True)
class CallStarted:
    """An outbound call to `dependency` began with `budget` seconds left (inf: no deadline)."""

    dependency: str
    budget: float


@dataclass(frozen=True, slots=True)
class CallFinished:
    """An outbound call ended. `phase` is where a failure happened, `pool_wait` in seconds.

    `started` is False for a call refused before it began (fail-fast): no `CallStarted`
    preceded it, so in-flight counts must not come down. A call that the request's
    deadline cut short is reported as outcome ``"deadline"`` with the phase it was in.
    """

    dependency: str
    outcome: CallOutcome
    duration: float
    budget: float
    phase: str | None = None
    pool_wait: float | None = None
    request_sent: bool | None = None
    limit: float | None = None
    error: BaseException | None = None
    started: bool = True


@dataclass(frozen=True, slots=True)
class RequestStarted:
    """An inbound request on `route` arrived with `budget` seconds to answer."""

    route: str
    budget: float


@dataclass(frozen=True, slots=True)
class RequestFinished:
    """An inbound request ended with `outcome` after `duration` seconds."""

    route: str
    outcome: RequestOutcome
    duration: float
    budget: float


@dataclass(frozen=True, slots=True)
class JobDropped:
    """A queued job was found expired (by `late` seconds) and dropped before running."""

    queue: str
    late: float


Event: TypeAlias = CallStarted | CallFinished | RequestStarted | RequestFinished | JobDropped
Observer: TypeAlias = Callable[[Event], None]

_observers: tuple[Observer, ...] = ()


def observe(observer: Observer) -> Callable[[], None]:
    """Send every event to `observer`; returns a function that unsubscribes it.

    Observers run inline on the hot path: keep them fast and never raise. An observer
    that raises is isolated (its error is reported with `sys.unraisablehook`).
    """
    global _observers
    _observers = (*_observers, observer)

    def unsubscribe() -> None:
        global _observers
        _observers = tuple(o for o in _observers if o is not observer)

    return unsubscribe


def emit(event: Event) -> None:
    """Report `event` to every observer."""
    for observer in _observers:
        try:
            observer(event)
        except Exception as exc:  # an exporter bug must never fail a request
            import sys

            sys.unraisablehook(_Unraisable(exc, observer))  # type: ignore[arg-type]


def active() -> bool:
    """Whether anybody is listening (skip building events when not)."""
    return bool(_observers)


class _Unraisable:
    """The shape `sys.unraisablehook` expects."""

    def __init__(self, exc: BaseException, obj: object) -> None:
        self.exc_type = type(exc)
        self.exc_value = exc
        self.exc_traceback = exc.__traceback__
        self.err_msg = "Exception in deadlines observer"
        self.object = obj
