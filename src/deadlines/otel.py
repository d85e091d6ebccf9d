"""OpenTelemetry for deadlines: budget and timeout attributes on spans, and the metrics.

    from deadlines import otel

    telemetry = otel.install()               # global providers; or pass your own
    ...
    telemetry.uninstall()                    # or: with otel.install(...): ...

Traces. Inside a recording span (your server instrumentation's, or your own):

- an inbound request sets ``deadlines.request.budget`` (seconds it arrived with) and
  ``deadlines.request.outcome`` on the current span;
- every outbound call becomes a child span ``deadlines.call <dependency>`` with its
  real start and end, carrying ``deadlines.dependency``, ``deadlines.remaining`` (the
  budget left when it started), ``deadlines.outcome``, ``deadlines.pool_wait``, and on a
  failure ``deadlines.phase``, ``deadlines.limit``, ``deadlines.request_sent`` and an
  error status (``call_spans=False``: a ``deadlines.call`` event on the current span
  instead);
- a timeout also sets ``deadlines.timeout.dependency``, ``deadlines.timeout.phase``,
  ``deadlines.timeout.pool_wait`` and ``deadlines.timeout.request_sent`` on the current
  span, so the hop's own span says where its time went;
- a dropped expired job adds a ``deadlines.job_dropped`` event.

Nothing is recorded outside a recording span: no orphan root spans.

Metrics mirror `deadlines.prometheus` (an OTel Prometheus exporter turns
``deadlines.outbound.calls`` into ``deadlines_outbound_calls_total``), with the same
plain attribute names: ``dependency``, ``outcome``, ``phase``, ``route``, ``queue``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from itertools import pairwise
from types import TracebackType
from typing import Final

from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
from opentelemetry.trace import Span, Status, StatusCode, TracerProvider
from opentelemetry.util.types import AttributeValue

from . import __version__, _events, _validate

__all__ = ["DEFAULT_BUCKETS", "OVERFLOW_LABEL", "Telemetry", "install"]

#: Histogram bucket bounds in seconds (the same as `deadlines.prometheus`).
DEFAULT_BUCKETS: Final[tuple[float, ...]] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
#: The attribute value that stands for every value beyond `max_label_values`.
OVERFLOW_LABEL: Final = "other"

_PHASES: Final = frozenset({"pool", "connect", "headers", "body"})
_CALL_OUTCOMES: Final = frozenset(
    {"ok", "timeout", "deadline", "budget_exhausted", "cancelled", "error"}
)
_REQUEST_OUTCOMES: Final = frozenset({"ok", "deadline", "caller_left", "budget_exhausted", "error"})
_FAILED: Final = frozenset({"timeout", "deadline", "budget_exhausted", "error"})
_Attributes = dict[str, AttributeValue]

# One installation per meter provider: two would count every call twice.
_installed: set[int] = set()
_installed_lock = threading.Lock()


class _Labels:
    """Admits at most `limit` distinct values of one attribute; later ones become "other"."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        if len(self._seen) < self._limit:
            self._seen.add(value)
            return value
        return OVERFLOW_LABEL


def _started(event: _events.CallFinished) -> bool:
    """Whether a `CallStarted` preceded this event (a fail-fast has none).

    `CallBudget` reports a fail-fast from its constructor, before raising: that error
    has no traceback yet.
    """
    if event.outcome != "budget_exhausted":
        return True
    return event.error is not None and event.error.__traceback__ is not None


def _outcome(event: _events.CallFinished) -> str:
    """The outcome to report: a cancellation once the request's deadline passed is "deadline".

    `deadlines.scope` stops the work under it by cancelling it, so a call cut short by
    the request's deadline ends in a cancellation (its phase then unknown). A
    cancellation `CallBudget` cannot name (trio's) is a cancellation, not an error.
    """
    outcome = event.outcome if event.outcome in _CALL_OUTCOMES else "error"
    if outcome == "error" and event.error is not None and not isinstance(event.error, Exception):
        outcome = "cancelled"
    if outcome == "cancelled" and event.duration >= event.budget:
        outcome = "deadline"
    return outcome


