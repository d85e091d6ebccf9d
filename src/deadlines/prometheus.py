"""Prometheus metrics for deadlines: timeouts per dependency and phase, pool wait, in-flight.

    from deadlines import prometheus

    metrics = prometheus.install()          # the default registry; once per process
    ...
    metrics.uninstall()                     # or: with prometheus.install(registry): ...

`install` subscribes to the event stream that `CallBudget` and the integrations report
to and keeps these series (all names are stable; see docs/metrics.md):

| name | type | labels |
|---|---|---|
| `deadlines_outbound_calls_total` | counter | dependency, outcome |
| `deadlines_outbound_timeouts_total` | counter | dependency, phase |
| `deadlines_outbound_fail_fast_total` | counter | dependency |
| `deadlines_outbound_duration_seconds` | histogram | dependency, outcome |
| `deadlines_outbound_pool_wait_seconds` | histogram | dependency |
| `deadlines_outbound_budget_seconds` | histogram | dependency |
| `deadlines_outbound_in_flight` | gauge | dependency |
| `deadlines_inbound_requests_total` | counter | route, outcome |
| `deadlines_inbound_caller_left_total` | counter | route |
| `deadlines_inbound_budget_seconds` | histogram | route |
| `deadlines_inbound_in_flight` | gauge | route |
| `deadlines_inbound_refused_total` | counter | route, reason |
| `deadlines_jobs_expired_total` | counter | queue |
| `deadlines_outbound_refused_total` | counter | dependency, reason |
| `deadlines_outbound_limit` | gauge | dependency |
| `deadlines_outbound_hedges_total` | counter | dependency |

Labels stay low-cardinality: `outcome` and `phase` come from fixed sets; `dependency`
is `Dependency.name`, `route` the integration's route template, `queue` the queue name.
As a guard, each of those three keeps at most `max_label_values` distinct values and
folds any further ones into ``"other"`` (with one warning on the "deadlines" logger).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable, Sequence
from datetime import timedelta
from types import TracebackType
from typing import Any

from ._extras import missing

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client.metrics import MetricWrapperBase
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise missing("deadlines.prometheus", "prometheus_client", "prometheus") from exc

from . import _events
from ._export import (
    DEFAULT_BUCKETS,
    OVERFLOW_LABEL,
    PHASES,
    REQUEST_OUTCOMES,
    LabelGuard,
    bucket_bounds,
)

__all__ = ["DEFAULT_BUCKETS", "OVERFLOW_LABEL", "Metrics", "install"]


class _Group(Collector):
    """All the metrics as one collector, so registering is all-or-nothing."""

    def __init__(self, metrics: Sequence[MetricWrapperBase]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Any]:
        for metric in self._metrics:
            yield from metric.collect()

    def describe(self) -> Iterable[Any]:
        for metric in self._metrics:
            yield from metric.describe()


class Metrics:
    """The deadlines metrics in one registry, fed by the event stream until `uninstall`.

    Made by `install`. The metric objects are attributes (`outbound_calls`,
    `outbound_timeouts`, ...) for reading in tests; the library updates them.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        buckets: Sequence[float],
        max_label_values: int,
    ) -> None:
        self.registry = registry
        s = "seconds"
        self.outbound_calls = Counter(
            "deadlines_outbound_calls",
            "Outbound calls that ended, by dependency and outcome"
            " (ok, timeout, deadline, budget_exhausted, cancelled, error).",
            ["dependency", "outcome"],
            registry=None,
        )
        self.outbound_timeouts = Counter(
            "deadlines_outbound_timeouts",
            "Outbound calls that timed out (own cap or request deadline), by phase"
            " (pool, connect, headers, body).",
            ["dependency", "phase"],
            registry=None,
        )
        self.outbound_fail_fast = Counter(
            "deadlines_outbound_fail_fast",
            "Outbound calls not made: less budget left than the dependency's min_useful.",
            ["dependency"],
            registry=None,
        )
        self.outbound_duration = Histogram(
            "deadlines_outbound_duration",
            "Whole outbound call as the caller saw it, pool wait included.",
            ["dependency", "outcome"],
            unit=s,
            buckets=buckets,
            registry=None,
        )
        self.outbound_pool_wait = Histogram(
            "deadlines_outbound_pool_wait",
            "Time waiting for a free pooled connection, apart from server time.",
            ["dependency"],
            unit=s,
            buckets=buckets,
            registry=None,
        )
        self.outbound_budget = Histogram(
            "deadlines_outbound_budget",
            "Request budget left when an outbound call started (calls with a deadline).",
            ["dependency"],
            unit=s,
            buckets=buckets,
            registry=None,
        )
        self.outbound_in_flight = Gauge(
            "deadlines_outbound_in_flight",
            "Outbound calls in progress. Rises before anything else does.",
            ["dependency"],
            registry=None,
            multiprocess_mode="livesum",
        )
        self.inbound_requests = Counter(
            "deadlines_inbound_requests",
            "Inbound requests that ended, by route template and outcome"
            " (ok, deadline, caller_left, budget_exhausted, error, late, shed).",
            ["route", "outcome"],
            registry=None,
        )
        self.inbound_caller_left = Counter(
            "deadlines_inbound_caller_left",
            "Inbound requests whose caller disconnected; the work under them was stopped.",
            ["route"],
            registry=None,
        )
        self.inbound_budget = Histogram(
            "deadlines_inbound_budget",
            "Budget an inbound request arrived with (header, capped, minus reserve).",
            ["route"],
            unit=s,
            buckets=buckets,
            registry=None,
        )
        self.inbound_in_flight = Gauge(
            "deadlines_inbound_in_flight",
            "Inbound requests in progress, by route template.",
            ["route"],
            registry=None,
            multiprocess_mode="livesum",
        )
        self.inbound_refused = Counter(
            "deadlines_inbound_refused",
            "Inbound requests a gate refused without running them, by route template and"
            " reason (late, admission, codel, queue).",
            ["route", "reason"],
            registry=None,
        )
        self.jobs_expired = Counter(
            "deadlines_jobs_expired",
            "Queued jobs dropped unrun because their deadline had passed.",
            ["queue"],
            registry=None,
        )
        self.outbound_refused = Counter(
            "deadlines_outbound_refused",
            "Attempts the client did not make, to protect an overloaded dependency, by"
            " reason (throttled, limit, retry_budget).",
            ["dependency", "reason"],
            registry=None,
        )
        self.outbound_limit = Gauge(
            "deadlines_outbound_limit",
            "The adaptive concurrency limit of a dependency (calls in flight allowed).",
            ["dependency"],
            registry=None,
            multiprocess_mode="livesum",
        )
        self.outbound_hedges = Counter(
            "deadlines_outbound_hedges",
            "Backups sent for slow idempotent calls (hedged requests).",
            ["dependency"],
            registry=None,
        )
        self._group = _Group(
            [
                self.outbound_calls,
                self.outbound_timeouts,
                self.outbound_fail_fast,
                self.outbound_duration,
                self.outbound_pool_wait,
                self.outbound_budget,
                self.outbound_in_flight,
                self.inbound_requests,
                self.inbound_caller_left,
                self.inbound_budget,
                self.inbound_in_flight,
                self.inbound_refused,
                self.jobs_expired,
                self.outbound_refused,
                self.outbound_limit,
                self.outbound_hedges,
            ]
        )
        self._dependency = LabelGuard("dependency", max_label_values)
        self._route = LabelGuard("route", max_label_values)
        self._queue = LabelGuard("queue", max_label_values)
        self._lock = threading.Lock()
        # Labelled children per dependency and route, so an event costs one dict lookup.
        self._outbound: dict[str, _Outbound] = {}
        self._inbound: dict[str, _Inbound] = {}
        self._unsubscribe: Callable[[], None] | None = None

    def _start(self) -> None:
        try:
            self.registry.register(self._group)
        except ValueError as exc:
            raise ValueError(
                "deadlines metrics are already registered in this registry; uninstall()"
                " the first installation or pass another registry"
            ) from exc
        self._unsubscribe = _events.observe(self._observe)

    def uninstall(self) -> None:
        """Stop recording and remove the metrics from the registry (idempotent)."""
        if self._unsubscribe is None:
            return
        self._unsubscribe()
        self._unsubscribe = None
        self.registry.unregister(self._group)

    def __enter__(self) -> Metrics:
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
            self._dependency_children(event.dependency).move(1)
        elif isinstance(event, _events.CallFinished):
            self._call_finished(event)
        elif isinstance(event, _events.RequestStarted):
            route = self._route_children(event.route)
            route.move(1)
            if math.isfinite(event.budget):
                route.budget.observe(event.budget)
        elif isinstance(event, _events.RequestFinished):
            route = self._route_children(event.route)
            route.move(-1)
            outcome = event.outcome if event.outcome in REQUEST_OUTCOMES else "error"
            route.requests(outcome).inc()
            if outcome == "caller_left":
                route.caller_left.inc()
        elif isinstance(event, _events.RequestRefused):
            self.inbound_refused.labels(self._route(event.route), event.reason).inc()
        elif isinstance(event, _events.JobDropped):
            self.jobs_expired.labels(self._queue(event.queue)).inc()
        elif isinstance(event, _events.AttemptRefused):
            self.outbound_refused.labels(self._dependency(event.dependency), event.reason).inc()
        elif isinstance(event, _events.LimitChanged):
            self.outbound_limit.labels(self._dependency(event.dependency)).set(event.limit)
        elif isinstance(event, _events.HedgeSent):
            self.outbound_hedges.labels(self._dependency(event.dependency)).inc()

    def _call_finished(self, event: _events.CallFinished) -> None:
        dep = self._dependency_children(event.dependency)
        outcome = event.outcome
        if event.started:
            dep.move(-1)
        calls, duration = dep.by_outcome(outcome)
        calls.inc()
        duration.observe(event.duration)
        if event.pool_wait is not None:
            dep.pool_wait.observe(event.pool_wait)
        if math.isfinite(event.budget):
            dep.budget.observe(event.budget)
        if outcome in ("timeout", "deadline"):
            dep.timeouts(event.phase if event.phase in PHASES else "unknown").inc()
        elif outcome == "budget_exhausted":
            dep.fail_fast.inc()

    def _dependency_children(self, raw: str) -> _Outbound:
        found = self._outbound.get(raw)
        if found is None:
            label = self._dependency(raw)  # only admitted values and "other" are cached
            found = self._outbound.get(label)
            if found is None:
                found = self._outbound[label] = _Outbound(self, label)
        return found

    def _route_children(self, raw: str) -> _Inbound:
        found = self._inbound.get(raw)
        if found is None:
            label = self._route(raw)
            found = self._inbound.get(label)
            if found is None:
                found = self._inbound[label] = _Inbound(self, label)
        return found


