"""The overload events, counted by the Prometheus and OpenTelemetry exporters."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from deadlines import (
    AttemptRefused,
    HedgeSent,
    LimitChanged,
    RequestFinished,
    RequestRefused,
    RequestStarted,
    otel,
    prometheus,
)
from deadlines._events import emit


def _emit_overload_events() -> None:
    emit(AttemptRefused("pricing", "throttled"))
    emit(AttemptRefused("pricing", "throttled"))
    emit(AttemptRefused("pricing", "retry_budget"))
    emit(LimitChanged("pricing", 12))
    emit(LimitChanged("pricing", 9))
    emit(HedgeSent("pricing", 0.05))


def test_prometheus_counts_refusals_limits_and_hedges() -> None:
    """Refusals by reason, the limit's last value, hedges: one series each."""
    registry = CollectorRegistry()
    with prometheus.install(registry):
        _emit_overload_events()
        value = registry.get_sample_value
        refused = "deadlines_outbound_refused_total"
        assert value(refused, {"dependency": "pricing", "reason": "throttled"}) == 2
        assert value(refused, {"dependency": "pricing", "reason": "retry_budget"}) == 1
        assert value("deadlines_outbound_limit", {"dependency": "pricing"}) == 9
        assert value("deadlines_outbound_hedges_total", {"dependency": "pricing"}) == 1


def _points(reader: InMemoryMetricReader, name: str) -> dict[tuple[Any, ...], Any]:
    found: dict[tuple[Any, ...], Any] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        found[tuple(sorted(point.attributes.items()))] = point.value
    return found


def test_otel_counts_them_and_marks_the_span() -> None:
    """The same figures as metrics, and span events inside a recording span."""
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    spans = InMemorySpanExporter()
    tracers = TracerProvider()
    tracers.add_span_processor(SimpleSpanProcessor(spans))
    try:
        with otel.install(meters, tracers):
            with tracers.get_tracer("test").start_as_current_span("hop"):
                _emit_overload_events()
            refused = _points(reader, "deadlines.outbound.refused")
            assert refused[(("dependency", "pricing"), ("reason", "throttled"))] == 2
            assert refused[(("dependency", "pricing"), ("reason", "retry_budget"))] == 1
            assert _points(reader, "deadlines.outbound.limit") == {(("dependency", "pricing"),): 9}
            assert _points(reader, "deadlines.outbound.hedges") == {(("dependency", "pricing"),): 1}
        (hop,) = spans.get_finished_spans()
        names = [event.name for event in hop.events]
        assert names.count("deadlines.attempt_refused") == 3
        assert names.count("deadlines.hedge_sent") == 1
    finally:
        meters.shutdown()
        tracers.shutdown()


def _emit_gate_outcomes() -> None:
    for reason, outcome in (("codel", "shed"), ("admission", "shed"), ("late", "late")):
        emit(RequestStarted("/quote", 1.0))
        emit(RequestRefused("/quote", reason))  # type: ignore[arg-type]
        emit(RequestFinished("/quote", outcome, 0.001, 1.0))  # type: ignore[arg-type]
    emit(RequestStarted("/quote", 1.0))
    emit(RequestFinished("/quote", "ok", 0.001, 1.0))


def test_exporters_count_late_and_shed_requests() -> None:
    """A gate's refusals are inbound outcomes of their own, "late" (504) and "shed" (503),
    and are counted by reason."""
    registry = CollectorRegistry()
    with prometheus.install(registry):
        _emit_gate_outcomes()
        value = registry.get_sample_value
        name = "deadlines_inbound_requests_total"
        assert value(name, {"route": "/quote", "outcome": "shed"}) == 2
        assert value(name, {"route": "/quote", "outcome": "late"}) == 1
        assert value(name, {"route": "/quote", "outcome": "ok"}) == 1
        refused = "deadlines_inbound_refused_total"
        assert value(refused, {"route": "/quote", "reason": "codel"}) == 1
        assert value(refused, {"route": "/quote", "reason": "late"}) == 1
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    try:
        with otel.install(meters, TracerProvider()):
            _emit_gate_outcomes()
            requests = _points(reader, "deadlines.inbound.requests")
            assert requests[(("outcome", "shed"), ("route", "/quote"))] == 2
            assert requests[(("outcome", "late"), ("route", "/quote"))] == 1
            refused = _points(reader, "deadlines.inbound.refused")
            assert refused[(("reason", "admission"), ("route", "/quote"))] == 1
    finally:
        meters.shutdown()
