"""deadlines.prometheus: real calls to misbehaving loopback servers, read back by scraping."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest
from metrics_net import Samples, scrape, until, value
from prometheus_client import CollectorRegistry

import deadlines
from deadlines import (
    BudgetExhausted,
    CallFinished,
    CallStarted,
    ConnectTimeout,
    DeadlineExceeded,
    Dependency,
    HeadersTimeout,
    JobDropped,
    PoolTimeout,
    RequestFinished,
    RequestStarted,
    prometheus,
)
from deadlines._events import emit
from deadlines.httpx import AsyncClient
from deadlines.lab.servers import BlackholeServer, SilentServer, SlowServer

pytestmark = pytest.mark.anyio


@pytest.fixture
def registry() -> Iterator[CollectorRegistry]:
    """A fresh registry with the deadlines metrics installed, removed afterwards."""
    reg = CollectorRegistry()
    with prometheus.install(reg):
        yield reg


@pytest.mark.realtime
async def test_hung_dependency_raises_in_flight_then_headers_timeouts(
    registry: CollectorRegistry,
) -> None:
    """Calls hanging on a silent server show in flight, then as headers timeouts."""
    dep = Dependency("inventory", headers=0.6, total=5)
    with SilentServer() as server:
        async with AsyncClient(dep, base_url=server.url) as client:
            calls = [asyncio.create_task(client.get("/")) for _ in range(3)]
            await until(lambda: server.opened >= 3, "three connections")
            hanging = scrape(registry)
            results = await asyncio.gather(*calls, return_exceptions=True)
    inventory = {"dependency": "inventory"}
    assert value(hanging, "deadlines_outbound_in_flight", **inventory) == 3
    assert value(hanging, "deadlines_outbound_calls_total", **inventory, outcome="ok") is None
    assert all(isinstance(r, HeadersTimeout) for r in results), results
    after = scrape(registry)
    assert value(after, "deadlines_outbound_in_flight", **inventory) == 0
    assert value(after, "deadlines_outbound_timeouts_total", **inventory, phase="headers") == 3
    timed_out = {**inventory, "outcome": "timeout"}
    assert value(after, "deadlines_outbound_calls_total", **timed_out) == 3
    assert value(after, "deadlines_outbound_duration_seconds_count", **timed_out) == 3
    total = value(after, "deadlines_outbound_duration_seconds_sum", **timed_out)
    assert total is not None and 3 * 0.59 <= total <= 3 * (0.6 + 0.5)
    # Three connections for three calls: nobody waited in the pool.
    assert value(after, "deadlines_outbound_pool_wait_seconds_bucket", **inventory, le="0.1") == 3


@pytest.mark.realtime
async def test_full_pool_shows_in_pool_wait_apart_from_server_time(
    registry: CollectorRegistry,
) -> None:
    """With one connection, the second call waits in the pool; the histogram says so."""
    server_time = 0.4
    dep = Dependency("pricing", pool_size=1, pool_wait=5, headers=5)
    with SlowServer(delay=server_time) as server:
        async with AsyncClient(dep, base_url=server.url) as client:
            results = await asyncio.gather(client.get("/"), client.get("/"))
    assert [r.status_code for r in results] == [200, 200]
    s = scrape(registry)
    wait = {"dependency": "pricing"}
    assert value(s, "deadlines_outbound_pool_wait_seconds_count", **wait) == 2
    assert value(s, "deadlines_outbound_pool_wait_seconds_bucket", **wait, le="0.1") == 1
    assert value(s, "deadlines_outbound_pool_wait_seconds_bucket", **wait, le="0.25") == 1
    pool_wait = value(s, "deadlines_outbound_pool_wait_seconds_sum", **wait)
    assert pool_wait is not None and server_time - 0.01 <= pool_wait <= server_time + 0.5
    ok = {"dependency": "pricing", "outcome": "ok"}
    duration = value(s, "deadlines_outbound_duration_seconds_sum", **ok)
    assert duration is not None
    # Duration includes the pool; what is left is two calls' worth of server time.
    assert 2 * server_time - 0.02 <= duration - pool_wait <= 2 * server_time + 0.8
    assert not any(name == "deadlines_outbound_timeouts_total" for name, _ in s)


@pytest.mark.realtime
async def test_pool_timeout_is_counted_in_phase_pool(registry: CollectorRegistry) -> None:
    """A call that finds the pool held by a hung call times out in phase pool."""
    dep = Dependency("search", pool_size=1, pool_wait=0.15, headers=0.8)
    with SilentServer() as server:
        async with AsyncClient(dep, base_url=server.url) as client:
            first = asyncio.create_task(client.get("/"))
            await until(lambda: server.opened >= 1, "the first connection")
            with pytest.raises(PoolTimeout) as info:
                await client.get("/")
            with pytest.raises(HeadersTimeout):
                await first
    assert info.value.request_sent is False
    s = scrape(registry)
    search = {"dependency": "search"}
    assert value(s, "deadlines_outbound_timeouts_total", **search, phase="pool") == 1
    assert value(s, "deadlines_outbound_timeouts_total", **search, phase="headers") == 1
    assert value(s, "deadlines_outbound_pool_wait_seconds_bucket", **search, le="0.1") == 1
    assert value(s, "deadlines_outbound_pool_wait_seconds_bucket", **search, le="0.25") == 2


@pytest.mark.realtime
async def test_blackhole_connect_timeout(registry: CollectorRegistry) -> None:
    """A connect into a full accept queue times out in phase connect."""
    dep = Dependency("ledger", connect=0.2)
    with BlackholeServer() as hole, pytest.raises(ConnectTimeout):
        async with AsyncClient(dep, base_url=hole.url) as client:
            await client.get("/")
    s = scrape(registry)
    assert value(s, "deadlines_outbound_timeouts_total", dependency="ledger", phase="connect") == 1
    assert value(s, "deadlines_outbound_in_flight", dependency="ledger") == 0


@pytest.mark.realtime
async def test_request_deadline_binding_the_call_is_a_deadline_timeout(
    registry: CollectorRegistry,
) -> None:
    """When the request's deadline is the binding limit, the outcome is deadline."""
    dep = Dependency("profile", headers=10)
    with SilentServer() as server:
        async with AsyncClient(dep, base_url=server.url) as client:
            # The sync scope only sets the deadline: the call's own wait fires.
            with deadlines.scope(0.3), pytest.raises(DeadlineExceeded) as info:
                await client.get("/")
            # The async scope also cancels the call at the deadline.
            with pytest.raises(DeadlineExceeded):
                async with deadlines.scope(0.3):
                    await client.get("/")
    assert info.value.phase == "headers"
    s = scrape(registry)
    profile = {"dependency": "profile"}
    assert value(s, "deadlines_outbound_calls_total", **profile, outcome="deadline") == 2
    assert value(s, "deadlines_outbound_calls_total", **profile, outcome="cancelled") is None
    assert value(s, "deadlines_outbound_timeouts_total", **profile, phase="headers") >= 1
    assert _sum(s, "deadlines_outbound_timeouts_total", **profile) == 2
    assert value(s, "deadlines_outbound_budget_seconds_count", **profile) == 2
    left = value(s, "deadlines_outbound_budget_seconds_sum", **profile)
    assert left is not None and 0.0 < left <= 0.6
    assert value(s, "deadlines_outbound_in_flight", **profile) == 0


