"""OpenTelemetry for deadlines: budget and timeout attributes on spans, and the metrics.

    from deadlines import otel

    telemetry = otel.install()               # global providers; or pass your own
    ...
    telemetry.uninstall()                    # or: with otel.install(...): ...

Traces. Inside a recording span (your server instrumentation's, or your own):

- an inbound request sets ``deadlines.request.budget`` (seconds it arrived with) and
  ``deadlines.request.outcome`` on the current span;
- every outbound call is a child span ``deadlines.call <dependency>``, started with the
  call and current until it ends, so the spans of the client's own instrumentation
  (opentelemetry-instrumentation-aiohttp-client, a driver's) are its children. It
  carries ``deadlines.dependency``, ``deadlines.remaining`` (the budget left when it
  started), ``deadlines.outcome``, ``deadlines.pool_wait``, and on a failure
  ``deadlines.phase``, ``deadlines.limit``, ``deadlines.request_sent``, ``error.type``
  and an error status (``call_spans=False``: a ``deadlines.call`` event on the current
  span instead);
- a timeout also sets ``deadlines.timeout.dependency``, ``deadlines.timeout.phase``,
  ``deadlines.timeout.pool_wait`` and ``deadlines.timeout.request_sent`` on the current
  span, so the hop's own span says where its time went;
- a dropped expired job adds a ``deadlines.job_dropped`` event;
- an attempt refused to protect a dependency adds a ``deadlines.attempt_refused`` event
  (``deadlines.dependency``, ``deadlines.reason``), a hedge a ``deadlines.hedge_sent``
  event (``deadlines.dependency``, ``deadlines.delay``).

Nothing is recorded outside a recording span: no orphan root spans.

Metrics mirror `deadlines.prometheus` (an OTel Prometheus exporter turns
``deadlines.outbound.calls`` into ``deadlines_outbound_calls_total``), with the same
plain attribute names: ``dependency``, ``outcome``, ``phase``, ``route``, ``queue``.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Final

from ._extras import missing

try:
    from opentelemetry import metrics, trace
    from opentelemetry.context import (
        Context,
        attach,
        create_key,
        get_current,
        get_value,
        set_value,
    )
    from opentelemetry.metrics import CallbackOptions, Histogram, MeterProvider, Observation
    from opentelemetry.trace import INVALID_SPAN, Span, Status, StatusCode, Tracer, TracerProvider
    from opentelemetry.util.types import AttributeValue
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise missing("deadlines.otel", "opentelemetry-api", "otel") from exc

from . import __version__, _events
from ._errors import DeadlinesError
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
# The context key under which an open call span is current, and how many running calls
# keep one (past it the oldest is forgotten: a response nobody closes never ends its call).
_OPEN: Final = create_key("deadlines.call")
_OPEN_MAX: Final = 4096
_Attributes = dict[str, AttributeValue]
# A histogram record: instrument, value, attributes, the context it was made in.
_Record = tuple[Histogram, float, _Attributes, Context]
# What the observer holds back until the next flush, oldest first: the dependency of a
# call that started; a call that ended, with its context and whether its histograms are
# recorded already; or one histogram record.
_Held = str | tuple[_events.CallFinished, Context, bool] | _Record

# Held-back items are applied when this many wait, and at every collection. 64 items
# are 32 calls: 64 histogram records, ~0.4-0.8 ms of work for the call that fills the
# queue (a bigger batch saves little: the records are warm after a few). Past _HELD_MAX
# a call waits for a flush another thread runs, so the queue stays bounded.
_BATCH: Final = 64
_HELD_MAX: Final = 1024


def _sampled(span: Span) -> bool:
    """Whether the SDK's default exemplar filter (trace_based) samples a record in `span`."""
    return span is not INVALID_SPAN and span.get_span_context().trace_flags.sampled


def _from_sdk(meter: metrics.Meter) -> bool:
    """Whether `meter` is the OTel SDK's, whose collection order holding records relies on."""
    try:
        from opentelemetry.sdk.metrics import Meter
    except ImportError:  # another implementation of the API
        return False
    return isinstance(meter, Meter)


