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
import weakref
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Final

from opentelemetry import metrics, trace
from opentelemetry.context import Context, get_current
from opentelemetry.metrics import CallbackOptions, Histogram, MeterProvider, Observation
from opentelemetry.trace import Span, Status, StatusCode, Tracer, TracerProvider
from opentelemetry.util.types import AttributeValue

from . import __version__, _events
from ._export import (
    DEFAULT_BUCKETS,
    OVERFLOW_LABEL,
    PHASES,
    REQUEST_OUTCOMES,
    LabelGuard,
    bucket_bounds,
)

__all__ = ["DEFAULT_BUCKETS", "OVERFLOW_LABEL", "Telemetry", "install"]

_FAILED: Final = frozenset({"timeout", "deadline", "budget_exhausted", "error"})
_Attributes = dict[str, AttributeValue]
# A histogram record held back: instrument, value, attributes, the caller's context.
_Record = tuple[Histogram, float, _Attributes, Context]

# Held-back records are handed to the SDK when this many are waiting (a flush of 64
# takes ~0.4 ms), and at every collection. Past _HELD_MAX a call waits for a running
# flush instead of adding to the list, so it stays bounded.
_BATCH: Final = 64
_HELD_MAX: Final = 1024


def _from_sdk(meter: metrics.Meter) -> bool:
    """Whether `meter` is the OTel SDK's, whose collection order holding records relies on."""
    try:
        from opentelemetry.sdk.metrics import Meter
    except ImportError:  # another implementation of the API
        return False
    return isinstance(meter, Meter)


# The instruments of each meter provider, made once: the SDK ignores the callbacks of an
# observable instrument created again under the same name, so a second install on the
# same provider must reuse the first one's instruments and tallies.
_by_provider: weakref.WeakKeyDictionary[MeterProvider, _Recorder] = weakref.WeakKeyDictionary()
_by_provider_lock = threading.Lock()


class _Tally:
    """Counts kept here and reported at collection by an observable instrument.

    Counting in a dict under a lock costs a fraction of a synchronous OTel instrument's
    ``add`` (which cleans and hashes the attributes on every call).
    """

    def __init__(self, lock: threading.Lock, *keys: str) -> None:
        self._lock = lock
        self._keys = keys
        self.counts: dict[tuple[str, ...], int] = {}  # changed only under the lock
        self._attrs: dict[tuple[str, ...], _Attributes] = {}

    def add(self, values: tuple[str, ...], step: int = 1) -> None:
        """Add `step`, never going below zero (in-flight calls begun before install)."""
        with self._lock:
            self.counts[values] = max(0, self.counts.get(values, 0) + step)

    def clear(self) -> None:
        """Forget every count (in-flight figures go stale while nobody listens)."""
        with self._lock:
            self.counts.clear()

    def observe(self, options: CallbackOptions) -> Iterable[Observation]:
        """The current counts, one observation per label set."""
        with self._lock:
            counts = list(self.counts.items())
        return [Observation(n, self._attributes(values)) for values, n in counts]

    def _attributes(self, values: tuple[str, ...]) -> _Attributes:
        attrs = self._attrs.get(values)
        if attrs is None:
            attrs = self._attrs[values] = dict(zip(self._keys, values, strict=True))
        return attrs


class _Plan:
    """What a finished call with one dependency and outcome records: built once, reused."""

    __slots__ = ("calls", "dep", "dependency", "duration", "in_flight", "outcome")

    def __init__(self, dep: str, outcome: str, duration: _Attributes, dependency: _Attributes):
        self.dep = dep
        self.outcome = outcome
        self.in_flight = (dep,)
        self.calls = (dep, outcome)
        self.duration = duration  # the duration histogram's attributes
        self.dependency = dependency  # the pool wait's and the budget's


