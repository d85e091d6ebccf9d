"""The chapter's slow-server case as a scenario builder, for the lab's simulated twin.

N identical servers sit behind a load balancer; at `slow_at` one of them becomes
`slowdown` times slower but stays healthy (it passes health checks and keeps its share
of traffic under round robin). Variants: each load-balancing policy, with and without
deadline shedding (servers honour the client's budget, drop queued work that expired
and stop work whose client left). `examples/sim/slow-server.toml` is this builder's
default, written out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from .._tools.stats import percentile
from .engine import Simulation, simulate
from .model import POLICIES, Scenario
from .scenario import scenario_from_dict


def _s(value: float | timedelta) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


def slow_server_scenario(
    *,
    servers: int = 5,
    workers: int = 4,
    service_time: float | timedelta = 0.02,
    rate: float = 500.0,
    arrival: str = "poisson",
    slowdown: float = 5.0,
    slow_at: float | timedelta = 1.0,
    slow_server: int = 1,
    timeout: float | timedelta = 2.0,
    duration: float | timedelta = 30.0,
    policies: Iterable[str] = POLICIES,
    deadlines: Iterable[bool] = (False, True),
    seed: int = 1,
) -> Scenario:
    """Build the slow-server scenario; times in seconds (or timedeltas).

    Args:
        servers: Servers behind the load balancer.
        workers: Requests each server handles at once; the rest wait in its queue.
        service_time: Mean of the (exponential) work per request.
        rate: Requests per second from all clients.
        arrival: ``poisson`` or ``uniform``.
        slowdown: How many times slower the slow server becomes.
        slow_at: When it becomes slow.
        slow_server: Which server (index) becomes slow.
        timeout: How long a client waits (sent as the request's budget).
        duration: How long load is sent; the run then drains for `timeout`.
        policies: Load-balancing policies to compare (``round_robin``,
            ``least_outstanding``, ``p2c``).
        deadlines: For each policy, a variant without (False) and/or with (True)
            deadline shedding; the latter is named ``POLICY_deadlines``.
        seed: The scenario's default seed.
    """
    variants: dict[str, Any] = {}
    for policy in policies:
        for shedding in deadlines:
            name = f"{policy}_deadlines" if shedding else policy
            service: dict[str, Any] = {"lb": policy}
            if shedding:
                service["deadline"] = True
            variants[name] = {"services": {"backend": service}}
    data: dict[str, Any] = {
        "name": "slow-server",
        "description": f"One of {servers} servers becomes {slowdown:g}x slower"
        f" at {_s(slow_at):g} s but stays healthy",
        "seed": seed,
        "duration": _s(duration),
        "drain": _s(timeout),
        "sample": max(0.01, _s(duration) / 300),
        "window": max(0.1, _s(duration) / 60),
        "services": {
            "backend": {
                "servers": servers,
                "workers": workers,
                "routes": {"work": {"work": {"dist": "exp", "mean": _s(service_time)}}},
            }
        },
        "load": [
            {
                "name": "clients",
                "to": "backend/work",
                "rate": rate,
                "arrival": arrival,
                "timeout": _s(timeout),
            }
        ],
        "faults": [
            {
                "kind": "slow",
                "service": "backend",
                "server": slow_server,
                "at": _s(slow_at),
                "factor": slowdown,
            }
        ],
        "variants": variants,
    }
    return scenario_from_dict(data, source="slow_server_scenario()")


#: The lab's policy names (`deadlines lab slow-server`): a balancer, optionally with
#: ``+deadlines``. ``p2c`` is the simulator's addition.
LAB_POLICIES = ("round_robin", "least_outstanding", "round_robin+deadlines")


def lab_slow_server(
    *,
    servers: int = 3,
    rate: float = 90.0,
    run_for: float = 7.0,
    service_ms: float = 20.0,
    slow_factor: float = 5.0,
    slow_at: float = 1.0,
    request_deadline: float = 1.0,
    client_timeout: float = 3.0,
    window: float = 0.5,
    sample_every: float = 0.25,
    policies: Iterable[str] = LAB_POLICIES,
    workers: int = 1,
    seed: int = 1,
) -> dict[str, Any]:
    """The lab's slow-server experiment, simulated: same parameters, same JSON shape.

    Mirrors `deadlines lab slow-server`: `servers` backends of `workers` worker(s), each
    request taking `service_ms` (constant), evenly spaced load at `rate` for `run_for`
    seconds; backend 1 becomes `slow_factor` times slower at `slow_at`. Without
    deadlines a client waits `client_timeout` and backends serve work nobody waits for;
    with ``+deadlines`` the client sends and keeps a `request_deadline` budget, and
    backends drop work whose budget is shorter than the work or whose client left.

    Returns ``{"params", "slow_server": 1, "simulated": True, "seed", "policies":
    {POLICY: {"latency_series": [[t, p50_ms, p99_ms]], "queue_series": [[[t, n]]],
    "ok", "failed", "p50_ms_after_slowdown", "p99_ms_after_slowdown",
    "ok_pct_after_slowdown", "share_sent_to_slow_pct", "queue_max", "served",
    "wasted", "dropped", "load": {"req": {"requested_per_s", "achieved_per_s",
    "error_pct", "sent"}, "max_start_lateness_ms"}}}}`` where windows are by send time,
    queues count queued plus running requests per backend, and `served` counts every
    completed request (`wasted` ones included), as the lab's backends do.
    """
    policies = tuple(policies)
    variants: dict[str, Any] = {}
    for policy in policies:
        balancer, _, extra = policy.partition("+")
        if balancer not in POLICIES or extra not in ("", "deadlines"):
            raise ValueError(f"unknown policy {policy!r}; known: {', '.join(LAB_POLICIES)}")
        service: dict[str, Any] = {"lb": balancer}
        load: dict[str, Any] = {"timeout": client_timeout, "send_deadline": False}
        if extra:
            service["deadline"] = {"shed_short": True}
            load = {"timeout": request_deadline, "send_deadline": True}
        variants[policy.replace("+", "_")] = {
            "services": {"backend": service},
            "load": [{"name": "req", "to": "backend/work", "rate": rate, **load}],
            # The lab reads the backends' counters once every client has its answer or
            # gave up: the run ends one client limit after the load.
            "drain": load["timeout"],
        }
    data: dict[str, Any] = {
        "name": "slow-server",
        "duration": run_for,
        "drain": max(client_timeout, request_deadline),
        "sample": sample_every,
        "window": window,
        "services": {
            "backend": {
                "servers": servers,
                "workers": workers,
                "routes": {"work": {"work": service_ms / 1000.0}},
            }
        },
        "load": [{"name": "req", "to": "backend/work", "rate": rate}],
        "faults": [
            {
                "kind": "slow",
                "service": "backend",
                "server": 1,
                "at": slow_at,
                "factor": slow_factor,
            }
        ],
        "variants": variants,
    }
    scenario = scenario_from_dict(data, source="lab_slow_server()")
    figures = {
        policy: _lab_figures(simulate(scenario.variants[policy.replace("+", "_")], seed), slow_at)
        for policy in policies
    }
    params = {
        "servers": servers,
        "rate": rate,
        "run_for": run_for,
        "service_ms": service_ms,
        "slow_factor": slow_factor,
        "slow_at": slow_at,
        "request_deadline": request_deadline,
        "client_timeout": client_timeout,
        "window": window,
        "sample_every": sample_every,
        "policies": list(policies),
        "workers": workers,
    }
    return {"params": params, "slow_server": 1, "simulated": True, "seed": seed,
            "policies": figures}  # fmt: skip


def _lab_figures(sim: Simulation, slow_at: float) -> dict[str, Any]:
    """One policy's figures in the lab's shape."""
    stats = sim.load_stats["req"]
    model = sim.model
    sent, latency, oks = stats.sent, stats.latencies, stats.oks
    buckets: dict[int, list[float]] = {}
    after: list[float] = []
    ok_after = 0
    for at, waited, ok in zip(sent, latency, oks, strict=True):
        buckets.setdefault(int(at / model.window), []).append(waited)
        if at >= slow_at:
            after.append(waited)
            ok_after += ok
    series = []
    for index in range(math.ceil(model.duration / model.window - 1e-9)):
        window = sorted(buckets.get(index, []))
        series.append([round(index * model.window, 3), _pct(window, 0.50), _pct(window, 0.99)])
    after.sort()
    servers = sim.services["backend"].servers
    samples = [
        (round(t, 3), sample)
        for t, sample in zip(sim.series_t, sim.series_outstanding["backend"], strict=True)
        if t <= model.duration + 1e-9
    ]
    queues = [[[t, sample[i]] for t, sample in samples] for i in range(len(servers))]
    return {
        "latency_series": series,
        "queue_series": queues,
        "ok": stats.ok,
        "failed": stats.failed,
        "p50_ms_after_slowdown": _pct(after, 0.50),
        "p99_ms_after_slowdown": _pct(after, 0.99),
        "ok_pct_after_slowdown": round(100.0 * ok_after / max(1, len(after)), 1),
        "share_sent_to_slow_pct": round(100.0 * servers[1].requests / max(1, stats.requests), 1),
        "queue_max": [max((n for _, n in q), default=0) for q in queues],
        "served": [s.served + s.wasted for s in servers],
        "wasted": [s.wasted for s in servers],
        "dropped": [s.dropped for s in servers],
        "load": _rate_report(model.loads[0].rate, sent, model.duration),
    }


def _rate_report(rate: float, sent: Sequence[float], duration: float) -> dict[str, Any]:
    """The lab's `LoadRun.rate_report` shape: achieved rate over the span of the starts."""
    span = max(sent) - min(sent) if len(sent) > 1 else 0.0
    achieved = (len(sent) - 1) / span if span > 0 else len(sent) / duration
    return {
        "req": {
            "requested_per_s": rate,
            "achieved_per_s": round(achieved, 3),
            "error_pct": round(100.0 * (achieved - rate) / rate, 3),
            "sent": len(sent),
        },
        "max_start_lateness_ms": 0.0,  # simulated clients start on the instant
    }


def _pct(ordered: list[float], q: float) -> float | None:
    value = percentile(ordered, q)
    return None if value is None else round(value * 1000.0, 1)
