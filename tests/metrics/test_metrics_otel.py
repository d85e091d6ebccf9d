"""deadlines.otel: spans and metrics from real calls, read from the SDK's in-memory exporters."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from metrics_net import until
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode, Tracer

import deadlines
from deadlines import (
    BudgetExhausted,
    CallFinished,
    CallStarted,
    Dependency,
    HeadersTimeout,
    JobDropped,
    RequestFinished,
    RequestStarted,
    otel,
)
from deadlines._events import emit
from deadlines.httpx import AsyncClient
from deadlines.lab.servers import HealthyServer, SilentServer, SlowServer

pytestmark = pytest.mark.anyio


@dataclass
class OTel:
    """An SDK meter and tracer provider with in-memory exporters, deadlines installed."""

    reader: InMemoryMetricReader
    spans: InMemorySpanExporter
    tracer: Tracer
    telemetry: otel.Telemetry

    def points(self, name: str) -> dict[tuple[tuple[str, Any], ...], Any]:
        """The data points of metric `name`, keyed by sorted attributes."""
        found: dict[tuple[tuple[str, Any], ...], Any] = {}
        data = self.reader.get_metrics_data()
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for metric in sm.metrics:
                    if metric.name == name:
                        for point in metric.data.data_points:
                            found[tuple(sorted(point.attributes.items()))] = point
        return found

    def point(self, name: str, **attributes: str) -> Any:
        """One data point of `name` with exactly `attributes`, or None."""
        return self.points(name).get(tuple(sorted(attributes.items())))

    def finished(self, name: str) -> list[ReadableSpan]:
        """Finished spans called `name`."""
        return [s for s in self.spans.get_finished_spans() if s.name == name]


def _make(
    *, call_spans: bool = True, outbound_budget: bool = False, max_label_values: int = 100
) -> Iterator[OTel]:
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    exporter = InMemorySpanExporter()
    tracers = TracerProvider()
    tracers.add_span_processor(SimpleSpanProcessor(exporter))
    with otel.install(
        meters,
        tracers,
        call_spans=call_spans,
        outbound_budget=outbound_budget,
        max_label_values=max_label_values,
    ) as telemetry:
        yield OTel(reader, exporter, tracers.get_tracer("test"), telemetry)
    meters.shutdown()
    tracers.shutdown()


@pytest.fixture
def tel() -> Iterator[OTel]:
    """deadlines.otel installed on fresh SDK providers with in-memory exporters."""
    yield from _make()


@pytest.mark.realtime
async def test_hung_dependency_in_flight_timeouts_and_spans(tel: OTel) -> None:
    """Hung calls show in flight, then as headers timeouts, on metrics and on spans."""
    dep = Dependency("inventory", headers=0.6)
    with SilentServer() as server, tel.tracer.start_as_current_span("GET /checkout") as handler:
        async with AsyncClient(dep, base_url=server.url) as client:
            calls = [asyncio.create_task(client.get("/")) for _ in range(3)]
            await until(lambda: server.opened >= 3, "three connections")
            in_flight = tel.point("deadlines.outbound.in_flight", dependency="inventory").value
            results = await asyncio.gather(*calls, return_exceptions=True)
    assert in_flight == 3
    assert all(isinstance(r, HeadersTimeout) for r in results), results
    assert tel.point("deadlines.outbound.in_flight", dependency="inventory").value == 0
    timeouts = tel.point("deadlines.outbound.timeouts", dependency="inventory", phase="headers")
    assert timeouts.value == 3
    calls_point = tel.point("deadlines.outbound.calls", dependency="inventory", outcome="timeout")
    assert calls_point.value == 3
    (hop,) = tel.finished("GET /checkout")
    assert hop.attributes is not None
    assert hop.attributes["deadlines.timeout.phase"] == "headers"
    assert hop.attributes["deadlines.timeout.dependency"] == "inventory"
    assert hop.attributes["deadlines.timeout.request_sent"] is True
    children = tel.finished("deadlines.call inventory")
    assert len(children) == 3
    for child in children:
        assert child.parent is not None
        assert child.parent.span_id == handler.get_span_context().span_id
        assert child.status.status_code is StatusCode.ERROR
        assert child.attributes is not None
        assert child.attributes["deadlines.phase"] == "headers"
        assert child.attributes["deadlines.limit"] == pytest.approx(0.6)
        assert child.attributes["deadlines.outcome"] == "timeout"
        assert child.start_time is not None and child.end_time is not None
        assert 0.59 <= (child.end_time - child.start_time) / 1e9 <= 1.2
        assert any(e.name == "exception" for e in child.events)


@pytest.mark.realtime
async def test_full_pool_wait_on_histogram_and_call_span(tel: OTel) -> None:
    """The call that waited for the only connection says so, apart from server time."""
    dep = Dependency("pricing", pool_size=1, headers=5)
    with SlowServer(delay=0.4) as server, tel.tracer.start_as_current_span("GET /home"):
        async with AsyncClient(dep, base_url=server.url) as client:
            await asyncio.gather(client.get("/"), client.get("/"))
    hist = tel.point("deadlines.outbound.pool_wait", dependency="pricing")
    assert hist.count == 2
    assert 0.39 <= hist.sum <= 0.9
    bounds = list(hist.explicit_bounds)
    assert bounds == list(otel.DEFAULT_BUCKETS)
    assert sum(hist.bucket_counts[: bounds.index(0.1) + 1]) == 1  # the first: no wait
    waits = sorted(
        s.attributes["deadlines.pool_wait"]
        for s in tel.finished("deadlines.call pricing")
        if s.attributes is not None
    )
    assert waits[0] < 0.1 <= 0.39 <= waits[1]
    duration = tel.point("deadlines.outbound.duration", dependency="pricing", outcome="ok")
    assert 0.78 <= duration.sum - hist.sum <= 1.6  # two calls' worth of server time


async def test_remaining_budget_and_fail_fast_on_call_spans(tel: OTel) -> None:
    """Each call span carries the budget left at its start; a fail-fast is an error span."""
    dep = Dependency("recs", min_useful=0.5)
    with (
        HealthyServer() as server,
        SilentServer() as hung_server,
        tel.tracer.start_as_current_span("GET /home"),
    ):
        async with (
            AsyncClient(dep, base_url=server.url) as client,
            AsyncClient(dep, base_url=hung_server.url) as hung_client,
        ):
            async with deadlines.scope(2.0):
                await client.get("/")
            hung = asyncio.create_task(hung_client.get("/"))
            await until(lambda: hung_server.opened >= 1, "the hung connection")
            with deadlines.scope(0.1), pytest.raises(BudgetExhausted):
                await client.get("/")
            in_flight = tel.point("deadlines.outbound.in_flight", dependency="recs")
            hung.cancel()
            await asyncio.gather(hung, return_exceptions=True)
    by_outcome = {
        s.attributes["deadlines.outcome"]: s
        for s in tel.finished("deadlines.call recs")
        if s.attributes is not None
    }
    ok, refused = by_outcome["ok"], by_outcome["budget_exhausted"]
    assert ok.attributes is not None and refused.attributes is not None
    assert ok.attributes["deadlines.outcome"] == "ok"
    assert 1.5 < ok.attributes["deadlines.remaining"] <= 2.0
    assert ok.status.status_code is StatusCode.UNSET
    assert refused.attributes["deadlines.outcome"] == "budget_exhausted"
    assert refused.attributes["deadlines.request_sent"] is False
    assert refused.status.status_code is StatusCode.ERROR
    assert tel.point("deadlines.outbound.fail_fast", dependency="recs").value == 1
    assert in_flight.value == 1  # the hung call only, not the refused one
    assert tel.point("deadlines.outbound.in_flight", dependency="recs").value == 0
    assert set(by_outcome) == {"ok", "budget_exhausted", "cancelled"}
    # The budget histogram is opt-in (``outbound_budget=True``): the spans carry it.
    assert tel.point("deadlines.outbound.budget", dependency="recs") is None


async def test_outbound_budget_histogram_when_asked_for() -> None:
    """``outbound_budget=True`` records the budget left at each call under a deadline."""
    dep = Dependency("recs")
    for tel in _make(outbound_budget=True):
        with HealthyServer() as server:
            async with AsyncClient(dep, base_url=server.url) as client:
                async with deadlines.scope(2.0):
                    await client.get("/")
                    await client.get("/")
                await client.get("/")  # no deadline: no budget to record
        budget = tel.point("deadlines.outbound.budget", dependency="recs")
        assert budget.count == 2
        assert 3.0 < budget.sum <= 4.0


def test_inbound_request_attributes_and_metrics(tel: OTel) -> None:
    """An inbound request's budget and outcome go on its span and into the metrics."""
    with tel.tracer.start_as_current_span("GET /orders/{id}"):
        emit(RequestStarted("/orders/{id}", 1.45))
        in_flight = tel.point("deadlines.inbound.in_flight", route="/orders/{id}").value
        emit(RequestFinished("/orders/{id}", "caller_left", 0.3, 1.45))
        emit(JobDropped("emails", 2.0))
    (span,) = tel.finished("GET /orders/{id}")
    assert span.attributes is not None
    assert span.attributes["deadlines.request.budget"] == 1.45
    assert span.attributes["deadlines.request.outcome"] == "caller_left"
    assert [e.name for e in span.events] == ["deadlines.job_dropped"]
    assert in_flight == 1
    assert tel.point("deadlines.inbound.in_flight", route="/orders/{id}").value == 0
    left = tel.point("deadlines.inbound.requests", route="/orders/{id}", outcome="caller_left")
    assert left.value == 1
    assert tel.point("deadlines.inbound.caller_left", route="/orders/{id}").value == 1
    assert tel.point("deadlines.inbound.budget", route="/orders/{id}").sum == 1.45
    assert tel.point("deadlines.jobs.expired", queue="emails").value == 1