class _Outbound:
    """One dependency's labelled children and in-flight count."""

    def __init__(self, metrics: Metrics, label: str) -> None:
        self._metrics = metrics
        self._label = label
        self._lock = metrics._lock
        self._in_flight = 0
        self._gauge = metrics.outbound_in_flight.labels(label)
        self.pool_wait = metrics.outbound_pool_wait.labels(label)
        self.budget = metrics.outbound_budget.labels(label)
        self.fail_fast = metrics.outbound_fail_fast.labels(label)
        self._by_outcome: dict[str, tuple[Any, Any]] = {}
        self._timeouts: dict[str, Any] = {}

    def move(self, step: int) -> None:
        """Count a call in or out, never below zero (calls that began before install)."""
        with self._lock:
            self._in_flight = max(0, self._in_flight + step)
            self._gauge.set(self._in_flight)

    def by_outcome(self, outcome: str) -> tuple[Any, Any]:
        """The calls counter and duration histogram children for `outcome`."""
        found = self._by_outcome.get(outcome)
        if found is None:
            m = self._metrics
            found = (
                m.outbound_calls.labels(self._label, outcome),
                m.outbound_duration.labels(self._label, outcome),
            )
            self._by_outcome[outcome] = found
        return found

    def timeouts(self, phase: str) -> Any:
        """The timeouts counter child for `phase`."""
        found = self._timeouts.get(phase)
        if found is None:
            found = self._timeouts[phase] = self._metrics.outbound_timeouts.labels(
                self._label, phase
            )
        return found


