"""Outbound overhead: the bare clients against the same clients through `deadlines`.

Small GETs to the `fast` server (benchmarks/servers.py, its own process), from this
process: one call at a time and 64 at once. Per call: latency (wall) and CPU time of
this process (`time.process_time`), which is the client's whole cost because the server
runs elsewhere. A and B alternate batch by batch in one run; each round's B/A ratio of
medians gives the ratio and its spread. A third side runs A again (the A/A control,
reported for CPU): its distance from 1.00 is what the run cannot resolve.

Both sides get the same pool (64 connections) and a bounded timeout; the `deadlines`
side runs inside one `deadlines.scope` per batch, as calls made by a request handler
whose deadline the inbound middleware set (that cost is the inbound benchmark's).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import httpx
from harness import Child, Comparison, Summary, turns, verdict_ratio

import deadlines
import deadlines.aiohttp
import deadlines.httpx

POOL = 64
DEP = deadlines.Dependency("bench", connect=2.0, headers=10.0, total=10.0, pool_size=POOL)

Call = Callable[[], Awaitable[None]]


@dataclass
class Batch:
    """One batch of calls: each call's latency (ms) and the CPU µs per call."""

    latencies_ms: list[float]
    cpu_us: float


async def _sequential(call: Call, n: int) -> Batch:
    latencies: list[float] = []
    gc.collect()
    cpu = time.process_time()
    for _ in range(n):
        start = time.perf_counter()
        await call()
        latencies.append((time.perf_counter() - start) * 1000)
    return Batch(latencies, (time.process_time() - cpu) / n * 1e6)


async def _concurrent(call: Call, workers: int, each: int) -> Batch:
    latencies: list[float] = []

    async def worker() -> None:
        for _ in range(each):
            start = time.perf_counter()
            await call()
            latencies.append((time.perf_counter() - start) * 1000)

    gc.collect()
    cpu = time.process_time()
    await asyncio.gather(*(worker() for _ in range(workers)))
    return Batch(latencies, (time.process_time() - cpu) / (workers * each) * 1e6)


def _in_scope(run: Callable[[], Awaitable[Batch]]) -> Callable[[], Awaitable[Batch]]:
    async def scoped() -> Batch:
        async with deadlines.scope(3600):
            return await run()
        raise AssertionError("unreachable: the scope never expires here")

    return scoped


async def _side_by_side(
    rounds: int, run_a: Callable[[], Awaitable[Batch]], run_b: Callable[[], Awaitable[Batch]]
) -> tuple[list[Batch], list[Batch], list[Batch]]:
    """A's, B's and A's again (the A/A control) batches, each going first in turn."""
    await run_a()  # warm up: connections, imports, caches
    await run_b()
    sides = [run_a, run_b, run_a]
    seen: list[list[Batch]] = [[], [], []]
    for k in turns(rounds, 3):
        seen[k].append(await sides[k]())
    return seen[0], seen[1], seen[2]


def _rows(
    name: str, labels: tuple[str, str], a: list[Batch], b: list[Batch], twin: list[Batch]
) -> list[Comparison]:
    """Latency and CPU, B against A (goals), and the CPU of A against itself (A/A, report)."""
    lat_rounds = [
        statistics.median(y.latencies_ms) / statistics.median(x.latencies_ms)
        for x, y in zip(a, b, strict=True)
    ]
    latency = Comparison(
        name=name,
        metric="latency ms",
        a_label=labels[0],
        b_label=labels[1],
        a=Summary.of([v for x in a for v in x.latencies_ms]),
        b=Summary.of([v for y in b for v in y.latencies_ms]),
        goal="ratio <= 1.10",
        rounds=lat_rounds,
    )
    cpu = _cpu(name, labels, a, b)
    cpu.goal = "ratio <= 1.10"
    control = _cpu(f"{name} A/A", (labels[0], "the same, again"), a, twin)
    control.goal = "report"
    return [verdict_ratio(latency, at_most=1.10), verdict_ratio(cpu, at_most=1.10), control]


def _cpu(name: str, labels: tuple[str, str], a: list[Batch], b: list[Batch]) -> Comparison:
    return Comparison(
        name=name,
        metric="CPU µs per call",
        a_label=labels[0],
        b_label=labels[1],
        a=Summary.of([x.cpu_us for x in a]),
        b=Summary.of([y.cpu_us for y in b]),
        rounds=[y.cpu_us / x.cpu_us for x, y in zip(a, b, strict=True)],
        notes={
            "added_cpu_us": statistics.median(
                y.cpu_us - x.cpu_us for x, y in zip(a, b, strict=True)
            )
        },
    )


