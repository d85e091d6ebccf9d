"""Which timer should cancel a scope: `asyncio.timeout_at` or the shared heap of `_alarms`?

    python benchmarks/timers.py                      # 200,000 scopes; 10,000 expiring together
    python benchmarks/timers.py --scopes 50000 --together 2000 --rounds 3

Two counts, each for both timers, in the same process and alternated by round:

- per-scope cost: a task enters and leaves a block whose deadline is far (what nearly
  every request and call does), in ns per block;
- delivery: `--together` tasks each wait in a block that expires at the same instant;
  how late each task has its `TimeoutError`, in ms (p50 and p99). That is what an
  overloaded service meets when a burst of requests runs out together.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from harness import quantile

from deadlines import _alarms

Timer = Callable[[float], AbstractAsyncContextManager[object]]
TIMERS: dict[str, Timer] = {
    "asyncio.timeout_at": asyncio.timeout_at,
    "_alarms.Timeout": _alarms.Timeout,
}


async def per_scope_ns(timer: Timer, scopes: int) -> float:
    """ns per block entered and left long before its deadline."""
    loop = asyncio.get_running_loop()
    far = loop.time() + 3600.0
    start = time.perf_counter_ns()
    for _ in range(scopes):
        async with timer(far):
            pass
    return (time.perf_counter_ns() - start) / scopes


async def delivery_ms(timer: Timer, together: int) -> list[float]:
    """How late (ms) each of `together` blocks expiring at one instant saw its TimeoutError."""
    loop = asyncio.get_running_loop()
    at = loop.time() + 0.2 + together * 20e-6  # room for the tasks to start first
    late: list[float] = []

    async def wait() -> None:
        try:
            async with timer(at):
                await asyncio.sleep(3600)
        except TimeoutError:
            late.append((loop.time() - at) * 1000)

    await asyncio.gather(*(wait() for _ in range(together)))
    if len(late) != together:
        raise AssertionError(f"{together - len(late)} blocks did not time out")
    return late


async def main(scopes: int, together: int, rounds: int) -> None:
    cost: dict[str, list[float]] = {name: [] for name in TIMERS}
    late: dict[str, list[float]] = {name: [] for name in TIMERS}
    for turn in range(rounds):
        names = list(TIMERS) if turn % 2 == 0 else list(reversed(TIMERS))
        for name in names:
            cost[name].append(await per_scope_ns(TIMERS[name], scopes))
            late[name].extend(await delivery_ms(TIMERS[name], together))
    print(f"{scopes} scopes x {rounds} rounds; {together} expiring together x {rounds} rounds")
    print(f"{'timer':<20} {'ns/scope':>9} {'late p50 ms':>12} {'late p99 ms':>12}")
    for name in TIMERS:
        ns = quantile(cost[name], 0.5)
        p50, p99 = quantile(late[name], 0.5), quantile(late[name], 0.99)
        print(f"{name:<20} {ns:>9.0f} {p50:>12.1f} {p99:>12.1f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scopes", type=int, default=200_000)
    parser.add_argument("--together", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.scopes, args.together, args.rounds))
