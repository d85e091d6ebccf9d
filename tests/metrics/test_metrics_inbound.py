"""A real hop under uvicorn: DeadlineMiddleware in, a call to a silent dependency out.

The Prometheus figures are read the way Prometheus reads them: over HTTP from the app's
own ``/metrics`` route (the example in docs/metrics.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from metrics_net import Samples, parse, serve_uvicorn, until, value
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Tracer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from deadlines import Dependency, otel, prometheus
from deadlines.asgi import DeadlineMiddleware
from deadlines.httpx import AsyncClient
from deadlines.lab.servers import SilentServer

pytestmark = [pytest.mark.anyio, pytest.mark.realtime]

INVENTORY = Dependency("inventory", headers=5)
ROUTE = "/orders/{id}"


def orders_app(registry: CollectorRegistry, inventory_url: str) -> Starlette:
    """An app whose order route calls the inventory dependency, and a /metrics route."""

    async def order(request: Request) -> Response:
        async with AsyncClient(INVENTORY, base_url=inventory_url) as inventory:
            await inventory.get("/stock")
        return PlainTextResponse("ok")

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(
        routes=[Route(ROUTE, order), Route("/metrics", metrics)],
        middleware=[Middleware(DeadlineMiddleware, default=2.0, maximum=10.0)],
    )


class ServerSpans:
    """What OTel's ASGI instrumentation does, reduced: a server span around each request."""

    def __init__(self, app: Any, tracer: Tracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        name = f"{scope['method']} {scope['path']}"
        with self.tracer.start_as_current_span(name, kind=SpanKind.SERVER):
            await self.app(scope, receive, send)


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    """A fresh registry with the deadlines metrics installed."""
    reg = CollectorRegistry()
    with prometheus.install(reg):
        yield reg


async def _scrape(http: httpx.AsyncClient) -> Samples:
    response = await http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"] == CONTENT_TYPE_LATEST
    return parse(response.text)


async def _scrape_until(http: httpx.AsyncClient, name: str, want: float, **labels: str) -> Samples:
    end = time.monotonic() + 10
    while True:
        samples = await _scrape(http)
        if value(samples, name, **labels) == want or time.monotonic() > end:
            return samples
        await asyncio.sleep(0.02)


async def test_hung_dependency_behind_asgi_scraped_over_http(registry: CollectorRegistry) -> None:
    """In flight rises on both sides while the dependency hangs; then 504s and deadlines."""
    with SilentServer() as dependency, serve_uvicorn(orders_app(registry, dependency.url)) as port:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            calls = [
                asyncio.create_task(
                    http.get(f"/orders/{i}", headers={"x-request-timeout-ms": "800"})
                )
                for i in range(3)
            ]
            await until(lambda: dependency.opened >= 3, "three calls to inventory")
            during = await _scrape(http)
            responses = await asyncio.gather(*calls)
            after = await _scrape_until(http, "deadlines_inbound_in_flight", 0, route=ROUTE)
    assert [r.status_code for r in responses] == [504, 504, 504]
    assert value(during, "deadlines_inbound_in_flight", route=ROUTE) == 3
    assert value(during, "deadlines_inbound_in_flight", route="/metrics") == 1
    assert value(during, "deadlines_outbound_in_flight", dependency="inventory") == 3
    # Header 800 ms minus the 50 ms reserve, for each of the three.
    assert value(during, "deadlines_inbound_budget_seconds_count", route=ROUTE) == 3
    assert value(during, "deadlines_inbound_budget_seconds_sum", route=ROUTE) == pytest.approx(2.25)
    assert value(after, "deadlines_inbound_requests_total", route=ROUTE, outcome="deadline") == 3
    assert value(after, "deadlines_outbound_in_flight", dependency="inventory") == 0
    out = {"dependency": "inventory"}
    assert value(after, "deadlines_outbound_calls_total", **out, outcome="deadline") == 3
    phases = [
        v
        for (name, labels), v in after.items()
        if name == "deadlines_outbound_timeouts_total" and ("dependency", "inventory") in labels
    ]
    assert sum(phases) == 3
    assert value(after, "deadlines_inbound_requests_total", route="/metrics", outcome="ok") >= 1


async def test_caller_left_cancels_the_call_and_is_counted(registry: CollectorRegistry) -> None:
    """A caller hanging up shows as caller-left inbound and a cancelled call outbound."""
    with SilentServer() as dependency, serve_uvicorn(orders_app(registry, dependency.url)) as port:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /orders/9 HTTP/1.1\r\nHost: shop\r\nx-request-timeout-ms: 5000\r\n\r\n")
        await until(lambda: dependency.opened >= 1, "the call to inventory")
        writer.close()  # the caller gives up
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            s = await _scrape_until(http, "deadlines_inbound_caller_left_total", 1, route=ROUTE)
    assert value(s, "deadlines_inbound_caller_left_total", route=ROUTE) == 1
    assert value(s, "deadlines_inbound_requests_total", route=ROUTE, outcome="caller_left") == 1
    assert value(s, "deadlines_inbound_in_flight", route=ROUTE) == 0
    assert (
        value(s, "deadlines_outbound_calls_total", dependency="inventory", outcome="cancelled") == 1
    )
    assert value(s, "deadlines_outbound_in_flight", dependency="inventory") == 0


async def test_hop_span_carries_budget_outcome_and_call_span() -> None:
    """The server span gets the arrival budget and outcome; the call is its child span."""
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    spans = InMemorySpanExporter()
    tracers = TracerProvider()
    tracers.add_span_processor(SimpleSpanProcessor(spans))
    registry = CollectorRegistry()
    with otel.install(meters, tracers), SilentServer() as dependency:
        app = ServerSpans(orders_app(registry, dependency.url), tracers.get_tracer("asgi"))
        with serve_uvicorn(app) as port:
            async with httpx.AsyncClient(timeout=10) as http:
                response = await http.get(
                    f"http://127.0.0.1:{port}/orders/1", headers={"x-request-timeout-ms": "600"}
                )
    tracers.shutdown()
    assert response.status_code == 504
    (server,) = [s for s in spans.get_finished_spans() if s.name == "GET /orders/1"]
    (call,) = [s for s in spans.get_finished_spans() if s.name == "deadlines.call inventory"]
    assert server.attributes is not None and call.attributes is not None
    assert server.attributes["deadlines.request.budget"] == pytest.approx(0.55)
    assert server.attributes["deadlines.request.outcome"] == "deadline"
    assert server.attributes["deadlines.timeout.dependency"] == "inventory"
    assert call.parent is not None and call.parent.span_id == server.context.span_id
    assert 0.3 < call.attributes["deadlines.remaining"] <= 0.55
    assert call.attributes["deadlines.outcome"] == "deadline"
    data = reader.get_metrics_data()
    assert data is not None
    names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
    assert {"deadlines.inbound.requests", "deadlines.inbound.budget"} <= names
    meters.shutdown()
