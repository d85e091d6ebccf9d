"""How late does a limit fire? `deadlines` against the standard library and the raw clients.

Each sample is one call that cannot finish (a sleep, or a GET to the `silent` server in
its own process): the time from just before the call to the moment the caller has its
exception, minus the limit, in ms. A and B alternate in batches. The clients' samples
include opening a connection (the silent server never answers, so none is reused):
a limit covers the whole call, connect included, which is what a caller waits for.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Awaitable, Callable

import aiohttp
import httpx
from harness import Child, Comparison, Summary, alternate, verdict_p99

import deadlines
import deadlines.aiohttp
import deadlines.httpx

LIMIT = 0.05
_ERRORS = (TimeoutError, httpx.TimeoutException, aiohttp.ServerTimeoutError)

Attempt = Callable[[], Awaitable[None]]


async def _lateness(attempt: Attempt, seen: Counter[str]) -> float:
    start = time.perf_counter()
    try:
        await attempt()
    except _ERRORS as exc:
        seen[type(exc).__name__] += 1
    else:
        raise AssertionError("a call to the silent server returned")
    return (time.perf_counter() - start - LIMIT) * 1000


def _compare(
    loop: asyncio.AbstractEventLoop,
    name: str,
    labels: tuple[str, str],
    attempts: tuple[Attempt, Attempt],
    reps: int,
) -> Comparison:
    seen: tuple[Counter[str], Counter[str]] = (Counter(), Counter())
    per_round = max(1, reps // 10)

    def batch(side: int) -> Callable[[], list[float]]:
        async def run() -> list[float]:
            return [await _lateness(attempts[side], seen[side]) for _ in range(per_round)]

        return lambda: loop.run_until_complete(run())

    loop.run_until_complete(_lateness(attempts[0], Counter()))  # warm up both sides
    loop.run_until_complete(_lateness(attempts[1], Counter()))
    a, b = alternate(10, batch(0), batch(1))
    row = Comparison(
        name=name,
        metric="lateness ms",
        a_label=labels[0],
        b_label=labels[1],
        a=Summary.of(a),
        b=Summary.of(b),
        goal="B p99 <= 5 ms",
        notes={"limit_s": LIMIT, "a_errors": dict(seen[0]), "b_errors": dict(seen[1])},
    )
    return verdict_p99(row, 5.0)


def run(quick: bool) -> list[Comparison]:
    """Lateness of a 50 ms limit, `reps` times per side (200; 20 when quick)."""
    reps = 20 if quick else 200
    loop = asyncio.new_event_loop()
    try:
        with Child("servers.py", "silent") as silent:
            return _rows(loop, f"http://127.0.0.1:{silent.port}/", reps)
    finally:
        loop.close()


def _rows(loop: asyncio.AbstractEventLoop, url: str, reps: int) -> list[Comparison]:
    dep = deadlines.Dependency("silent", total=LIMIT, pool_size=4)
    bare_httpx = httpx.AsyncClient(timeout=httpx.Timeout(LIMIT))
    our_httpx = deadlines.httpx.AsyncClient(deadlines.Dependency("silent", pool_size=4))
    our_httpx_total = deadlines.httpx.AsyncClient(dep)

    async def make_sessions() -> tuple[aiohttp.ClientSession, deadlines.aiohttp.Session]:
        return aiohttp.ClientSession(), deadlines.aiohttp.session(dep)

    bare_aiohttp, our_aiohttp = loop.run_until_complete(make_sessions())

    async def sleep_asyncio() -> None:
        async with asyncio.timeout(LIMIT):
            await asyncio.sleep(10)

    async def sleep_scope() -> None:
        async with deadlines.scope(LIMIT):
            await asyncio.sleep(10)

    async def get_httpx() -> None:
        await bare_httpx.get(url)

    async def get_ours_total() -> None:
        await our_httpx_total.get(url)

    async def get_httpx_asyncio() -> None:
        async with asyncio.timeout(LIMIT):
            await bare_httpx.get(url, timeout=10)

    async def get_ours_scope() -> None:
        async with deadlines.scope(LIMIT):
            await our_httpx.get(url)

    async def get_aiohttp() -> None:
        async with bare_aiohttp.get(url, timeout=aiohttp.ClientTimeout(total=LIMIT)) as r:
            await r.read()

    async def get_ours_aiohttp() -> None:
        async with our_aiohttp.get(url) as r:
            await r.read()

    limit = f"{LIMIT * 1000:g} ms"
    try:
        return [
            _compare(
                loop,
                "firing: scope vs asyncio.timeout",
                (f"asyncio.timeout({LIMIT})", f"deadlines.scope({LIMIT})"),
                (sleep_asyncio, sleep_scope),
                reps,
            ),
            _compare(
                loop,
                "firing: httpx total, silent server",
                (f"httpx Timeout({LIMIT})", f"deadlines.httpx, Dependency total={limit}"),
                (get_httpx, get_ours_total),
                reps,
            ),
            _compare(
                loop,
                "firing: httpx in a deadline, silent",
                (
                    f"asyncio.timeout({LIMIT}) around httpx",
                    f"deadlines.scope({LIMIT}) around deadlines.httpx",
                ),
                (get_httpx_asyncio, get_ours_scope),
                reps,
            ),
            _compare(
                loop,
                "firing: aiohttp total, silent server",
                (
                    f"aiohttp ClientTimeout(total={LIMIT})",
                    f"deadlines.aiohttp, Dependency total={limit}",
                ),
                (get_aiohttp, get_ours_aiohttp),
                reps,
            ),
        ]
    finally:

        async def close() -> None:
            await bare_httpx.aclose()
            await our_httpx.aclose()
            await our_httpx_total.aclose()
            await bare_aiohttp.close()
            await our_aiohttp.close()

        loop.run_until_complete(close())
