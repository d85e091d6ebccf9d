"""How fast is `deadlines sim`? The speed goal: 10 minutes at 2,000 requests/s in < 60 s.

    python benchmarks/sim_speed.py                  # the goal: 600 s at 2,000 rps
    python benchmarks/sim_speed.py --seconds 60     # a shorter run
    python benchmarks/sim_speed.py --compare-simpy 30

The workload is the slow-server twin (`deadlines.sim.slow_server_scenario`): Poisson
clients that give up after 2 s, a power-of-two-choices balancer over 10 servers of 4
workers (exponential work, mean 12 ms: 60% busy), one server 5x slower from t = 1 s,
and deadline shedding (servers honour the client's budget, drop expired queued work and
stop work whose client left), sampled every 2 s.

`--compare-simpy S` also runs a SimPy prototype of the same model for S simulated
seconds, and this engine for the same S, and projects both to 1.2 M requests. This is
the measurement behind the engine decision in docs/sim.md. It needs `simpy`.
"""

from __future__ import annotations

import argparse
import gc
import random
import time
from collections.abc import Callable
from typing import Any

from deadlines.sim import run_scenario, slow_server_scenario

RATE = 2000.0
SERVERS, WORKERS, MEAN, TIMEOUT, SLOW_AT, FACTOR = 10, 4, 0.012, 2.0, 1.0, 5.0


def engine_run(seconds: float) -> tuple[int, float]:
    """Run this project's engine; return (requests, wall seconds)."""
    scenario = slow_server_scenario(
        servers=SERVERS,
        workers=WORKERS,
        service_time=MEAN,
        rate=RATE,
        timeout=TIMEOUT,
        duration=seconds,
        policies=("p2c",),
        deadlines=(True,),
    )
    started = time.perf_counter()
    result = run_scenario(scenario, seed=1)
    wall = time.perf_counter() - started
    variant = result.variants["p2c_deadlines"]
    load = variant.loads["clients"]
    print(
        f"deadlines.sim: {load.requests:,} requests, {variant.events:,} events,"
        f" {seconds:g} simulated s in {wall:.1f} s wall"
        f" (engine {variant.wall_s:.1f} s, summaries {wall - variant.wall_s:.1f} s);"
        f" p99 {load.p99_ms} ms, failed {load.failed}"
    )
    return load.requests, wall


def simpy_run(seconds: float, *, gc_on: bool = False) -> tuple[int, float]:
    """The same model written with SimPy processes; return (requests, wall seconds)."""
    import simpy

    env = simpy.Environment()
    rng = random.Random(1)
    servers = [simpy.Resource(env, capacity=WORKERS) for _ in range(SERVERS)]
    slowdown = [1.0] * SERVERS
    outstanding = [0] * SERVERS
    latencies: list[float] = []
    outcomes: dict[str, int] = {}

    def handler(index: int, deadline: float) -> Any:
        try:
            with servers[index].request() as req:
                got = yield req | env.timeout(max(0.0, deadline - env.now))
                if req not in got:
                    return "deadline"  # expired while queued: shed
                work = env.timeout(rng.expovariate(1 / MEAN) * slowdown[index])
                got = yield work | env.timeout(max(0.0, deadline - env.now))
                return "ok" if work in got else "deadline"
        except simpy.Interrupt:
            return "caller_left"
        finally:
            outstanding[index] -= 1

    def client() -> Any:
        start = env.now
        a = rng.randrange(SERVERS)
        b = rng.randrange(SERVERS - 1)
        b += b >= a
        index = a if outstanding[a] <= outstanding[b] else b
        outstanding[index] += 1
        work = env.process(handler(index, start + TIMEOUT))
        got = yield work | env.timeout(TIMEOUT)
        if work in got:
            outcome = work.value
        else:
            work.interrupt("caller left")
            outcome = "client_timeout"
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        latencies.append(env.now - start)

    def source() -> Any:
        while True:
            yield env.timeout(rng.expovariate(RATE))
            if env.now >= seconds:
                return
            env.process(client())

    def fault() -> Any:
        yield env.timeout(SLOW_AT)
        slowdown[1] = FACTOR

    series: list[tuple[float, int, list[int]]] = []

    def sampler() -> Any:
        while True:
            series.append((env.now, sum(outstanding), [len(s.queue) for s in servers]))
            yield env.timeout(2.0)

    env.process(source())
    env.process(fault())
    env.process(sampler())
    started = time.perf_counter()
    collecting = gc.isenabled()
    if not gc_on:
        gc.disable()  # the same treatment the engine gets
    try:
        env.run(until=seconds + TIMEOUT)
    finally:
        if collecting:
            gc.enable()
    latencies.sort()
    p99 = latencies[int(0.99 * len(latencies))] * 1000
    wall = time.perf_counter() - started
    print(
        f"simpy prototype (gc {'on' if gc_on else 'paused'}): {len(latencies):,} requests,"
        f" {seconds:g} simulated s in"
        f" {wall:.1f} s wall; p99 {p99:.1f} ms, outcomes {outcomes}"
    )
    return len(latencies), wall


def main() -> None:
    """Run the benchmark the flags ask for and print the times."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=600.0, help="simulated seconds")
    parser.add_argument("--compare-simpy", type=float, metavar="S", help="also run SimPy")
    args = parser.parse_args()
    if args.compare_simpy:
        runs: list[tuple[str, Callable[[float], tuple[int, float]]]] = [
            ("deadlines.sim", engine_run),
            ("simpy, gc paused", simpy_run),
            ("simpy, gc on", lambda s: simpy_run(s, gc_on=True)),
        ]
        for name, run in runs:
            requests, wall = run(args.compare_simpy)
            projected = 1.2e6 * wall / requests
            print(f"  {name}: {requests / wall:,.0f} requests/s -> 1.2 M in {projected:.0f} s")
        return
    requests, wall = engine_run(args.seconds)
    goal = requests >= 1.2e6 * args.seconds / 600 * 0.99
    verdict = "meets" if wall < 60 else "MISSES"
    print(
        f"{requests:,} requests in {wall:.1f} s: {verdict} the 60 s goal"
        + ("" if goal else " (short run)")
    )


if __name__ == "__main__":
    main()
