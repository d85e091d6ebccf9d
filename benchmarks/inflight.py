"""Bounded in-flight under a hung dependency: the lab's cascade, `deadlines` variant, at 10×.

The cascade of the reference chapter (Part 3, `deadlines.lab.cascade`): an API whose
`/home` calls recommendations ∥ price and `/checkout` calls price, on one downstream
host where recommendations never answer. The chapter loads it with 50 /home + 10
/checkout per second; here 10× that, open loop (requests leave on schedule whatever
the API does), against the API's `deadlines` variant: `deadlines.aiohttp_web`
middleware (a 1 s deadline by default), a pool per dependency, and a 0.3 s fallback
for the optional recommendations.

Little's Law bounds what can be in flight when nothing waits longer than its deadline:
in flight ≤ arrival rate × budget, 500/s × 1 s for /home and 100/s × 5 s for /checkout
(whose callers send a 5 s budget). Sampled every half second from the API's `/_stats`,
with the API process's resident memory, which must stay flat.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from typing import Any

import aiohttp
from harness import Bounded, Summary, cpu_seconds, quantile, rss_mb

from deadlines.lab.harness import Processes
from deadlines.lab.load import run_open_loop

HOME_RATE, CHECKOUT_RATE = 500.0, 100.0  # 10x the chapter's 50 + 10 per second
HOME_DEADLINE, CHECKOUT_DEADLINE = 1.0, 5.0
RECS_LIMIT, POOL = 0.3, 20


async def _drive(
    api: str, down: str, api_pid: int, duration: float, every: float
) -> dict[str, Any]:
    load = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=CHECKOUT_DEADLINE + 5),
    )
    control = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
    checkout_headers = {"x-request-timeout-ms": str(round(CHECKOUT_DEADLINE * 1000))}
    statuses: dict[str, Counter[str]] = {"home": Counter(), "checkout": Counter()}

    async def fire(kind: str, index: int) -> tuple[int | None, str | None]:
        headers = checkout_headers if kind == "checkout" else None
        try:
            async with load.get(f"{api}/{kind}", headers=headers) as resp:
                await resp.read()
                statuses[kind][str(resp.status)] += 1
                return resp.status, None
        except (TimeoutError, aiohttp.ClientError) as exc:
            statuses[kind][type(exc).__name__] += 1
            return None, type(exc).__name__

    samples: list[dict[str, float]] = []

    async def sample() -> None:
        loop = asyncio.get_running_loop()
        t0 = last_t = loop.time()
        last_cpu = cpu_seconds(api_pid)
        while True:
            async with control.get(api + "/_stats") as resp:
                stats = await resp.json()
            now, cpu = loop.time(), cpu_seconds(api_pid)
            samples.append(
                {
                    "t": round(now - t0, 2),
                    "home": stats["home_in_flight"],
                    "checkout": stats["checkout_in_flight"],
                    "rss_mb": round(rss_mb(api_pid), 2),
                    "api_cpu": round((cpu - last_cpu) / max(now - last_t, 1e-3), 2),
                }
            )
            last_t, last_cpu = now, cpu
            await asyncio.sleep(every)

    try:
        async with control.get(api + "/_downstream", params={"url": down}) as resp:
            resp.raise_for_status()
        sampler = asyncio.create_task(sample())
        run = await run_open_loop(
            {"home": HOME_RATE, "checkout": CHECKOUT_RATE},
            duration,
            fire,
            drain=CHECKOUT_DEADLINE + 1.0,
        )
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        async with control.get(down + "/_stats") as resp:
            downstream = await resp.json()
    finally:
        await load.close()
        await control.close()
    checkout_ms = [s.latency * 1000 for s in run.of("checkout") if s.latency is not None]
    return {
        "samples": samples,
        "statuses": {k: dict(v) for k, v in statuses.items()},
        "load": run.rate_report(),
        "checkout_p99_ms": quantile(checkout_ms, 0.99) if checkout_ms else None,
        "downstream_open_max": downstream["max_open"],
    }


def measure(duration: float, every: float, variant: str = "deadlines") -> dict[str, Any]:
    """Start the downstream and the API (`variant`), load them, return the figures."""
    with Processes() as procs:
        down, api = procs.start_all(
            [
                ("cascade.downstream", ["--price-ms", "5"]),
                ("cascade.api", [
                    "--variant", variant,
                    "--pool-size", str(POOL),
                    "--recs-timeout", str(RECS_LIMIT),
                    "--home-deadline", str(HOME_DEADLINE),
                    "--checkout-deadline", str(CHECKOUT_DEADLINE),
                ]),
            ]
        )  # fmt: skip
        return asyncio.run(_drive(api.url, down.url, api.pid, duration, every))


def run(quick: bool) -> list[Bounded]:
    """In flight per route and the API's memory over the run (30 s; 4 s when quick)."""
    from deadlines.lab.cascade import pending_variants

    if "deadlines" in pending_variants():
        raise RuntimeError(f"the cascade's deadlines variant cannot run: {pending_variants()}")
    duration, every = (4.0, 0.25) if quick else (30.0, 0.5)
    result = measure(duration, every)
    during = [s for s in result["samples"] if s["t"] <= duration]
    notes = {
        "duration_s": duration,
        "statuses": result["statuses"],
        "load": result["load"],
        "checkout_p99_ms": result["checkout_p99_ms"],
        "downstream_open_max": result["downstream_open_max"],
        "series": result["samples"],
    }
    first = [s["rss_mb"] for s in during[: len(during) // 2]]
    rss_bound = round(max(first) * 1.10, 1)
    return [
        Bounded(
            "cascade x10: /home in flight",
            "requests in flight",
            Summary.of([s["home"] for s in during]),
            bound=HOME_RATE * HOME_DEADLINE,
            goal=f"<= {HOME_RATE:g}/s x {HOME_DEADLINE:g} s",
            notes=notes,
        ),
        Bounded(
            "cascade x10: /checkout in flight",
            "requests in flight",
            Summary.of([s["checkout"] for s in during]),
            bound=CHECKOUT_RATE * CHECKOUT_DEADLINE,
            goal=f"<= {CHECKOUT_RATE:g}/s x {CHECKOUT_DEADLINE:g} s",
        ),
        Bounded(
            "cascade x10: API resident memory",
            "RSS MiB",
            Summary.of([s["rss_mb"] for s in during]),
            bound=rss_bound,
            goal="flat: <= 1.1 x max of 1st half",
            notes={"first_half_max_mb": max(first), "last_mb": during[-1]["rss_mb"]},
        ),
    ]
