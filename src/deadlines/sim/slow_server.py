"""The chapter's slow-server case as a scenario builder, for the lab's simulated twin.

N identical servers sit behind a load balancer; at `slow_at` one of them becomes
`slowdown` times slower but stays healthy (it passes health checks and keeps its share
of traffic under round robin). Variants: each load-balancing policy, with and without
deadline shedding (servers honour the client's budget, drop queued work that expired
and stop work whose client left). `examples/sim/slow-server.toml` is this builder's
default, written out.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import Any

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