def _error_type(event: _events.CallFinished) -> str:
    """``error.type`` of a failed call: the error's class, named as the user imports it."""
    error = event.error
    if event.outcome == "deadline" and not isinstance(error, DeadlinesError):
        return "deadlines.DeadlineExceeded"  # cut by the scope, which raises that
    if error is None:
        return "_OTHER"
    cls = type(error)
    if cls.__module__ == "builtins":
        return cls.__qualname__
    # The shortest module path that exports it: httpx.ConnectError, not httpx._exceptions.
    # An error that is also the client's own (`deadlines._errors.also`) is named by the
    # class of ours it extends, which is what is exported.
    for klass in cls.__mro__:
        parts = klass.__module__.split(".")
        for end in range(1, len(parts) + 1):
            module = sys.modules.get(".".join(parts[:end]))
            if getattr(module, klass.__qualname__, None) is klass:
                return f"{'.'.join(parts[:end])}.{klass.__qualname__}"
    return f"{cls.__module__}.{cls.__qualname__}"


class _Open:
    """An outbound call's span, current from the call's start in the context it began in."""

    __slots__ = ("ended", "parent", "span")

    def __init__(self, span: Span, parent: Context) -> None:
        self.span = span
        self.parent = parent  # the context current when the call began
        self.ended = False

    def close(self) -> None:
        """Make the caller's span current again, if this call's span still is here."""
        self.ended = True
        if get_value(_OPEN) is not self:
            return  # another call's span is current, or this is not the call's context
        context = self.parent
        # Calls closed out of order: skip the spans of those that ended already.
        while isinstance(opened := get_value(_OPEN, context), _Open) and opened.ended:
            context = opened.parent
        attach(context)


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

    def set(self, values: tuple[str, ...], value: int) -> None:
        """Make the figure for `values` `value` (a gauge's latest reading)."""
        with self._lock:
            self.counts[values] = value

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

    An outbound call's metrics are held back: the observer appends the call's start and
    end to a queue, and a flush applies them in bulk (in-flight and call counts under
    one lock, then the histogram records), because each SDK `Histogram.record()` costs
    ~6 µs back to back but 15-18 µs one at a time between the rest of a call's work. A
    flush runs when `_BATCH` items wait and from a callback of the first observable
    counter: the SDK (`SynchronousMeasurementConsumer.collect`) runs every observable
    callback before it reads any instrument's storage, under the lock that serializes
    collections, so every collection, by every reader, sees every call that ended
    before it began. In a sampled span the histograms are recorded at once, so an
    exemplar keeps the time of the call's end (the call's span costs far more anyway).
    With a meter that is not the SDK's, each event is applied as it comes.
    """

    def __init__(self, meter_provider: MeterProvider, buckets: tuple[float, ...], limit: int):
        meter = meter_provider.get_meter("deadlines", __version__)
        # Only the SDK is known to run observable callbacks before it reads histograms.
        self._holds = _from_sdk(meter)
        self._held: deque[_Held] = deque()  # appended to anywhere, emptied by a flush
        self._flushing = threading.Lock()  # held while a flush takes items and applies them
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
        self.refused = _Tally(lock, "dependency", "reason")
        self.requests_refused = _Tally(lock, "route", "reason")
        self.hedges = _Tally(lock, "dependency")
        self.limit = _Tally(lock, "dependency")
        counters = [
            ("deadlines.outbound.calls", self.calls, "{call}", "Outbound calls that ended."),
            ("deadlines.outbound.timeouts", self.timeouts, "{call}", "Timeouts, by phase."),
            ("deadlines.outbound.fail_fast", self.fail_fast, "{call}", "Calls not made."),
            ("deadlines.inbound.requests", self.requests, "{request}", "Requests ended."),
            ("deadlines.inbound.caller_left", self.caller_left, "{request}", "Caller left."),
            ("deadlines.jobs.expired", self.jobs_expired, "{job}", "Expired jobs dropped."),
            ("deadlines.inbound.refused", self.requests_refused, "{request}", "Gate refusals."),
            ("deadlines.outbound.refused", self.refused, "{call}", "Attempts not made."),
            ("deadlines.outbound.hedges", self.hedges, "{call}", "Backups sent."),
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
        meter.create_observable_gauge(
            "deadlines.outbound.limit", [self.limit.observe], "{call}", "Adaptive limit."
        )

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
        self._open: dict[int, _Open] = {}  # the spans of running calls, by event.call

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
        self.flush()  # calls that ended count; then what is in flight is forgotten
        self.calls_in_flight.clear()
        self.requests_in_flight.clear()

    def flush(self, wait: bool = True) -> None:
        """Apply every held-back item, oldest first: counts, then histogram records.

        Taking the items and applying them both run under `_flushing`, so a collection
        that flushes waits for a flush another thread has begun: no item is between the
        queue and the SDK while a collection reads. With ``wait=False`` (a call that
        filled the queue) it returns at once if another flush is running.
        """
        if not self._flushing.acquire(wait):
            return
        try:
            held = self._held
            # Only here are items taken, so the len(held) oldest are there to take.
            self._apply([held.popleft() for _ in range(len(held))])
        finally:
            self._flushing.release()

    def _apply(self, items: list[_Held]) -> None:
        # Keys and plans first, outside the lock: a new name may log (LabelGuard).
        steps: list[tuple[str] | tuple[_Plan, _events.CallFinished, Context, bool]] = []
        records: list[_Record] = []
        for item in items:
            if isinstance(item, str):
                key = self._in_flight_keys.get(item)
                steps.append(key if key is not None else self._in_flight_key(item))
            elif len(item) == 3:
                event = item[0]
                plan = self._plans.get((event.dependency, event.outcome))
                if plan is None:
                    plan = self._plan(event.dependency, event.outcome)
                steps.append((plan, *item))
            else:
                records.append(item)
        ended: list[tuple[_Plan, _events.CallFinished, Context]] = []
        in_flight, calls = self.calls_in_flight.counts, self.calls.counts
        timeouts, fail_fast = self.timeouts.counts, self.fail_fast.counts
        with self._lock:
            for step in steps:
                if len(step) == 1:
                    in_flight[step] = in_flight.get(step, 0) + 1
                    continue
                plan, event, context, recorded = step
                if event.started:  # never below zero: calls begun before install
                    in_flight[plan.in_flight] = max(0, in_flight.get(plan.in_flight, 0) - 1)
                calls[plan.calls] = calls.get(plan.calls, 0) + 1
                if plan.outcome in ("timeout", "deadline"):
                    phase = event.phase if event.phase in PHASES else "unknown"
                    timeouts[plan.dep, phase] = timeouts.get((plan.dep, phase), 0) + 1
                elif plan.outcome == "budget_exhausted":
                    fail_fast[plan.in_flight] = fail_fast.get(plan.in_flight, 0) + 1
                if not recorded:
                    ended.append((plan, event, context))
        for plan, event, context in ended:
            self._record(plan, event, context)
        for histogram, value, attributes, context in records:
            histogram.record(value, attributes, context)

    def _record(self, plan: _Plan, event: _events.CallFinished, context: Context) -> None:
        self.duration.record(event.duration, plan.duration, context)
        if event.pool_wait is not None:
            self.pool_wait.record(event.pool_wait, plan.dependency, context)
        if self._outbound_budget and math.isfinite(event.budget):
            self.budget.record(event.budget, plan.dependency, context)

    def _hold(self, item: _Held) -> None:
        held = self._held
        held.append(item)
        if len(held) >= _BATCH or not self._holds:
            self._flush_held()

    def _flush_held(self) -> None:
        """After an append that filled the queue (or for a meter that is not the SDK's)."""
        self.flush(not self._holds or len(self._held) >= _HELD_MAX)

    def _flush_at_collection(self, options: CallbackOptions) -> Iterable[Observation]:
        self.flush()
        return ()

    def _a(self, *pairs: str) -> _Attributes:
        """The attribute dict for ("key", value, ...), cached: built once per label set."""
        attrs = self._attrs.get(pairs)
        if attrs is None:
            attrs = self._attrs[pairs] = dict(zip(pairs[::2], pairs[1::2], strict=True))
        return attrs

    # The observer: runs inline on every call, so it does little and never raises. An
    # outbound call's start and end are appended to the held-back queue (no lock: a
    # deque's append is atomic); only a call in a recording span does more inline.

    def observe(self, event: _events.Event) -> None:
        """Record one event (an `_events.Observer`)."""
        if isinstance(event, _events.CallStarted):
            held = self._held  # _hold(), inline: this runs on every call
            held.append(event.dependency)
            if len(held) >= _BATCH or not self._holds:
                self._flush_held()
            if self._call_spans and event.call:
                context = get_current()
                if trace.get_current_span(context).is_recording():
                    self._open_call(event, context)
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
            self.requests_in_flight.add((route,))
            if self._holds and not _sampled(span):
                self._hold((self.inbound_budget, event.budget, attrs, context))
            else:
                self.inbound_budget.record(event.budget, attrs, context)
            if span.is_recording():
                span.set_attribute("deadlines.request.budget", event.budget)
        elif isinstance(event, _events.RequestFinished):
            self._request_finished(event)
        elif isinstance(event, _events.RequestRefused):
            self.requests_refused.add((self._route(event.route), event.reason))
        elif isinstance(event, _events.JobDropped):
            self.jobs_expired.add((self._queue(event.queue),))
            span = trace.get_current_span()
            if span.is_recording():
                span.add_event(
                    "deadlines.job_dropped",
                    {"deadlines.queue": event.queue, "deadlines.late": event.late},
                )
        elif isinstance(event, _events.AttemptRefused):
            self.refused.add((self._dependency(event.dependency), event.reason))
            span = trace.get_current_span()
            if span.is_recording():
                span.add_event(
                    "deadlines.attempt_refused",
                    {"deadlines.dependency": event.dependency, "deadlines.reason": event.reason},
                )
        elif isinstance(event, _events.LimitChanged):
            self.limit.set((self._dependency(event.dependency),), event.limit)
        elif isinstance(event, _events.HedgeSent):
            self.hedges.add((self._dependency(event.dependency),))
            span = trace.get_current_span()
            if span.is_recording():
                span.add_event(
                    "deadlines.hedge_sent",
                    {"deadlines.dependency": event.dependency, "deadlines.delay": event.delay},
                )

    def _in_flight_key(self, dependency: str) -> tuple[str]:
        key = (self._dependency(dependency),)
        if key[0] == dependency:  # folded names are not kept: they are unbounded
            self._in_flight_keys[dependency] = key
        return key

    def _open_call(self, event: _events.CallStarted, context: Context) -> None:
        """Start the call's span and make it current: the client's own spans nest in it."""
        attrs: _Attributes = {"deadlines.dependency": event.dependency}
        if math.isfinite(event.budget):
            attrs["deadlines.remaining"] = event.budget
        span = self._tracer.start_span(
            f"deadlines.call {event.dependency}", context, attributes=attrs
        )
        opened = self._open[event.call] = _Open(span, context)
        if len(self._open) > _OPEN_MAX:  # calls never closed (a response never released)
            del self._open[next(iter(self._open))]
        attach(set_value(_OPEN, opened, trace.set_span_in_context(span, context)))

    def _call_finished(self, event: _events.CallFinished) -> None:
        opened = self._open.pop(event.call, None) if event.call else None
        # The caller's context: the hop's span gets the timeout attributes and exemplars.
        context = get_current() if opened is None else opened.parent
        span = trace.get_current_span(context)
        if span is INVALID_SPAN:  # outside any trace: nothing to do now but hold
            recorded = traced = False
        else:
            recorded = self._holds and span.get_span_context().trace_flags.sampled
            traced = span.is_recording()
            if recorded:  # now: an exemplar keeps the time of its record
                plan = self._plans.get((event.dependency, event.outcome))
                self._record(plan or self._plan(event.dependency, event.outcome), event, context)
        held = self._held  # _hold(), inline: this runs on every call
        if event.error is None:
            held.append((event, context, recorded))
        else:  # hold no traceback, and the frames it keeps alive
            held.append((dataclasses.replace(event, error=None), context, recorded))
        if len(held) >= _BATCH or not self._holds:
            self._flush_held()
        if traced:
            self._call_trace(span, event, event.outcome, context, opened)
        elif opened is not None:  # the caller's span ended during the call
            self._end_call(opened, event, {"deadlines.outcome": event.outcome})

    def _plan(self, dependency: str, outcome: str) -> _Plan:
        dep = self._dependency(dependency)
        plan = _Plan(
            dep, outcome, self._a("dependency", dep, "outcome", outcome), self._a("dependency", dep)
        )
        if dep == dependency:  # folded names are not kept: they are unbounded
            self._plans[(dependency, outcome)] = plan
        return plan

    def _call_trace(
        self,
        span: Span,
        event: _events.CallFinished,
        outcome: str,
        context: Context,
        opened: _Open | None,
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
        if outcome in _FAILED:
            attrs["error.type"] = _error_type(event)
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
        if opened is not None:
            self._end_call(opened, event, attrs)
            return
        # A call that never started (fail-fast) or started before install: made now.
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

    def _end_call(self, opened: _Open, event: _events.CallFinished, attrs: _Attributes) -> None:
        child = opened.span
        child.set_attributes(attrs)
        if event.outcome in _FAILED:
            if event.error is not None:
                child.record_exception(event.error)
            child.set_status(Status(StatusCode.ERROR, str(event.error or event.outcome)))
        child.end()
        opened.close()

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
            record costs ~6 µs of SDK work per call (more in a sampled span), and every
            call span already carries the same figure as ``deadlines.remaining``.
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
