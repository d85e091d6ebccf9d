"""deadlines.otel: spans and metrics from real calls, read from the SDK's in-memory exporters."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from metrics_net import until
from opentelemetry.sdk.metrics import AlwaysOnExemplarFilter, MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.metrics.view import DropAggregation, View
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
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
from deadlines.httpx import AsyncClient, Client
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


# Histogram records made outside a sampled span are held back and handed to the SDK in
# bulk (see _Recorder): these tests check that no collection ever misses one.


def _histogram(reader: InMemoryMetricReader, name: str, **attributes: str) -> Any:
    """The point of histogram `name` with `attributes` in one fresh collection, or None."""
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                for point in metric.data.data_points if metric.name == name else ():
                    if dict(point.attributes) == attributes:
                        return point
    return None


def test_held_records_are_in_every_collection_of_every_reader() -> None:
    """Each collection, by either of two readers, holds every call that ended before it."""
    first, second = InMemoryMetricReader(), InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[first, second])
    with otel.install(meters, outbound_budget=True) as telemetry:
        ended = 0
        for batch in [1, 5, otel._BATCH + 3, 2 * otel._BATCH, 1]:
            for _ in range(batch):
                emit(CallFinished("db", "ok", 0.01, 2.0, pool_wait=0.001))
            ended += batch
            assert telemetry._recorder._held or batch > otel._BATCH  # the path under test
            for reader in (first, second, first):
                duration = _histogram(
                    reader, "deadlines.outbound.duration", dependency="db", outcome="ok"
                )
                assert duration.count == ended
                assert duration.sum == pytest.approx(0.01 * ended)
                assert (
                    _histogram(reader, "deadlines.outbound.pool_wait", dependency="db").count
                    == ended
                )
                assert (
                    _histogram(reader, "deadlines.outbound.budget", dependency="db").count == ended
                )
        emit(RequestStarted("/a", 1.5))  # the inbound budget is held back the same way
        emit(CallFinished("db", "timeout", 0.3, 2.0, phase="headers", error=TimeoutError()))
        held = telemetry._recorder._held[-1]  # without the exception and its traceback
        assert isinstance(held, tuple) and held[0].error is None
        assert _histogram(first, "deadlines.inbound.budget", route="/a").sum == 1.5
        timeouts = _histogram(
            first, "deadlines.outbound.timeouts", dependency="db", phase="headers"
        )
        assert timeouts.value == 1
    meters.shutdown()


def test_held_records_are_collected_when_the_counters_are_dropped_by_a_view() -> None:
    """The flush rides on an observable counter's callback, which runs even if dropped."""
    reader = InMemoryMetricReader()
    drop = View(instrument_name="deadlines.outbound.calls", aggregation=DropAggregation())
    meters = MeterProvider(metric_readers=[reader], views=[drop])
    with otel.install(meters):
        emit(CallFinished("db", "ok", 0.01, 2.0))
        point = _histogram(reader, "deadlines.outbound.duration", dependency="db", outcome="ok")
        assert point.count == 1
        assert _histogram(reader, "deadlines.outbound.calls", dependency="db", outcome="ok") is None
    meters.shutdown()


def test_held_back_list_stays_bounded() -> None:
    """Without any collection, the held-back records never pile up past one batch."""
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    with otel.install(meters) as telemetry:
        most = 0
        for _ in range(10 * otel._BATCH):
            emit(CallFinished("db", "ok", 0.01, 2.0, pool_wait=0.001))
            most = max(most, len(telemetry._recorder._held))
        assert 0 < most < otel._BATCH
        total = _histogram(reader, "deadlines.outbound.duration", dependency="db", outcome="ok")
        assert total.count == 10 * otel._BATCH
    meters.shutdown()


def test_held_records_keep_their_context_for_exemplars() -> None:
    """A held record's exemplar links to the span current when the call ended."""
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader], exemplar_filter=AlwaysOnExemplarFilter())
    tracer = TracerProvider(sampler=ALWAYS_OFF).get_tracer("test")  # valid, not sampled
    with otel.install(meters) as telemetry:
        with tracer.start_as_current_span("unsampled") as span:
            emit(CallFinished("db", "ok", 0.01, 2.0))
        assert telemetry._recorder._held  # held: the span is not sampled
        (exemplar,) = _histogram(
            reader, "deadlines.outbound.duration", dependency="db", outcome="ok"
        ).exemplars
        assert exemplar.span_id == span.get_span_context().span_id
        assert exemplar.trace_id == span.get_span_context().trace_id
    meters.shutdown()