async def test_cancelled_before_the_deadline_stays_cancelled(registry: CollectorRegistry) -> None:
    """A call cancelled early (caller left) is counted as cancelled, not as a timeout."""
    dep = Dependency("profile", headers=10)
    with SilentServer() as server:
        async with AsyncClient(dep, base_url=server.url) as client:
            call = asyncio.create_task(client.get("/"))
            await until(lambda: server.opened >= 1, "the connection")
            call.cancel()
            with pytest.raises(asyncio.CancelledError):
                await call
    s = scrape(registry)
    assert (
        value(s, "deadlines_outbound_calls_total", dependency="profile", outcome="cancelled") == 1
    )
    assert not any(name == "deadlines_outbound_timeouts_total" for name, _ in s)


async def test_fail_fast_counts_and_leaves_in_flight_alone(registry: CollectorRegistry) -> None:
    """A call refused for lack of budget is a fail-fast, never an in-flight call."""
    dep = Dependency("recs", min_useful=0.5, headers=5)
    with SilentServer() as server:
        async with AsyncClient(dep, base_url=server.url) as client:
            hung = asyncio.create_task(client.get("/"))
            await until(lambda: server.opened >= 1, "the connection")
            with deadlines.scope(0.1), pytest.raises(BudgetExhausted):
                await client.get("/")
            s = scrape(registry)
            hung.cancel()
            with pytest.raises(asyncio.CancelledError):
                await hung
    assert server.opened == 1
    recs = {"dependency": "recs"}
    assert value(s, "deadlines_outbound_fail_fast_total", **recs) == 1
    assert value(s, "deadlines_outbound_calls_total", **recs, outcome="budget_exhausted") == 1
    assert value(s, "deadlines_outbound_in_flight", **recs) == 1  # the hung one
    assert value(s, "deadlines_outbound_budget_seconds_count", **recs) == 1
    after = scrape(registry)
    assert value(after, "deadlines_outbound_in_flight", **recs) == 0
    assert value(after, "deadlines_outbound_calls_total", **recs, outcome="cancelled") == 1


