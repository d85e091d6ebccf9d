"""deadlines.otel's call spans among the real OpenTelemetry client instrumentations.

The ``deadlines.call`` span starts with the call and is current until it ends: aiohttp's
instrumentation opens its CLIENT span inside the call, so the CLIENT span is the call
span's child; httpx's wraps the transport from outside, so its CLIENT span holds one
call span per attempt. Also: the semantic-convention ``error.type``, the caller's span
current again after calls that close out of order, and the SDK behaviour that the held
metric records rely on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import deadlines
import deadlines.aiohttp
from deadlines import Dependency, HeadersTimeout, otel
from deadlines.httpx import AsyncClient
from deadlines.lab.servers import HealthyServer, SilentServer

pytestmark = pytest.mark.anyio


@dataclass
class Traces:
    """A tracer provider with an in-memory exporter, deadlines.otel installed on it."""

    provider: TracerProvider
    exporter: InMemorySpanExporter

    def spans(self) -> list[ReadableSpan]:
        """Every finished span."""
        return list(self.exporter.get_finished_spans())

    def named(self, name: str) -> list[ReadableSpan]:
        """The finished spans called `name`."""
        return [s for s in self.spans() if s.name == name]


@pytest.fixture
def traces() -> Iterator[Traces]:
    """deadlines.otel on fresh SDK providers."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    meters = MeterProvider(metric_readers=[InMemoryMetricReader()])
    with otel.install(meters, provider):
        yield Traces(provider, exporter)
    meters.shutdown()
    provider.shutdown()


def parent_of(span: ReadableSpan) -> int | None:
    """The span id of `span`'s parent."""
    return None if span.parent is None else span.parent.span_id


def span_id(span: ReadableSpan) -> int:
    """The span id of a finished span."""
    context = span.context
    assert context is not None
    return context.span_id


@pytest.fixture
def aiohttp_instrumented(traces: Traces) -> Iterator[None]:
    """opentelemetry-instrumentation-aiohttp-client, on every aiohttp session."""
    instrumentor = AioHttpClientInstrumentor()
    instrumentor.instrument(tracer_provider=traces.provider)
    yield
    instrumentor.uninstrument()


@pytest.mark.usefixtures("aiohttp_instrumented")
async def test_aiohttp_client_span_holds_the_call_span(traces: Traces) -> None:
    """aiohttp's CLIENT span (its trace hooks) holds `deadlines.call` (its middleware)."""
    tracer = traces.provider.get_tracer("test")
    dep = Dependency("pricing", headers=0.3)
    with HealthyServer(body=b"42") as healthy, SilentServer() as silent:
        async with deadlines.aiohttp.session(dep) as http:
            with tracer.start_as_current_span("GET /checkout") as handler:
                async with http.get(healthy.url + "/prices") as response:
                    assert await response.read() == b"42"
                assert trace.get_current_span() is handler  # the caller's span again
                with pytest.raises(HeadersTimeout):
                    async with http.get(silent.url):
                        pass
                assert trace.get_current_span() is handler
    calls = traces.named("deadlines.call pricing")
    clients = [s for s in traces.spans() if s.kind is SpanKind.CLIENT]
    assert len(calls) == 2 and len(clients) == 2
    (hop,) = traces.named("GET /checkout")
    assert {parent_of(c) for c in clients} == {span_id(hop)}
    assert {parent_of(c) for c in calls} == {span_id(c) for c in clients}
    ok, failed = sorted(calls, key=lambda s: s.status.status_code is StatusCode.ERROR)
    assert ok.attributes is not None and failed.attributes is not None
    assert "error.type" not in ok.attributes
    assert failed.attributes["error.type"] == "deadlines.HeadersTimeout"
    assert failed.attributes["deadlines.phase"] == "headers"
    for call in calls:  # the CLIENT span lasts from before its call's span to the head
        (client,) = [c for c in clients if parent_of(call) == span_id(c)]
        assert call.start_time is not None and client.start_time is not None
        assert client.start_time <= call.start_time