class _Inbound:
    """One route's labelled children and in-flight count."""

    def __init__(self, metrics: Metrics, label: str) -> None:
        self._metrics = metrics
        self._label = label
        self._lock = metrics._lock
        self._in_flight = 0
        self._gauge = metrics.inbound_in_flight.labels(label)
        self.budget = metrics.inbound_budget.labels(label)
        self.caller_left = metrics.inbound_caller_left.labels(label)
        self._requests: dict[str, Any] = {}

    def move(self, step: int) -> None:
        """Count a request in or out, never below zero."""
        with self._lock:
            self._in_flight = max(0, self._in_flight + step)
            self._gauge.set(self._in_flight)

    def requests(self, outcome: str) -> Any:
        """The requests counter child for `outcome`."""
        found = self._requests.get(outcome)
        if found is None:
            found = self._requests[outcome] = self._metrics.inbound_requests.labels(
                self._label, outcome
            )
        return found


def install(
    registry: CollectorRegistry | None = None,
    *,
    buckets: Sequence[float | timedelta] = DEFAULT_BUCKETS,
    max_label_values: int = 100,
) -> Metrics:
    """Register the deadlines metrics in `registry` and start recording them.

    Args:
        registry: Where to register; `prometheus_client.REGISTRY` by default.
        buckets: Upper bounds in seconds for every ``_seconds`` histogram, increasing.
        max_label_values: Distinct dependency, route and queue values kept per label;
            further values are counted under ``"other"``.

    Returns the `Metrics` handle; call `uninstall()` (or use it in a ``with``) to stop.
    Raises `ValueError` if the metrics are already registered in `registry`.
    """
    if isinstance(max_label_values, bool) or not isinstance(max_label_values, int):
        raise TypeError(f"max_label_values must be an int, not {max_label_values!r}")
    if max_label_values < 1:
        raise ValueError(f"max_label_values must be >= 1, got {max_label_values}")
    metrics = Metrics(
        REGISTRY if registry is None else registry,
        buckets=bucket_bounds(buckets),
        max_label_values=max_label_values,
    )
    metrics._start()
    return metrics