def _sum(samples: Samples, name: str, **labels: str) -> float:
    """The sum of `name` over every series that has `labels` (and any others)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def test_inbound_and_job_events_become_series(registry: CollectorRegistry) -> None:
    """Request and job events feed the inbound counters, gauges and budget histogram."""
    emit(RequestStarted("/orders/{id}", 1.45))
    emit(RequestStarted("/orders/{id}", 0.9))
    mid = scrape(registry)
    emit(RequestFinished("/orders/{id}", "ok", 0.1, 1.45))
    emit(RequestFinished("/orders/{id}", "caller_left", 0.2, 0.9))
    emit(JobDropped("emails", 3.0))
    s = scrape(registry)
    route = {"route": "/orders/{id}"}
    assert value(mid, "deadlines_inbound_in_flight", **route) == 2
    assert value(s, "deadlines_inbound_in_flight", **route) == 0
    assert value(s, "deadlines_inbound_requests_total", **route, outcome="caller_left") == 1
    assert value(s, "deadlines_inbound_caller_left_total", **route) == 1
    assert value(s, "deadlines_inbound_budget_seconds_count", **route) == 2
    assert value(s, "deadlines_inbound_budget_seconds_sum", **route) == pytest.approx(2.35)
    assert value(s, "deadlines_inbound_budget_seconds_bucket", **route, le="1.0") == 1
    assert value(s, "deadlines_jobs_expired_total", queue="emails") == 1


def test_label_values_are_capped(caplog: pytest.LogCaptureFixture) -> None:
    """Past `max_label_values`, new dependency names fold into "other", with one warning."""
    reg = CollectorRegistry()
    with caplog.at_level(logging.WARNING, "deadlines"), prometheus.install(reg, max_label_values=3):
        for i in range(10):
            emit(CallStarted(f"https://api/users/{i}", 1.0))
            emit(CallFinished(f"https://api/users/{i}", "ok", 0.01, 1.0))
        s = scrape(reg)
    deps = {
        dict(labels)["dependency"] for name, labels in s if name == "deadlines_outbound_calls_total"
    }
    assert deps == {"https://api/users/0", "https://api/users/1", "https://api/users/2", "other"}
    assert value(s, "deadlines_outbound_calls_total", dependency="other", outcome="ok") == 7
    assert value(s, "deadlines_outbound_in_flight", dependency="other") == 0
    assert len([r for r in caplog.records if "distinct dependency" in r.getMessage()]) == 1


def test_unknown_phase_and_unstarted_finish_are_bounded(registry: CollectorRegistry) -> None:
    """Odd events never add label values or push in-flight below zero."""
    emit(CallFinished("x", "timeout", 0.1, 1.0, phase="weird"))
    emit(CallFinished("x", "deadline", 0.1, 1.0))
    s = scrape(registry)
    assert value(s, "deadlines_outbound_timeouts_total", dependency="x", phase="unknown") == 2
    assert value(s, "deadlines_outbound_in_flight", dependency="x") == 0


def test_uninstall_unregisters_and_stops_recording() -> None:
    """After uninstall the registry is empty and events are ignored; reinstall works."""
    reg = CollectorRegistry()
    metrics = prometheus.install(reg)
    emit(JobDropped("q", 1.0))
    metrics.uninstall()
    metrics.uninstall()
    emit(JobDropped("q", 1.0))
    assert scrape(reg) == {}
    with prometheus.install(reg) as again:
        emit(JobDropped("q", 1.0))
        assert value(scrape(reg), "deadlines_jobs_expired_total", queue="q") == 1
        assert again.jobs_expired.labels("q")._value.get() == 1


def test_second_install_in_one_registry_is_refused(registry: CollectorRegistry) -> None:
    """Installing twice into the same registry raises a clear error and changes nothing."""
    with pytest.raises(ValueError, match="already registered"):
        prometheus.install(registry)
    emit(JobDropped("q", 1.0))
    assert value(scrape(registry), "deadlines_jobs_expired_total", queue="q") == 1


def test_custom_buckets_and_validation() -> None:
    """Buckets are seconds (numbers or timedeltas), increasing; bad ones are refused."""
    from datetime import timedelta

    reg = CollectorRegistry()
    with prometheus.install(reg, buckets=[0.5, timedelta(seconds=2)]):
        emit(CallFinished("d", "ok", 1.0, float("inf"), pool_wait=0.0))
        s = scrape(reg)
    ok = {"dependency": "d", "outcome": "ok"}
    assert value(s, "deadlines_outbound_duration_seconds_bucket", **ok, le="2.0") == 1
    assert value(s, "deadlines_outbound_duration_seconds_bucket", **ok, le="0.5") == 0
    # No deadline, no budget to record: the series exists (at zero) from the first call.
    assert value(s, "deadlines_outbound_budget_seconds_count", dependency="d") == 0
    with pytest.raises(ValueError, match="strictly increasing"):
        prometheus.install(CollectorRegistry(), buckets=[1, 1])
    with pytest.raises(ValueError, match="must not be empty"):
        prometheus.install(CollectorRegistry(), buckets=[])
    with pytest.raises(ValueError, match="finite"):
        prometheus.install(CollectorRegistry(), buckets=[1, float("inf")])
    with pytest.raises(ValueError, match=">= 1"):
        prometheus.install(CollectorRegistry(), max_label_values=0)


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_scope_cutting_a_call_counts_as_deadline_on_both_backends(
    registry: CollectorRegistry, anyio_backend: str
) -> None:
    """A call cancelled by its scope's deadline is a deadline, under asyncio and trio."""
    import anyio

    with pytest.raises(DeadlineExceeded):
        async with deadlines.scope(0.05):
            with deadlines.CallBudget(Dependency("slow")):
                await anyio.sleep(5)
    s = scrape(registry)
    assert value(s, "deadlines_outbound_calls_total", dependency="slow", outcome="deadline") == 1
    assert value(s, "deadlines_outbound_in_flight", dependency="slow") == 0
