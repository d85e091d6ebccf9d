"""What a run produced: figures per load, service, call and traced hop, and series.

`Result.to_dict()` is the JSON a user (or the lab, for comparison) reads. Besides the
structured sections, each variant carries flat "lab keys" named after the scenario's
loads and services, in the shape `deadlines lab` writes: ``home_in_flight_end``,
``checkout_ok``, ``downstream_open_max``, ``a_answered_ms``, ``c_committed``... so a
simulated and a measured run compare key by key.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .._tools.stats import percentile
from .engine import Simulation
from .stats import CallStats, InFlight, Outcomes, TraceRecord


def _ms(seconds: float | None) -> float | None:
    """Seconds to milliseconds, rounded to a microsecond (None stays None)."""
    return None if seconds is None else round(seconds * 1000.0, 3)


@dataclass(frozen=True)
class LoadSummary:
    """What one load's clients saw. Latency is the time each waited, failures included."""

    requests: int
    ok: int
    failed: int
    unfinished: int
    causes: dict[str, int]
    achieved_rate: float
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None
    p999_ms: float | None
    mean_ms: float | None
    max_ms: float | None
    in_flight_end: int
    in_flight_mean: float
    in_flight_max: int


@dataclass(frozen=True)
class RouteSummary:
    """One route seen from its servers; in flight counts queued requests too."""

    requests: int
    ok: int
    failed: int
    causes: dict[str, int]
    mean_ms: float | None
    queue_wait_mean_ms: float | None
    in_flight_mean: float
    in_flight_max: int


@dataclass(frozen=True)
class ServerSummary:
    """One server: requests it got, its longest queue, what it still held at the end,
    and how its requests ended: `served` (for a caller still waiting), `wasted`
    (completed after the caller left), `dropped` (shed or stopped)."""

    requests: int
    queue_max: int
    outstanding_end: int
    served: int
    wasted: int
    dropped: int


@dataclass(frozen=True)
class ServiceSummary:
    """One service: `open_max` counts requests whose caller was still connected;
    `in_flight_max` also counts handlers working on for a caller that left."""

    requests: int
    open_max: int
    in_flight_max: int
    in_flight_mean: float
    routes: dict[str, RouteSummary]
    servers: list[ServerSummary]


@dataclass(frozen=True)
class CallSummary:
    """One dependency as its callers saw it; pool wait is apart from server time."""

    calls: int
    attempts: int
    ok: int
    failed: int
    causes: dict[str, int]
    retries: int
    fallbacks: int
    pool_wait_mean_ms: float | None
    pool_wait_max_ms: float | None


@dataclass(frozen=True)
class TraceSummary:
    """What one service did for the first client request (ms since it was sent).

    `budget_ms` is the time it was told it had (None without a deadline); `stopped_ms`
    when its own deadline or its caller's leaving stopped it; `finished_ms` when its
    work completed; `committed` whether that work was a commit.
    """

    started_ms: float
    budget_ms: float | None
    answered_ms: float | None
    status: int | None
    gave_up_ms: float | None
    stopped_ms: float | None
    finished_ms: float | None
    committed: bool


@dataclass(frozen=True)
class Series:
    """Values over time: `t_s` are sample instants; queues are per server."""

    t_s: list[float]
    in_flight: dict[str, list[int]]
    queue: dict[str, list[list[int]]]
    outstanding: dict[str, list[list[int]]]
    latency: dict[str, dict[str, list[float | None]]]


@dataclass(frozen=True)
class VariantResult:
    """The figures of one variant."""

    name: str
    duration_s: float
    drain_s: float
    loads: dict[str, LoadSummary]
    services: dict[str, ServiceSummary]
    calls: dict[str, dict[str, CallSummary]]
    trace: dict[str, TraceSummary]
    series: Series
    events: int
    wall_s: float

    def lab_figures(self) -> dict[str, Any]:
        """Flat figures named like the lab's JSON (`home_in_flight_end`, `c_committed`...)."""
        flat: dict[str, Any] = {}
        for name, load in self.loads.items():
            for key in ("requests", "ok", "failed", "p50_ms", "p95_ms", "p99_ms", "p999_ms"):
                flat[f"{name}_{key}"] = getattr(load, key)
            flat[f"{name}_in_flight_end"] = load.in_flight_end
            flat[f"{name}_in_flight_series"] = [
                [t, n] for t, n in zip(self.series.t_s, self.series.in_flight[name], strict=True)
            ]
        for name, service in self.services.items():
            flat[f"{name}_open_max"] = service.open_max
            flat[f"{name}_in_flight_max"] = service.in_flight_max
        for name, hop in self.trace.items():
            for key in (
                "answered_ms",
                "status",
                "gave_up_ms",
                "budget_ms",
                "stopped_ms",
                "finished_ms",
                "committed",
            ):
                flat[f"{name}_{key}"] = getattr(hop, key)
        return flat

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the structured sections plus the flat lab figures."""
        data = asdict(self)
        data.update(self.lab_figures())
        return data


@dataclass(frozen=True)
class Result:
    """A scenario's run: one `VariantResult` per variant, all with the same seed."""

    scenario: str
    description: str
    seed: int
    variants: dict[str, VariantResult] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``{"scenario", "seed", "engine", "variants": {NAME: {...}}}``."""
        return {
            "scenario": self.scenario,
            "description": self.description,
            "seed": self.seed,
            "engine": "deadlines.sim (heapq event loop)",
            "variants": {name: v.to_dict() for name, v in self.variants.items()},
        }

    def to_json(self, *, indent: int | None = 2) -> str:
        """`to_dict` as JSON text (no NaN: missing figures are null)."""
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    def write_json(self, path: str | Path) -> Path:
        """Write `to_json` to `path` (missing parent directories are created); return it."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json() + "\n", encoding="utf-8")
        return path

    def table(self) -> str:
        """The figures as a plain-text report."""
        from .report import table

        return table(self)

    def plot(self, path: str | Path) -> Path:
        """Draw in-flight, latency and queues over time to a PNG (needs matplotlib).

        Missing parent directories are created.
        """
        from .report import plot

        return plot(self, Path(path))


