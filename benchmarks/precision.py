"""How late does a limit fire? `deadlines.scope` against `asyncio.timeout`."""

from __future__ import annotations

import asyncio
import time

from harness import Comparison, Summary, alternate

import deadlines

LIMIT = 0.05


async def _late_scope() -> float:
    start = time.perf_counter()
    try:
        async with deadlines.scope(LIMIT):
            await asyncio.sleep(10)
    except deadlines.DeadlineExceeded:
        pass
    return (time.perf_counter() - start - LIMIT) * 1000


async def _late_asyncio() -> float:
    start = time.perf_counter()
    try:
        async with asyncio.timeout(LIMIT):
            await asyncio.sleep(10)
    except TimeoutError:
        pass
    return (time.perf_counter() - start - LIMIT) * 1000


def scope_vs_asyncio(reps: int) -> Comparison:
    """Lateness in ms of a 50 ms limit, `reps` times each, alternating."""
    per_round = max(1, reps // 10)

    def batch(fn: object) -> list[float]:
        async def run() -> list[float]:
            return [await fn() for _ in range(per_round)]  # type: ignore[operator]

        return asyncio.run(run())

    a, b = alternate(10, lambda: batch(_late_asyncio), lambda: batch(_late_scope))
    return Comparison(
        name="firing: scope vs asyncio.timeout",
        metric="lateness ms",
        a_label="asyncio.timeout(0.05)",
        b_label="deadlines.scope(0.05)",
        a=Summary.of(a),
        b=Summary.of(b),
        goal="B p99 <= 5 ms",
    )