def test_records_in_a_sampled_span_go_to_the_sdk_at_once(tel: OTel) -> None:
    """In a sampled span the histograms are recorded inline: exemplars have the call's time."""
    with tel.tracer.start_as_current_span("hop") as span:
        emit(CallFinished("db", "ok", 0.01, 2.0, pool_wait=0.001))
        emit(RequestStarted("/a", 1.5))
        ended = time.time_ns()
    data = tel.reader.get_metrics_data()  # one collection: each resets the exemplars
    assert data is not None
    exemplars = {
        metric.name: point.exemplars
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for metric in sm.metrics
        for point in metric.data.data_points
    }
    for name in ["outbound.duration", "outbound.pool_wait", "inbound.budget"]:
        (exemplar,) = exemplars[f"deadlines.{name}"]
        assert exemplar.span_id == span.get_span_context().span_id
        assert exemplar.time_unix_nano <= ended  # not the time of the collection's flush


def test_calls_ending_on_many_threads_are_in_every_collection() -> None:
    """Real sync GETs from a thread pool while another thread collects: none is missed."""
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    threads, per_thread = 8, 60
    ended = [0] * threads  # calls each worker has seen return
    done = threading.Event()
    seen: list[tuple[int, int]] = []  # (ended before a collection, its histogram count)

    def collect() -> None:
        while not done.is_set():
            before = sum(ended)
            point = _histogram(
                reader, "deadlines.outbound.duration", dependency="api", outcome="ok"
            )
            seen.append((before, 0 if point is None else point.count))

    with otel.install(meters), HealthyServer() as server:
        with Client(Dependency("api"), base_url=server.url) as client:

            def work(i: int) -> None:
                for _ in range(per_thread):
                    client.get("/").raise_for_status()
                    ended[i] += 1

            _race(work, threads, collect, done)
        total = threads * per_thread
        assert (
            _histogram(reader, "deadlines.outbound.duration", dependency="api", outcome="ok").count
            == total
        )
        assert _histogram(reader, "deadlines.outbound.pool_wait", dependency="api").count == total
    meters.shutdown()
    assert len(seen) >= 3, "the collector must have run during the calls"
    for before, count in seen:
        assert count >= before
    counts = [count for _, count in seen]
    assert counts == sorted(counts)  # cumulative: never a record taken back


def test_calls_ending_on_many_threads_at_full_speed_are_never_missed() -> None:
    """Events from 8 threads, hundreds of bulk flushes, a collector racing them."""
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    threads, per_thread = 8, 40 * otel._BATCH
    ended = [0] * threads
    start = threading.Barrier(threads + 1)
    done = threading.Event()
    missed: list[tuple[int, int]] = []
    in_flight: set[int] = set()
    longest = [0]  # the longest the held-back queue was seen

    def collect() -> None:
        start.wait()
        while not done.is_set():
            longest[0] = max(longest[0], len(telemetry._recorder._held))
            before = sum(ended)
            data = reader.get_metrics_data()
            assert data is not None
            for metric in data.resource_metrics[0].scope_metrics[0].metrics:
                (point,) = metric.data.data_points
                if metric.name == "deadlines.outbound.pool_wait" and point.count < before:
                    missed.append((before, point.count))
                elif metric.name == "deadlines.outbound.in_flight":
                    in_flight.add(point.value)

    def work(i: int) -> None:
        start.wait()
        for _ in range(per_thread):
            emit(CallStarted("db", 2.0))
            emit(CallFinished("db", "ok", 0.01, 2.0, pool_wait=0.001))
            ended[i] += 1

    with otel.install(meters) as telemetry:
        _race(work, threads, collect, done)
        point = _histogram(reader, "deadlines.outbound.pool_wait", dependency="db")
        after = _histogram(reader, "deadlines.outbound.in_flight", dependency="db").value
    meters.shutdown()
    assert missed == []
    assert in_flight <= set(range(threads + 1))  # never one end counted before its start
    assert after == 0
    assert longest[0] <= otel._HELD_MAX + 2 * threads
    assert point.count == threads * per_thread
    assert point.sum == pytest.approx(0.001 * threads * per_thread)


def _race(
    work: Callable[[int], None], threads: int, collect: Callable[[], None], done: threading.Event
) -> None:
    """`work(0..threads-1)` on a pool while `collect` runs on a thread of its own until done."""
    collector = threading.Thread(target=collect)
    collector.start()
    try:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(work, range(threads)))
    finally:
        done.set()
        collector.join(timeout=30)