# Building the summaries from a finished simulation.


def summarize(name: str, sim: Simulation) -> VariantResult:
    """The figures of one finished simulation."""
    model = sim.model
    return VariantResult(
        name=name,
        duration_s=model.duration,
        drain_s=model.drain,
        loads={load.name: _load(sim, load.name, load.service, load.route) for load in model.loads},
        services={n: _service(sim, n) for n in sim.services},
        calls={
            service: {call: _call(stats) for call, stats in calls.items()}
            for service, calls in sim.call_stats.items()
            if calls
        },
        trace={n: _trace(r) for n, r in sim.trace.items()},
        series=_series(sim),
        events=sim.loop.events,
        wall_s=round(sim.wall_s, 4),
    )


def _causes(outcomes: Outcomes) -> dict[str, int]:
    return dict(sorted(outcomes.causes.items()))


def _load(sim: Simulation, name: str, service: str, route: str) -> LoadSummary:
    stats = sim.load_stats[name]
    ordered = sorted(stats.latencies)
    in_flight: InFlight = sim.services[service].stats[route].in_flight
    finished = stats.ok + stats.failed
    return LoadSummary(
        requests=stats.requests,
        ok=stats.ok,
        failed=stats.failed,
        unfinished=stats.requests - finished,
        causes=_causes(stats),
        achieved_rate=round(stats.requests / sim.model.duration, 3),
        p50_ms=_ms(percentile(ordered, 0.50)),
        p95_ms=_ms(percentile(ordered, 0.95)),
        p99_ms=_ms(percentile(ordered, 0.99)),
        p999_ms=_ms(percentile(ordered, 0.999)),
        mean_ms=_ms(sum(ordered) / len(ordered)) if ordered else None,
        max_ms=_ms(ordered[-1]) if ordered else None,
        in_flight_end=sim.in_flight_end.get(name, 0),
        in_flight_mean=round(in_flight.mean(sim.end), 4),
        in_flight_max=in_flight.max,
    )


def _service(sim: Simulation, name: str) -> ServiceSummary:
    service = sim.services[name]
    routes = {}
    for route, stats in service.stats.items():
        done = stats.ok + stats.failed
        waited = stats.queue_wait_count
        routes[route] = RouteSummary(
            requests=stats.requests,
            ok=stats.ok,
            failed=stats.failed,
            causes=_causes(stats),
            mean_ms=_ms(stats.latency_sum / done) if done else None,
            queue_wait_mean_ms=_ms(stats.queue_wait_sum / waited) if waited else None,
            in_flight_mean=round(stats.in_flight.mean(sim.end), 4),
            in_flight_max=stats.in_flight.max,
        )
    return ServiceSummary(
        requests=sum(s.requests for s in service.servers),
        open_max=service.open.max,
        in_flight_max=service.in_flight.max,
        in_flight_mean=round(service.in_flight.mean(sim.end), 4),
        routes=routes,
        servers=[
            ServerSummary(s.requests, s.queue_max, s.outstanding, s.served, s.wasted, s.dropped)
            for s in service.servers
        ],
    )


def _call(stats: CallStats) -> CallSummary:
    waited = stats.pool_wait_count
    return CallSummary(
        calls=stats.requests,
        attempts=stats.attempts,
        ok=stats.ok,
        failed=stats.failed,
        causes=_causes(stats),
        retries=stats.retries,
        fallbacks=stats.fallbacks,
        pool_wait_mean_ms=_ms(stats.pool_wait_sum / waited) if waited else None,
        pool_wait_max_ms=_ms(stats.pool_wait_max) if waited else None,
    )


def _trace(record: TraceRecord) -> TraceSummary:
    return TraceSummary(
        started_ms=_ms(record.started) or 0.0,
        budget_ms=_ms(record.budget),
        answered_ms=_ms(record.answered),
        status=record.status,
        gave_up_ms=_ms(record.gave_up),
        stopped_ms=_ms(record.stopped),
        finished_ms=_ms(record.finished),
        committed=record.committed,
    )


def _series(sim: Simulation) -> Series:
    latency: dict[str, dict[str, list[float | None]]] = {}
    window = sim.model.window
    for name, stats in sim.load_stats.items():
        t: list[float | None] = []
        p50: list[float | None] = []
        p99: list[float | None] = []
        for index in sorted(stats.windows):
            ordered = sorted(stats.windows[index])
            t.append(round(index * window, 6))
            p50.append(_ms(percentile(ordered, 0.50)))
            p99.append(_ms(percentile(ordered, 0.99)))
        latency[name] = {"t_s": t, "p50_ms": p50, "p99_ms": p99}
    return Series(
        t_s=[round(t, 6) for t in sim.series_t],
        in_flight=sim.series_in_flight,
        queue=sim.series_queue,
        outstanding=sim.series_outstanding,
        latency=latency,
    )