def test_without_a_recording_span_no_spans_only_metrics(tel: OTel) -> None:
    """Outside any trace nothing is traced (no orphan roots) but metrics still count."""
    emit(CallFinished("pricing", "timeout", 0.2, 1.0, phase="connect", request_sent=False))
    assert tel.spans.get_finished_spans() == ()
    assert (
        tel.point("deadlines.outbound.timeouts", dependency="pricing", phase="connect").value == 1
    )


def test_call_events_instead_of_spans() -> None:
    """With call_spans=False each call is an event on the current span."""
    for tel in _make(call_spans=False):
        with tel.tracer.start_as_current_span("hop"):
            emit(CallFinished("pricing", "ok", 0.01, 2.0, pool_wait=0.001))
        (span,) = tel.spans.get_finished_spans()
        (event,) = span.events
        assert event.name == "deadlines.call"
        assert event.attributes is not None
        assert event.attributes["deadlines.dependency"] == "pricing"
        assert event.attributes["deadlines.remaining"] == 2.0


def test_dependency_names_past_the_limit_fold_into_other_on_every_call() -> None:
    """Past `max_label_values`, names fold into "other" call after call; in flight stays >= 0."""
    for tel in _make(max_label_values=2):
        emit(CallFinished("early", "ok", 0.1, 1.0))  # begun before install: no CallStarted
        for name in ["early", "u0", "u1", "u2", "u1"]:  # u1 and u2 are past the limit
            emit(CallStarted(name, 1.0))
            emit(CallFinished(name, "ok", 0.1, 1.0, pool_wait=0.01))
        emit(CallFinished("u2", "timeout", 0.2, 1.0, phase="headers"))
        emit(CallStarted("early", 1.0))
        deps = {dict(k)["dependency"] for k in tel.points("deadlines.outbound.calls")}
        assert deps == {"early", "u0", "other"}
        assert tel.point("deadlines.outbound.calls", dependency="other", outcome="ok").value == 3
        assert tel.point("deadlines.outbound.duration", dependency="other", outcome="ok").count == 3
        assert tel.point("deadlines.outbound.pool_wait", dependency="other").count == 3
        timeouts = tel.point("deadlines.outbound.timeouts", dependency="other", phase="headers")
        assert timeouts.value == 1
        assert tel.point("deadlines.outbound.in_flight", dependency="other").value == 0
        assert tel.point("deadlines.outbound.in_flight", dependency="early").value == 1