class Telemetry:
    """Span attributes and OTel metrics, fed by the event stream until `uninstall`."""

    def __init__(
        self,
        meter_provider: MeterProvider,
        tracer_provider: TracerProvider | None,
        *,
        buckets: Sequence[float],
        call_spans: bool,
        max_label_values: int,
    ) -> None:
        self._provider_key = id(meter_provider)
        meter = meter_provider.get_meter("deadlines", __version__)
        self._tracer = trace.get_tracer("deadlines", __version__, tracer_provider)
        self._call_spans = call_spans
        b = list(buckets)
        self.outbound_calls = meter.create_counter(
            "deadlines.outbound.calls", "{call}", "Outbound calls that ended, by outcome."
        )
        self.outbound_timeouts = meter.create_counter(
            "deadlines.outbound.timeouts", "{call}", "Outbound calls that timed out, by phase."
        )
        self.outbound_fail_fast = meter.create_counter(
            "deadlines.outbound.fail_fast", "{call}", "Outbound calls not made: budget too low."
        )
        self.outbound_duration = meter.create_histogram(
            "deadlines.outbound.duration",
            "s",
            "Whole outbound call, pool wait included.",
            explicit_bucket_boundaries_advisory=b,
        )
        self.outbound_pool_wait = meter.create_histogram(
            "deadlines.outbound.pool_wait",
            "s",
            "Time waiting for a free pooled connection.",
            explicit_bucket_boundaries_advisory=b,
        )
        self.outbound_budget = meter.create_histogram(
            "deadlines.outbound.budget",
            "s",
            "Request budget left when an outbound call started.",
            explicit_bucket_boundaries_advisory=b,
        )
        self.inbound_requests = meter.create_counter(
            "deadlines.inbound.requests", "{request}", "Inbound requests that ended."
        )
        self.inbound_caller_left = meter.create_counter(
            "deadlines.inbound.caller_left", "{request}", "Inbound requests whose caller left."
        )
        self.inbound_budget = meter.create_histogram(
            "deadlines.inbound.budget",
            "s",
            "Budget an inbound request arrived with.",
            explicit_bucket_boundaries_advisory=b,
        )
        self.jobs_expired = meter.create_counter(
            "deadlines.jobs.expired", "{job}", "Queued jobs dropped unrun, expired."
        )
        self._lock = threading.Lock()
        self._calls_in_flight: dict[str, int] = {}
        self._requests_in_flight: dict[str, int] = {}
        meter.create_observable_up_down_counter(
            "deadlines.outbound.in_flight",
            [self._read(self._calls_in_flight, "dependency")],
            "{call}",
            "Outbound calls in progress.",
        )
        meter.create_observable_up_down_counter(
            "deadlines.inbound.in_flight",
            [self._read(self._requests_in_flight, "route")],
            "{request}",
            "Inbound requests in progress.",
        )
        self._dependency = _Labels(max_label_values)
        self._route = _Labels(max_label_values)
        self._queue = _Labels(max_label_values)
        self._attrs: dict[tuple[str, ...], _Attributes] = {}
        self._unsubscribe: Callable[[], None] | None = None

    def _read(
        self, counts: dict[str, int], key: str
    ) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            if self._unsubscribe is None:
                return []
            with self._lock:
                return [Observation(n, {key: label}) for label, n in counts.items()]

        return observe

    def _a(self, *pairs: str) -> _Attributes:
        """The attribute dict for ("key", value, ...), cached: built once per label set."""
        attrs = self._attrs.get(pairs)
        if attrs is None:
            attrs = self._attrs[pairs] = dict(zip(pairs[::2], pairs[1::2], strict=True))
        return attrs

    def _start(self) -> None:
        with _installed_lock:
            if self._provider_key in _installed:
                raise ValueError(
                    "deadlines telemetry is already installed for this meter provider;"
                    " uninstall() the first installation"
                )
            _installed.add(self._provider_key)
        self._unsubscribe = _events.observe(self._observe)

    def uninstall(self) -> None:
        """Stop recording (idempotent). Instruments stay in the provider, unchanged."""
        if self._unsubscribe is None:
            return
        self._unsubscribe()
        self._unsubscribe = None
        with _installed_lock:
            _installed.discard(self._provider_key)

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.uninstall()

    # The observer: runs inline on every call, so it does little and never raises.

    def _observe(self, event: _events.Event) -> None:
        if isinstance(event, _events.CallStarted):
            self._move(self._calls_in_flight, self._dependency(event.dependency), 1)
        elif isinstance(event, _events.CallFinished):
            outcome = _outcome(event)
            self._call_metrics(event, outcome)
            span = trace.get_current_span()
            if span.is_recording():
                self._call_trace(span, event, outcome)
        elif isinstance(event, _events.RequestStarted):
            route = self._route(event.route)
            self._move(self._requests_in_flight, route, 1)
            if math.isfinite(event.budget):
                self.inbound_budget.record(event.budget, self._a("route", route))
                span = trace.get_current_span()
                if span.is_recording():
                    span.set_attribute("deadlines.request.budget", event.budget)
        elif isinstance(event, _events.RequestFinished):
            self._request_finished(event)
        elif isinstance(event, _events.JobDropped):
            self.jobs_expired.add(1, self._a("queue", self._queue(event.queue)))
            span = trace.get_current_span()
            if span.is_recording():
                span.add_event(
                    "deadlines.job_dropped",
                    {"deadlines.queue": event.queue, "deadlines.late": event.late},
                )

    def _call_metrics(self, event: _events.CallFinished, outcome: str) -> None:
        dep = self._dependency(event.dependency)
        if _started(event):
            self._move(self._calls_in_flight, dep, -1)
        with_outcome = self._a("dependency", dep, "outcome", outcome)
        self.outbound_calls.add(1, with_outcome)
        self.outbound_duration.record(event.duration, with_outcome)
        by_dep = self._a("dependency", dep)
        if event.pool_wait is not None:
            self.outbound_pool_wait.record(event.pool_wait, by_dep)
        if math.isfinite(event.budget):
            self.outbound_budget.record(event.budget, by_dep)
        if outcome in ("timeout", "deadline"):
            phase = event.phase if event.phase in _PHASES else "unknown"
            self.outbound_timeouts.add(1, self._a("dependency", dep, "phase", phase))
        elif outcome == "budget_exhausted":
            self.outbound_fail_fast.add(1, by_dep)

    def _call_trace(self, span: Span, event: _events.CallFinished, outcome: str) -> None:
        attrs: _Attributes = {
            "deadlines.dependency": event.dependency,
            "deadlines.outcome": outcome,
        }
        if math.isfinite(event.budget):
            attrs["deadlines.remaining"] = event.budget
        if event.pool_wait is not None:
            attrs["deadlines.pool_wait"] = event.pool_wait
        if outcome != "ok":
            if event.phase is not None:
                attrs["deadlines.phase"] = event.phase
            if event.limit is not None:
                attrs["deadlines.limit"] = event.limit
            if event.request_sent is not None:
                attrs["deadlines.request_sent"] = event.request_sent
        if outcome in ("timeout", "deadline"):
            span.set_attributes(
                {
                    "deadlines.timeout.dependency": event.dependency,
                    "deadlines.timeout.phase": event.phase or "unknown",
                    "deadlines.timeout.pool_wait": event.pool_wait or 0.0,
                    "deadlines.timeout.request_sent": bool(event.request_sent),
                }
            )
        if not self._call_spans:
            span.add_event("deadlines.call", attrs)
            return
        end = time.time_ns()
        child = self._tracer.start_span(
            f"deadlines.call {event.dependency}",
            attributes=attrs,
            start_time=end - int(event.duration * 1e9),
        )
        if outcome in _FAILED:
            if event.error is not None:
                child.record_exception(event.error, timestamp=end)
            child.set_status(Status(StatusCode.ERROR, str(event.error or outcome)))
        child.end(end_time=end)

    def _request_finished(self, event: _events.RequestFinished) -> None:
        route = self._route(event.route)
        outcome = event.outcome if event.outcome in _REQUEST_OUTCOMES else "error"
        self._move(self._requests_in_flight, route, -1)
        self.inbound_requests.add(1, self._a("route", route, "outcome", outcome))
        if outcome == "caller_left":
            self.inbound_caller_left.add(1, self._a("route", route))
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attribute("deadlines.request.outcome", outcome)

    def _move(self, counts: dict[str, int], label: str, step: int) -> None:
        """Count in-flight by label, never below zero (calls that began before install)."""
        with self._lock:
            counts[label] = max(0, counts.get(label, 0) + step)