async def _async_suite(url: str, rounds: int, seq_n: int, each: int) -> list[Comparison]:
    bare_httpx = httpx.AsyncClient(
        limits=httpx.Limits(max_connections=POOL, max_keepalive_connections=POOL),
        timeout=httpx.Timeout(10.0, connect=2.0),
    )
    our_httpx = deadlines.httpx.AsyncClient(DEP)
    bare_aiohttp = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=POOL, limit_per_host=0),
        timeout=aiohttp.ClientTimeout(total=10.0, sock_connect=2.0),
    )
    our_aiohttp = deadlines.aiohttp.session(DEP)

    async def httpx_get(client: httpx.AsyncClient) -> None:
        response = await client.get(url)
        assert response.status_code == 200

    async def bare_aiohttp_get() -> None:
        async with bare_aiohttp.get(url) as response:
            await response.read()
            assert response.status == 200

    async def our_aiohttp_get() -> None:
        async with our_aiohttp.get(url) as response:
            await response.read()
            assert response.status == 200

    calls: dict[str, tuple[Call, Call, tuple[str, str]]] = {
        "httpx": (
            lambda: httpx_get(bare_httpx),
            lambda: httpx_get(our_httpx),
            ("httpx.AsyncClient", "deadlines.httpx.AsyncClient"),
        ),
        "aiohttp": (
            bare_aiohttp_get,
            our_aiohttp_get,
            ("aiohttp.ClientSession", "deadlines.aiohttp.session"),
        ),
    }
    rows: list[Comparison] = []
    try:
        for lib, (bare, ours, labels) in calls.items():
            a, b, twin = await _side_by_side(
                rounds,
                lambda bare=bare: _sequential(bare, seq_n),  # type: ignore[misc]
                _in_scope(lambda ours=ours: _sequential(ours, seq_n)),  # type: ignore[misc]
            )
            rows += _rows(f"outbound {lib}: sequential", labels, a, b, twin)
            a, b, twin = await _side_by_side(
                rounds,
                lambda bare=bare: _concurrent(bare, POOL, each),  # type: ignore[misc]
                _in_scope(lambda ours=ours: _concurrent(ours, POOL, each)),  # type: ignore[misc]
            )
            rows += _rows(f"outbound {lib}: {POOL} concurrent", labels, a, b, twin)
    finally:
        await bare_httpx.aclose()
        await our_httpx.aclose()
        await bare_aiohttp.close()
        await our_aiohttp.close()
    return rows


def _sync_suite(url: str, rounds: int, seq_n: int) -> list[Comparison]:
    """The blocking httpx clients, one call at a time."""
    bare = httpx.Client(timeout=httpx.Timeout(10.0, connect=2.0))
    ours = deadlines.httpx.Client(DEP)

    def batch(client: httpx.Client, scoped: bool) -> Batch:
        latencies: list[float] = []
        gc.collect()
        cpu = time.process_time()
        with deadlines.scope(3600) if scoped else contextlib.nullcontext():
            for _ in range(seq_n):
                start = time.perf_counter()
                assert client.get(url).status_code == 200
                latencies.append((time.perf_counter() - start) * 1000)
        return Batch(latencies, (time.process_time() - cpu) / seq_n * 1e6)

    try:
        batch(bare, False)
        batch(ours, True)
        sides = [(bare, False), (ours, True), (bare, False)]  # the third: the A/A control
        seen: list[list[Batch]] = [[], [], []]
        for k in turns(rounds, 3):
            seen[k].append(batch(*sides[k]))
    finally:
        bare.close()
        ours.close()
    labels = ("httpx.Client", "deadlines.httpx.Client")
    return _rows("outbound httpx sync: sequential", labels, *seen)


def run(quick: bool) -> list[Comparison]:
    """Every outbound comparison; `quick` is a smoke test of a few seconds."""
    rounds, seq_n, each = (4, 100, 4) if quick else (30, 200, 6)
    with Child("servers.py", "fast") as server:
        url = f"http://127.0.0.1:{server.port}/"
        rows = asyncio.run(_async_suite(url, rounds, seq_n, each))
        rows += _sync_suite(url, rounds, seq_n)
    return rows
