"""One stream of events that integrations report to and exporters subscribe to.

Core defines the events and the subscription; `deadlines.prometheus`, `deadlines.otel`
and logging turn them into metrics, span attributes and log records. With nobody
subscribed, reporting an event costs one truthiness check.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Literal, TypeAlias, TypeVar

_T = TypeVar("_T")


def _writes_slots(cls: type[_T]) -> type[_T]:
    """Give a frozen, slotted dataclass an ``__init__`` that writes its slots directly.

    The ``__init__`` dataclass writes for a frozen class goes through
    ``object.__setattr__`` once per field, several times the cost of writing the slot,
    and events are built on every call while anybody listens. Instances stay frozen:
    assigning to a field afterwards still raises `dataclasses.FrozenInstanceError`.
    """
    namespace: dict[str, Any] = {}
    params, lines = [], []
    for each in fields(cls):  # type: ignore[arg-type]
        name = each.name
        namespace[f"_set_{name}"] = getattr(cls, name).__set__
        if each.default is MISSING:
            params.append(name)
        else:
            namespace[f"_default_{name}"] = each.default
            params.append(f"{name}=_default_{name}")
        lines.append(f"    _set_{name}(self, {name})")
    exec(f"def __init__(self, {', '.join(params)}):\n" + "\n".join(lines), namespace)
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


CallOutcome = Literal["ok", "timeout", "deadline", "budget_exhausted", "cancelled", "error"]
#: ``"late"``: the deadline passed while the request waited in a `Gate` (504, no work);
#: ``"shed"``: the `Gate` refused it to protect the service (503, no work).
RequestOutcome = Literal[
    "ok", "deadline", "caller_left", "budget_exhausted", "error", "late", "shed"
]


@_writes_slots
@dataclass(frozen=True, slots=True)
class CallStarted:
    """An outbound call to `dependency` began with `budget` seconds left (inf: no deadline).

    `call` identifies the call while it runs: its `CallFinished` carries the same number
    (0: not known), so an observer can pair them when calls overlap.
    """

    dependency: str
    budget: float
    call: int = field(default=0, compare=False, repr=False)


@_writes_slots
@dataclass(frozen=True, slots=True)
class CallFinished:
    """An outbound call ended. `phase` is where a failure happened, `pool_wait` in seconds.

    `started` is False for a call refused before it began (fail-fast): no `CallStarted`
    preceded it, so in-flight counts must not come down. A call that the request's
    deadline cut short is reported as outcome ``"deadline"`` with the phase it was in.
    `call` is the number its `CallStarted` carried.
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
    call: int = field(default=0, compare=False, repr=False)


@_writes_slots
@dataclass(frozen=True, slots=True)
class RequestStarted:
    """An inbound request on `route` arrived with `budget` seconds to answer."""

    route: str
    budget: float


@_writes_slots
@dataclass(frozen=True, slots=True)
class RequestFinished:
    """An inbound request ended with `outcome` after `duration` seconds."""

    route: str
    outcome: RequestOutcome
    duration: float
    budget: float


@_writes_slots
@dataclass(frozen=True, slots=True)
class JobDropped:
    """A queued job was found expired (by `late` seconds) and dropped before running."""

    queue: str
    late: float


#: Why a `deadlines.Gate` refused a request: ``"late"``, its deadline passed before its
#: work could start (504); ``"admission"``, less time left than the route's usual service
#: time; ``"codel"``, it waited too long in a standing queue; ``"queue"``, the queue was
#: full (each 503).
GateReason = Literal["late", "admission", "codel", "queue"]


@_writes_slots
@dataclass(frozen=True, slots=True)
class RequestRefused:
    """A `deadlines.Gate` refused an inbound request on `route`, for `reason`, without
    running it. Its `RequestFinished` follows, with outcome ``"late"`` or ``"shed"``."""

    route: str
    reason: GateReason


#: What a client refused: a call (the throttle, the limit) or a retry (the retry budget).
Refusal = Literal["throttled", "limit", "retry_budget"]


@_writes_slots
@dataclass(frozen=True, slots=True)
class AttemptRefused:
    """The client did not make an attempt to `dependency`, to protect it from overload.

    `reason`: ``"throttled"`` (adaptive throttling), ``"limit"`` (the adaptive
    concurrency limit is reached), ``"retry_budget"`` (a retry the budget did not
    allow; the call ended with its last answer or error).
    """

    dependency: str
    reason: Refusal


@_writes_slots
@dataclass(frozen=True, slots=True)
class LimitChanged:
    """The adaptive concurrency limit of `dependency` moved to `limit` calls in flight."""

    dependency: str
    limit: int


@_writes_slots
@dataclass(frozen=True, slots=True)
class HedgeSent:
    """A backup of a slow idempotent call to `dependency` went out after `delay` seconds."""

    dependency: str
    delay: float


Event: TypeAlias = (
    CallStarted
    | CallFinished
    | RequestStarted
    | RequestFinished
    | RequestRefused
    | JobDropped
    | AttemptRefused
    | LimitChanged
    | HedgeSent
)
Observer: TypeAlias = Callable[[Event], None]

observers: tuple[Observer, ...] = ()


def observe(observer: Observer) -> Callable[[], None]:
    """Send every event to `observer`; returns a function that unsubscribes it.

    Observers run inline on the hot path: keep them fast and never raise. An observer
    that raises is isolated (its error is reported with `sys.unraisablehook`).
    """
    global observers
    observers = (*observers, observer)

    def unsubscribe() -> None:
        global observers
        observers = tuple(o for o in observers if o is not observer)

    return unsubscribe


def emit(event: Event) -> None:
    """Report `event` to every observer."""
    for observer in observers:
        try:
            observer(event)
        except Exception as exc:  # an exporter bug must never fail a request
            import sys

            sys.unraisablehook(_Unraisable(exc, observer))  # type: ignore[arg-type]


def active() -> bool:
    """Whether anybody is listening (skip building events when not)."""
    return bool(observers)


class _Unraisable:
    """The shape `sys.unraisablehook` expects."""

    def __init__(self, exc: BaseException, obj: object) -> None:
        self.exc_type = type(exc)
        self.exc_value = exc
        self.exc_traceback = exc.__traceback__
        self.err_msg = "Exception in deadlines observer"
        self.object = obj