class _Recorder:
    """The deadlines instruments of one meter provider, and the observer that feeds them.

    Histogram records made outside a sampled span are held back in a short list and
    handed to the SDK in bulk: each `Histogram.record()` costs ~6 µs when they run back
    to back but 15-18 µs one at a time between the rest of a call's work. The list is
    emptied when it reaches `_BATCH` records and by a callback of the first observable
    counter. The SDK (`SynchronousMeasurementConsumer.collect`) runs every observable
    callback before it reads any instrument's storage, under the lock that serializes
    collections, so each collection, by every reader, sees every call that ended
    before it began. Records in a sampled span go to the SDK at once: an exemplar keeps
    the time of its record() call, and the call's span costs far more anyway.
    """

    def __init__(self, meter_provider: MeterProvider, buckets: tuple[float, ...], limit: int):
        meter = meter_provider.get_meter("deadlines", __version__)
        # Only the SDK is known to run observable callbacks before it reads histograms.
        self._hold = _from_sdk(meter)
        self._held: list[_Record] = []  # replaced, appended to, only under self._lock
        self._flushing = threading.Lock()  # held while records are handed to the SDK
        self.buckets = buckets
        self.telemetry: Telemetry | None = None
        self._tracer: Tracer = trace.get_tracer("deadlines", __version__)
        self._call_spans = True
        self._outbound_budget = False
        b = list(buckets)
        lock = self._lock = threading.Lock()
        self.calls = _Tally(lock, "dependency", "outcome")
        self.timeouts = _Tally(lock, "dependency", "phase")
        self.fail_fast = _Tally(lock, "dependency")
        self.calls_in_flight = _Tally(lock, "dependency")
        self.requests = _Tally(lock, "route", "outcome")
        self.caller_left = _Tally(lock, "route")
        self.requests_in_flight = _Tally(lock, "route")
        self.jobs_expired = _Tally(lock, "queue")
        counters = [
            ("deadlines.outbound.calls", self.calls, "{call}", "Outbound calls that ended."),
            ("deadlines.outbound.timeouts", self.timeouts, "{call}", "Timeouts, by phase."),
            ("deadlines.outbound.fail_fast", self.fail_fast, "{call}", "Calls not made."),
            ("deadlines.inbound.requests", self.requests, "{request}", "Requests ended."),
            ("deadlines.inbound.caller_left", self.caller_left, "{request}", "Caller left."),
            ("deadlines.jobs.expired", self.jobs_expired, "{job}", "Expired jobs dropped."),
        ]
        for name, tally, unit, text in counters:
            callbacks = [tally.observe]
            if tally is self.calls:  # once per collection, before any storage is read
                callbacks.insert(0, self._flush_at_collection)
            meter.create_observable_counter(name, callbacks, unit, text)
        gauges = [
            ("deadlines.outbound.in_flight", self.calls_in_flight, "{call}", "Calls running."),
            ("deadlines.inbound.in_flight", self.requests_in_flight, "{request}", "Requests."),
        ]
        for name, tally, unit, text in gauges:
            meter.create_observable_up_down_counter(name, [tally.observe], unit, text)

        def histogram(name: str, text: str) -> Histogram:
            return meter.create_histogram(name, "s", text, explicit_bucket_boundaries_advisory=b)

        self.duration = histogram("deadlines.outbound.duration", "Whole call, pool included.")
        self.pool_wait = histogram("deadlines.outbound.pool_wait", "Waiting for a connection.")
        self.budget = histogram("deadlines.outbound.budget", "Budget left at a call's start.")
        self.inbound_budget = histogram("deadlines.inbound.budget", "Budget on arrival.")
        self._dependency = LabelGuard("dependency", limit)
        self._route = LabelGuard("route", limit)
        self._queue = LabelGuard("queue", limit)
        self._attrs: dict[tuple[str, ...], _Attributes] = {}
        self._in_flight_keys: dict[str, tuple[str]] = {}
        self._plans: dict[tuple[str, str], _Plan] = {}

    def attach(
        self, telemetry: Telemetry, tracer: Tracer, call_spans: bool, outbound_budget: bool
    ) -> None:
        """Start feeding the instruments for `telemetry`."""
        self.telemetry = telemetry
        self._tracer = tracer
        self._call_spans = call_spans
        self._outbound_budget = outbound_budget

    def detach(self) -> None:
        """Stop; in-flight counts restart from zero at the next install."""
        self.telemetry = None
        self.calls_in_flight.clear()
        self.requests_in_flight.clear()

    def flush(self, wait: bool = True) -> None:
        """Hand every held-back histogram record to the SDK, oldest first.

        The whole swap-and-record runs under `_flushing`, so a collection that flushes
        waits for a flush another thread has begun: no record is between the list and
        the SDK while a collection reads the storages. With ``wait=False`` (a call that
        filled the list) it returns at once if another flush is running.
        """
        if not self._flushing.acquire(wait):
            return
        try:
            with self._lock:
                held, self._held = self._held, []
            for histogram, value, attributes, context in held:
                histogram.record(value, attributes, context)
        finally:
            self._flushing.release()

    def _flush_at_collection(self, options: CallbackOptions) -> Iterable[Observation]:
        self.flush()
        return ()

    def _a(self, *pairs: str) -> _Attributes:
        """The attribute dict for ("key", value, ...), cached: built once per label set."""
        attrs = self._attrs.get(pairs)
        if attrs is None:
            attrs = self._attrs[pairs] = dict(zip(pairs[::2], pairs[1::2], strict=True))
        return attrs

    # The observer: runs inline on every call, so it does little and never raises. The
    # two histogram records are most of the cost; around them, the outbound events touch
    # as few objects as they can (one cached plan per dependency and outcome, one lock).

    def observe(self, event: _events.Event) -> None:
        """Record one event (an `_events.Observer`)."""
        if isinstance(event, _events.CallStarted):
            key = self._in_flight_keys.get(event.dependency)
            if key is None:
                key = self._in_flight_key(event.dependency)
            self.calls_in_flight.add(key)
        elif isinstance(event, _events.CallFinished):
            self._call_finished(event)
        elif isinstance(event, _events.RequestStarted):
            route = self._route(event.route)
            if not math.isfinite(event.budget):
                self.requests_in_flight.add((route,))
                return
            context = get_current()
            span = trace.get_current_span(context)
            attrs = self._a("route", route)
            if self._hold and not span.get_span_context().trace_flags.sampled:
                key, counts = (route,), self.requests_in_flight.counts
                with self._lock:  # the flush swaps the list under this lock: read it here
                    counts[key] = counts.get(key, 0) + 1
                    held = self._held
                    held.append((self.inbound_budget, event.budget, attrs, context))
                    full = len(held)
                if full >= _BATCH:
                    self.flush(full >= _HELD_MAX)
            else:
                self.requests_in_flight.add((route,))
                self.inbound_budget.record(event.budget, attrs, context)
            if span.is_recording():
                span.set_attribute("deadlines.request.budget", event.budget)
        elif isinstance(event, _events.RequestFinished):
            self._request_finished(event)
        elif isinstance(event, _events.JobDropped):
            self.jobs_expired.add((self._queue(event.queue),))
            span = trace.get_current_span()
            if span.is_recording():
                span.add_event(
                    "deadlines.job_dropped",
                    {"deadlines.queue": event.queue, "deadlines.late": event.late},
                )

    def _in_flight_key(self, dependency: str) -> tuple[str]:
        key = (self._dependency(dependency),)
        if key[0] == dependency:  # folded names are not kept: they are unbounded
            self._in_flight_keys[dependency] = key
        return key

    def _call_finished(self, event: _events.CallFinished) -> None:
        outcome = event.outcome
        plan = self._plans.get((event.dependency, outcome))
        if plan is None:
            plan = self._plan(event.dependency, outcome)
        context = get_current()
        span = trace.get_current_span(context)
        records: list[_Record] = [(self.duration, event.duration, plan.duration, context)]
        if event.pool_wait is not None:
            records.append((self.pool_wait, event.pool_wait, plan.dependency, context))
        if self._outbound_budget and math.isfinite(event.budget):
            records.append((self.budget, event.budget, plan.dependency, context))
        hold = self._hold and not span.get_span_context().trace_flags.sampled
        in_flight, calls = self.calls_in_flight.counts, self.calls.counts
        with self._lock:  # the in-flight count never goes below zero (calls begun before)
            if event.started:
                in_flight[plan.in_flight] = max(0, in_flight.get(plan.in_flight, 0) - 1)
            calls[plan.calls] = calls.get(plan.calls, 0) + 1
            if hold:  # the flush swaps the list under this lock: never extend a list
                held = self._held  # that is already being handed to the SDK
                held += records
                full = len(held)
        if not hold:
            for histogram, value, attributes, ctx in records:
                histogram.record(value, attributes, ctx)
        elif full >= _BATCH:
            self.flush(full >= _HELD_MAX)
        if outcome != "ok":
            self._call_failed(event, plan)
        if span.is_recording():
            self._call_trace(span, event, outcome, context)

    def _plan(self, dependency: str, outcome: str) -> _Plan:
        dep = self._dependency(dependency)
        plan = _Plan(
            dep, outcome, self._a("dependency", dep, "outcome", outcome), self._a("dependency", dep)
        )
        if dep == dependency:  # folded names are not kept: they are unbounded
            self._plans[(dependency, outcome)] = plan
        return plan

    def _call_failed(self, event: _events.CallFinished, plan: _Plan) -> None:
        if plan.outcome in ("timeout", "deadline"):
            phase = event.phase if event.phase in PHASES else "unknown"
            self.timeouts.add((plan.dep, phase))
        elif plan.outcome == "budget_exhausted":
            self.fail_fast.add((plan.dep,))

    def _call_trace(
        self, span: Span, event: _events.CallFinished, outcome: str, context: Context
    ) -> None:
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
            sent = event.request_sent
            if sent is not None:
                attrs["deadlines.request_sent"] = sent
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
            context,
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
        outcome = event.outcome if event.outcome in REQUEST_OUTCOMES else "error"
        self.requests_in_flight.add((route,), -1)
        self.requests.add((route, outcome))
        if outcome == "caller_left":
            self.caller_left.add((route,))
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attribute("deadlines.request.outcome", outcome)


