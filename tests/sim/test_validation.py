"""The model against queueing theory: Little's Law and the Erlang-C mean wait."""

from __future__ import annotations

import math
from typing import Any

import pytest

from deadlines.sim import run_scenario


def erlang_c_wait(workers: int, rate: float, service_rate: float) -> float:
    """Mean time in queue of an M/M/c system (Erlang's C formula)."""
    load = rate / service_rate
    rho = load / workers
    below = sum(load**k / math.factorial(k) for k in range(workers))
    top = load**workers / math.factorial(workers) / (1 - rho)
    waits = top / (below + top)
    return waits / (workers * service_rate - rate)


def mmc(workers: int, mean: float, rate: float, requests: int) -> dict[str, Any]:
    """An M/M/c scenario: Poisson arrivals, exponential work, `workers` in parallel."""
    return {
        "name": "mmc",
        "duration": requests / rate,
        "drain": 1.0,
        "services": {
            "s": {"workers": workers, "routes": {"r": {"work": {"dist": "exp", "mean": mean}}}}
        },
        "load": [{"to": "s/r", "rate": rate, "arrival": "poisson"}],
    }


@pytest.mark.parametrize(
    ("workers", "utilisation"), [(1, 0.6), (4, 0.7), (8, 0.85)], ids=["c1", "c4", "c8"]
)
def test_mmc_mean_wait_matches_erlang_c(workers: int, utilisation: float) -> None:
    """Over 200,000 requests, an M/M/c queue's mean wait is within 5% of Erlang C."""
    mean = 0.01
    rate = utilisation * workers / mean
    result = run_scenario(mmc(workers, mean, rate, 200_000), seed=1)
    route = result.variants["base"].services["s"].routes["r"]
    assert route.queue_wait_mean_ms is not None
    measured = route.queue_wait_mean_ms / 1000
    expected = erlang_c_wait(workers, rate, 1 / mean)
    assert measured == pytest.approx(expected, rel=0.05)


def tree(rate: float, duration: float) -> dict[str, Any]:
    """An API that works, then calls a pooled database and a cache in parallel."""
    return {
        "name": "tree",
        "duration": duration,
        "drain": "5s",
        "sample": "50ms",
        "services": {
            "api": {
                "workers": 16,
                "routes": {
                    "r": {
                        "steps": [
                            {"work": {"dist": "exp", "mean": "5ms"}},
                            {"call": ["db", "cache"]},
                        ]
                    }
                },
                "pools": {"db": {"size": 8}},
                "calls": {"db": {"to": "db/q", "pool": "db"}, "cache": {"to": "cache/get"}},
            },
            "db": {
                "servers": 2,
                "workers": 4,
                "routes": {"q": {"work": {"dist": "lognormal", "median": "8ms", "p99": "40ms"}}},
            },
            "cache": {
                "routes": {"get": {"work": {"dist": "uniform", "low": "1ms", "high": "3ms"}}}
            },
        },
        "load": [{"name": "r", "to": "api/r", "rate": rate, "arrival": "poisson"}],
    }


def test_littles_law_in_steady_state() -> None:
    """Sampled in flight averages rate x mean latency within 2% (queues, pools, fan-out)."""
    rate, duration = 400.0, 120.0
    variant = run_scenario(tree(rate, duration), seed=1).variants["base"]
    series = variant.series
    samples = [
        n for t, n in zip(series.t_s, series.in_flight["r"], strict=True) if 1.0 <= t < duration
    ]
    in_flight = sum(samples) / len(samples)
    load = variant.loads["r"]
    assert load.mean_ms is not None and load.failed == 0 and load.unfinished == 0
    assert in_flight == pytest.approx(rate * load.mean_ms / 1000, rel=0.02)
    # The engine's own time integral agrees with the samples.
    assert load.in_flight_mean * (duration + 5) / duration == pytest.approx(in_flight, rel=0.02)


def test_littles_law_when_work_never_ends() -> None:
    """The chapter's physics: with duration "forever", in flight grows by the rate each second."""
    scenario = {
        "name": "forever",
        "duration": 8,
        "sample": "100ms",
        "services": {"s": {"routes": {"r": {"work": "forever"}}}},
        "load": [{"to": "s/r", "rate": 50}],
    }
    load = run_scenario(scenario).variants["base"].loads["r"]
    assert load.in_flight_end == 400
    assert load.in_flight_mean == pytest.approx(200, rel=0.02)  # mean of a 0..400 ramp
