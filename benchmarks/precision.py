"""How late does a limit fire? `deadlines` against the standard library and the raw clients.

    python benchmarks/precision.py                          # 50 ms limits (as run.py runs it)
    python benchmarks/precision.py --limits 0.05 0.3 2.3 7.3 --samples 200

Each sample is one call that cannot finish (a sleep, or a GET to the `silent` server in
its own process): the time from just before the call to the moment the caller has its
exception, minus the limit, in ms. A and B alternate in batches. The clients' samples
include opening a connection (the silent server never answers, so none is reused):
a limit covers the whole call, connect included, which is what a caller waits for.

For every client, async and blocking, each limit is tried both ways it is given: as
the dependency's total, and as a request deadline around the call. Limits longer than
a second run several samples at once, their starts spread over the limit so that no
two fire together (what is measured is one firing, not a herd).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp
import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Child, Comparison, Summary, alternate, table, verdict_p99

import deadlines
import deadlines.aiohttp
import deadlines.httpx

GOAL_MS = 2.0
_ERRORS = (TimeoutError, httpx.TimeoutException, aiohttp.ServerTimeoutError)

Attempt = Callable[[], Awaitable[None]]
BlockingAttempt = Callable[[], None]


def _record(seen: Counter[str], limit: float, start: float, error: BaseException | None) -> float:
    if error is None:
        raise AssertionError("a call to the silent server returned")
    seen[type(error).__name__] += 1
    return (time.perf_counter() - start - limit) * 1000


async def _lateness(attempt: Attempt, limit: float, seen: Counter[str]) -> float:
    start = time.perf_counter()
    try:
        await attempt()
    except _ERRORS as exc:
        return _record(seen, limit, start, exc)
    return _record(seen, limit, start, None)


def _blocking_lateness(attempt: BlockingAttempt, limit: float, seen: Counter[str]) -> float:
    start = time.perf_counter()
    try:
        attempt()
    except _ERRORS as exc:
        return _record(seen, limit, start, exc)
    return _record(seen, limit, start, None)


def _at_once(limit: float) -> int:
    """Samples in flight at once: one for short limits, spread over a long one."""
    return 1 if limit < 1.0 else max(1, int(limit / 0.25))


class Bench:
    """Runs comparisons on one loop against one silent server."""

    def __init__(self, loop: asyncio.AbstractEventLoop, url: str, samples: int) -> None:
        self.loop = loop
        self.url = url
        self.samples = samples
        self.threads = ThreadPoolExecutor(max_workers=32)

    def compare_async(
        self, name: str, labels: tuple[str, str], attempts: tuple[Attempt, Attempt], limit: float
    ) -> Comparison:
        """A vs B, both async, `samples` each."""
        seen: tuple[Counter[str], Counter[str]] = (Counter(), Counter())
        width = _at_once(limit)

        def batch(side: int) -> Callable[[], list[float]]:
            count = max(1, self.samples // 10)

            async def one(delay: float) -> float:
                await asyncio.sleep(delay)
                return await _lateness(attempts[side], limit, seen[side])

            async def run() -> list[float]:
                results: list[float] = []
                for first in range(0, count, width):
                    n = min(width, count - first)
                    spread = [i * limit / n for i in range(n)]
                    results += await asyncio.gather(*(one(d) for d in spread))
                return results

            return lambda: self.loop.run_until_complete(run())

        for side in (0, 1):  # warm up both sides
            self.loop.run_until_complete(_swallow(attempts[side]))
        a, b = alternate(10, batch(0), batch(1))
        return self._row(name, labels, a, b, limit, seen)

    def compare_blocking(
        self,
        name: str,
        labels: tuple[str, str],
        attempts: tuple[BlockingAttempt, BlockingAttempt],
        limit: float,
    ) -> Comparison:
        """A vs B, both blocking, `samples` each (threads for long limits)."""
        seen: tuple[Counter[str], Counter[str]] = (Counter(), Counter())
        width = _at_once(limit)

        def batch(side: int) -> Callable[[], list[float]]:
            count = max(1, self.samples // 10)

            def one(delay: float) -> float:
                time.sleep(delay)
                return _blocking_lateness(attempts[side], limit, seen[side])

            def run() -> list[float]:
                results: list[float] = []
                for first in range(0, count, width):
                    n = min(width, count - first)
                    spread = [i * limit / n for i in range(n)]
                    results += list(self.threads.map(one, spread))
                return results

            return run

        for side in (0, 1):
            _swallow_blocking(attempts[side])
        a, b = alternate(10, batch(0), batch(1))
        return self._row(name, labels, a, b, limit, seen)

    def _row(
        self,
        name: str,
        labels: tuple[str, str],
        a: list[float],
        b: list[float],
        limit: float,
        seen: tuple[Counter[str], Counter[str]],
    ) -> Comparison:
        row = Comparison(
            name=f"{name} ({limit:g} s)",
            metric="lateness ms",
            a_label=labels[0],
            b_label=labels[1],
            a=Summary.of(a),
            b=Summary.of(b),
            goal=f"B p99 <= {GOAL_MS:g} ms",
            notes={
                "limit_s": limit,
                "at_once": _at_once(limit),
                "a_errors": dict(seen[0]),
                "b_errors": dict(seen[1]),
            },
        )
        return verdict_p99(row, GOAL_MS)


async def _swallow(attempt: Attempt) -> None:
    with contextlib.suppress(_ERRORS):
        await attempt()


def _swallow_blocking(attempt: BlockingAttempt) -> None:
    with contextlib.suppress(_ERRORS):
        attempt()


def rows_for(bench: Bench, limit: float) -> list[Comparison]:
    """Every comparison at one `limit` (seconds)."""
    url, loop = bench.url, bench.loop
    size = 4 * _at_once(limit)
    plain = deadlines.Dependency("silent", pool_size=size)
    total = deadlines.Dependency("silent", total=limit, pool_size=size)
    limits = httpx.Limits(max_connections=size)
    bare_httpx = httpx.AsyncClient(timeout=httpx.Timeout(limit), limits=limits)
    open_httpx = httpx.AsyncClient(timeout=None, limits=limits)
    ours_httpx = deadlines.httpx.AsyncClient(plain)
    ours_httpx_total = deadlines.httpx.AsyncClient(total)
    bare_sync = httpx.Client(timeout=httpx.Timeout(limit), limits=limits)
    ours_sync = deadlines.httpx.Client(total)

    async def sessions() -> tuple[Any, Any, Any, Any]:
        return (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=limit)),
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)),
            deadlines.aiohttp.session(total),
            deadlines.aiohttp.session(plain),
        )

    bare_aio, open_aio, ours_aio_total, ours_aio = loop.run_until_complete(sessions())

    async def sleep_asyncio() -> None:
        async with asyncio.timeout(limit):
            await asyncio.sleep(limit + 10)

    async def sleep_scope() -> None:
        async with deadlines.scope(limit):
            await asyncio.sleep(limit + 10)

    async def httpx_total() -> None:
        await bare_httpx.get(url)

    async def ours_total() -> None:
        await ours_httpx_total.get(url)

    async def httpx_in_timeout() -> None:
        async with asyncio.timeout(limit):
            await open_httpx.get(url)

    async def ours_in_scope() -> None:
        async with deadlines.scope(limit):
            await ours_httpx.get(url)

    async def aiohttp_total() -> None:
        async with bare_aio.get(url) as response:
            await response.read()

    async def ours_aiohttp_total() -> None:
        async with ours_aio_total.get(url) as response:
            await response.read()

    async def aiohttp_in_timeout() -> None:
        async with asyncio.timeout(limit), open_aio.get(url) as response:
            await response.read()

    async def ours_aiohttp_in_scope() -> None:
        async with deadlines.scope(limit), ours_aio.get(url) as response:
            await response.read()

    def sync_total() -> None:
        bare_sync.get(url)

    def ours_sync_total() -> None:
        ours_sync.get(url)

    ms = f"{limit * 1000:g} ms"
    try:
        return [
            bench.compare_async(
                "firing: scope vs asyncio.timeout",
                (f"asyncio.timeout({limit:g})", f"deadlines.scope({limit:g})"),
                (sleep_asyncio, sleep_scope),
                limit,
            ),
            bench.compare_async(
                "firing: httpx total, silent server",
                (f"httpx Timeout({limit:g})", f"deadlines.httpx, total={ms}"),
                (httpx_total, ours_total),
                limit,
            ),
            bench.compare_async(
                "firing: httpx in a deadline, silent",
                ("asyncio.timeout around httpx", "deadlines.scope around deadlines.httpx"),
                (httpx_in_timeout, ours_in_scope),
                limit,
            ),
            bench.compare_async(
                "firing: aiohttp total, silent server",
                (f"aiohttp ClientTimeout(total={limit:g})", f"deadlines.aiohttp, total={ms}"),
                (aiohttp_total, ours_aiohttp_total),
                limit,
            ),
            bench.compare_async(
                "firing: aiohttp in a deadline, silent",
                ("asyncio.timeout around aiohttp", "deadlines.scope around deadlines.aiohttp"),
                (aiohttp_in_timeout, ours_aiohttp_in_scope),
                limit,
            ),
            bench.compare_blocking(
                "firing: httpx blocking total, silent",
                (f"httpx.Client Timeout({limit:g})", f"deadlines.httpx.Client, total={ms}"),
                (sync_total, ours_sync_total),
                limit,
            ),
        ]
    finally:

        async def close() -> None:
            for client in (bare_httpx, open_httpx, ours_httpx, ours_httpx_total):
                await client.aclose()
            for session in (bare_aio, open_aio, ours_aio_total, ours_aio):
                await session.close()

        loop.run_until_complete(close())
        bare_sync.close()
        ours_sync.close()


def measure(limits: list[float], samples: int) -> list[Comparison]:
    """Every comparison at every limit, `samples` per side."""
    loop = asyncio.new_event_loop()
    try:
        with Child("servers.py", "silent") as silent:
            bench = Bench(loop, f"http://127.0.0.1:{silent.port}/", samples)
            return [row for limit in limits for row in rows_for(bench, limit)]
    finally:
        loop.close()


def run(quick: bool) -> list[Comparison]:
    """Lateness of a 50 ms limit, 200 calls per side (20 when quick): run.py's suite."""
    return measure([0.05], 20 if quick else 200)


def main(argv: list[str] | None = None) -> int:
    """Measure the limits given; print the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--limits", type=float, nargs="+", default=[0.05], help="seconds")
    parser.add_argument("--samples", type=int, default=200, help="per side and limit")
    args = parser.parse_args(argv)
    if any(limit <= 0 for limit in args.limits) or args.samples < 10:
        parser.error("limits must be > 0 and --samples at least 10")
    print(table(measure(args.limits, args.samples)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