class Telemetry:
    """An installation of deadlines' span attributes and OTel metrics; `uninstall` stops it.

    Counters and in-flight figures are counted here and reported by observable
    instruments at each collection; durations, pool waits and budgets are histograms.
    The instruments belong to the meter provider and stay after `uninstall`; installing
    again on the same provider continues the same counters.
    """

    def __init__(self, recorder: _Recorder) -> None:
        self._recorder = recorder
        self._unsubscribe: Callable[[], None] | None = None

    def uninstall(self) -> None:
        """Stop recording (idempotent)."""
        if self._unsubscribe is None:
            return
        self._unsubscribe()
        self._unsubscribe = None
        with _by_provider_lock:
            self._recorder.detach()

    def __enter__(self) -> Telemetry:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.uninstall()


def install(
    meter_provider: MeterProvider | None = None,
    tracer_provider: TracerProvider | None = None,
    *,
    buckets: Sequence[float | timedelta] = DEFAULT_BUCKETS,
    call_spans: bool = True,
    outbound_budget: bool = False,
    max_label_values: int = 100,
) -> Telemetry:
    """Start reporting deadlines to OpenTelemetry: span attributes and metrics.

    Args:
        meter_provider: Where the metrics go; the global one by default.
        tracer_provider: Makes the ``deadlines.call`` spans; the global one by default.
        buckets: Histogram bounds in seconds (an advisory the SDK's views may override).
        call_spans: A child span per outbound call (True) or an event on the current
            span (False).
        outbound_budget: Also record the ``deadlines.outbound.budget`` histogram (the
            budget left when each call started). Off by default: each OTel histogram
            record costs 6-18 µs in the SDK, and every call span already carries the
            same figure as ``deadlines.remaining``.
        max_label_values: Distinct dependency, route and queue attribute values kept for
            metrics; further values are counted under ``"other"``.

    Returns the `Telemetry` handle; `uninstall()` it (or use it in a ``with``) to stop.
    The first install on a meter provider creates its instruments, with `buckets` and
    `max_label_values`; later installs on it continue them. Raises `ValueError` while
    another installation on the same provider is active, or for different buckets.
    """
    if isinstance(max_label_values, bool) or not isinstance(max_label_values, int):
        raise TypeError(f"max_label_values must be an int, not {max_label_values!r}")
    if max_label_values < 1:
        raise ValueError(f"max_label_values must be >= 1, got {max_label_values}")
    provider = metrics.get_meter_provider() if meter_provider is None else meter_provider
    bounds = bucket_bounds(buckets)
    tracer = trace.get_tracer("deadlines", __version__, tracer_provider)
    with _by_provider_lock:
        recorder = _by_provider.get(provider)
        if recorder is None:
            recorder = _by_provider[provider] = _Recorder(provider, bounds, max_label_values)
        if recorder.telemetry is not None:
            raise ValueError(
                "deadlines telemetry is already installed for this meter provider;"
                " uninstall() the first installation"
            )
        if recorder.buckets != bounds:
            raise ValueError(
                f"this meter provider's deadlines histograms already use buckets"
                f" {recorder.buckets}; pass the same buckets or another provider"
            )
        telemetry = Telemetry(recorder)
        recorder.attach(telemetry, tracer, call_spans, outbound_budget)
    telemetry._unsubscribe = _events.observe(recorder.observe)
    return telemetry