def install(
    meter_provider: MeterProvider | None = None,
    tracer_provider: TracerProvider | None = None,
    *,
    buckets: Sequence[float | timedelta] = DEFAULT_BUCKETS,
    call_spans: bool = True,
    max_label_values: int = 100,
) -> Telemetry:
    """Start reporting deadlines to OpenTelemetry: span attributes and metrics.

    Args:
        meter_provider: Where the metrics go; the global one by default.
        tracer_provider: Makes the ``deadlines.call`` spans; the global one by default.
        buckets: Histogram bounds in seconds (an advisory the SDK's views may override).
        call_spans: A child span per outbound call (True) or an event on the current
            span (False).
        max_label_values: Distinct dependency, route and queue attribute values kept for
            metrics; further values are counted under ``"other"``.

    Returns the `Telemetry` handle; `uninstall()` it (or use it in a ``with``) to stop.
    Raises `ValueError` if already installed for the same meter provider.
    """
    if isinstance(max_label_values, bool) or not isinstance(max_label_values, int):
        raise TypeError(f"max_label_values must be an int, not {max_label_values!r}")
    if max_label_values < 1:
        raise ValueError(f"max_label_values must be >= 1, got {max_label_values}")
    provider = metrics.get_meter_provider() if meter_provider is None else meter_provider
    telemetry = Telemetry(
        provider,
        tracer_provider,
        buckets=_buckets(buckets),
        call_spans=call_spans,
        max_label_values=max_label_values,
    )
    telemetry._start()
    return telemetry


def _buckets(values: Sequence[float | timedelta]) -> tuple[float, ...]:
    """Validated, strictly increasing bucket bounds in seconds."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise TypeError(f"buckets must be a sequence of seconds, not {values!r}")
    bounds = tuple(_validate.seconds(v, "each bucket", allow_zero=False) for v in values)
    if not bounds:
        raise ValueError("buckets must not be empty")
    if any(b >= c for b, c in pairwise(bounds)):
        raise ValueError(f"buckets must be strictly increasing, got {bounds}")
    return bounds