def test_one_installation_per_meter_provider() -> None:
    """One active install per meter provider; installing again continues its counters."""
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])

    def value(name: str, **attributes: str) -> Any:
        data = reader.get_metrics_data()
        assert data is not None
        for rm in data.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    for p in m.data.data_points if m.name == name else ():
                        if dict(p.attributes) == attributes:
                            return p.value
        return None

    first = otel.install(meters)
    emit(JobDropped("q", 1.0))
    with pytest.raises(ValueError, match="already installed"):
        otel.install(meters)
    emit(CallStarted("db", 1.0))
    first.uninstall()
    emit(JobDropped("q", 1.0))  # nobody installed: not counted
    with pytest.raises(ValueError, match="already use buckets"):
        otel.install(meters, buckets=[1.0, 2.0])
    with otel.install(meters):
        emit(JobDropped("q", 1.0))
        emit(CallStarted("api", 1.0))
        assert value("deadlines.outbound.in_flight", dependency="api") == 1
        assert value("deadlines.outbound.in_flight", dependency="db") is None  # forgotten
    emit(JobDropped("q", 1.0))
    assert value("deadlines.jobs.expired", queue="q") == 2
    meters.shutdown()
    with pytest.raises(ValueError, match="strictly increasing"):
        otel.install(MeterProvider(), buckets=[2, 1])