async def test_httpx_client_span_holds_one_call_span_per_attempt(traces: Traces) -> None:
    """httpx's instrumentation wraps the transport: its CLIENT span is the calls' parent."""
    tracer = traces.provider.get_tracer("test")
    dep = Dependency("search", headers=0.2, retry=deadlines.Retry(attempts=2, backoff=0.01))
    with SilentServer() as silent, tracer.start_as_current_span("GET /search") as handler:
        async with AsyncClient(dep) as client:
            HTTPXClientInstrumentor.instrument_client(client, tracer_provider=traces.provider)
            with pytest.raises(HeadersTimeout):
                await client.get(silent.url)
        assert trace.get_current_span() is handler
    (client_span,) = [s for s in traces.spans() if s.kind is SpanKind.CLIENT]
    attempts = traces.named("deadlines.call search")
    assert len(attempts) == 2
    assert {parent_of(a) for a in attempts} == {span_id(client_span)}
    assert parent_of(client_span) == span_id(traces.named("GET /search")[0])
    assert {a.attributes["error.type"] for a in attempts if a.attributes} == {
        "deadlines.HeadersTimeout"
    }


async def test_error_type_names_a_foreign_error_as_it_is_imported(traces: Traces) -> None:
    """A refused connection's `error.type` is httpx's class by its public name."""
    tracer = traces.provider.get_tracer("test")
    with HealthyServer() as server:
        url = server.url  # closed below: the port refuses connections
    with tracer.start_as_current_span("GET /"):
        async with AsyncClient(Dependency("gone")) as client:
            with pytest.raises(httpx.ConnectError):
                await client.get(url)
    (call,) = traces.named("deadlines.call gone")
    assert call.attributes is not None
    assert call.attributes["error.type"] == "httpx.ConnectError"
    assert call.attributes["deadlines.outcome"] == "error"


async def test_streams_closed_out_of_order_leave_the_callers_span_current(
    traces: Traces,
) -> None:
    """Two streamed responses closed first-opened-first: the caller's span is current after."""
    tracer = traces.provider.get_tracer("test")
    with HealthyServer(body=b"x" * 10) as server, tracer.start_as_current_span("hop") as hop:
        async with AsyncClient(Dependency("files")) as client:
            first = await client.send(client.build_request("GET", server.url), stream=True)
            second = await client.send(client.build_request("GET", server.url), stream=True)
            await first.aclose()
            await second.aclose()
            assert trace.get_current_span() is hop
            with tracer.start_as_current_span("after") as after:
                pass
    assert after.parent is not None and after.parent.span_id == hop.get_span_context().span_id
    assert len(traces.named("deadlines.call files")) == 2


async def test_a_call_in_another_task_nests_in_the_span_current_there(traces: Traces) -> None:
    """Concurrent calls in their own tasks are siblings under the span that started them."""
    tracer = traces.provider.get_tracer("test")
    with HealthyServer() as server, tracer.start_as_current_span("fan-out") as hop:
        async with AsyncClient(Dependency("shard")) as client:
            await asyncio.gather(*(client.get(server.url) for _ in range(3)))
        assert trace.get_current_span() is hop
    calls = traces.named("deadlines.call shard")
    assert len(calls) == 3
    assert {parent_of(c) for c in calls} == {hop.get_span_context().span_id}


def test_sdk_runs_observable_callbacks_before_it_reads_histograms() -> None:
    """The SDK contract the held-back metrics rely on, pinned for every SDK release we allow.

    deadlines.otel applies its held records to histograms from an observable counter's
    callback; that is only complete if every collection, by every reader, runs the
    callbacks before it reads any histogram, whichever instrument was created first.
    """
    readers = [InMemoryMetricReader(), InMemoryMetricReader()]
    provider = MeterProvider(metric_readers=readers)
    meter = provider.get_meter("contract")
    before = meter.create_histogram("made_before")
    records = 0

    def record_in_callback(options: object) -> list[object]:
        nonlocal records
        records += 1
        before.record(1.0)
        after.record(1.0)
        return []

    meter.create_observable_counter("flush", [record_in_callback])  # type: ignore[list-item]
    after = meter.create_histogram("made_after")
    for collection in range(1, 4):
        for reader in readers:
            data = reader.get_metrics_data()
            assert data is not None
            counts = {
                metric.name: metric.data.data_points[0].count  # type: ignore[union-attr]
                for rm in data.resource_metrics
                for sm in rm.scope_metrics
                for metric in sm.metrics
                if metric.name.startswith("made_")
            }
            # Cumulative: every record made by every callback so far, this one's included.
            assert counts == {"made_before": records, "made_after": records}, collection
    provider.shutdown()
