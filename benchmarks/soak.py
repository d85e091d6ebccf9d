"""Soak: an API behind the inbound middleware, its one dependency hung, for minutes.

    python benchmarks/soak.py                 # 5 minutes per client, then recovery
    python benchmarks/soak.py --minutes 60    # longer
    python benchmarks/soak.py --quick         # 20 s per client (the test suite runs it)
    python benchmarks/soak.py --json out.json

Each client in turn (``deadlines.httpx``, then ``deadlines.aiohttp``): a Starlette API
under uvicorn, `DeadlineMiddleware` with a 0.3 s route budget, whose only route calls a
dependency that accepts, reads and never answers, through a pool of 20. Open-loop load
at 200 requests per second (each leaves on schedule, whatever the API does). Every
request's deadline cuts a call in flight, and the caller's timer and the call's own
limit come from the same deadline: the interleaving that leaked connections.

Sampled every second, from outside the API process: requests in flight (the API's own
count, against Little's bound rate x budget), its resident memory, its file
descriptors and its sockets to the dependency (from /proc). Then the load stops, and
within a second the sockets to the dependency must be gone and the descriptors back
to where they started. Last, recovery: load again for 10 s, the dependency heals 3 s
in, and every request that starts after that must succeed within 2 s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Bounded, Child, Row, Summary, rss_mb, table

from deadlines.lab.load import run_open_loop

RATE = 200.0  # requests per second
BUDGET = 0.3  # the route's deadline, seconds
POOL = 20  # the dependency's pool
RECOVERY_RUN, HEAL_AT, RECOVERY_GOAL = 10.0, 3.0, 2.0
_OPEN_STATES = {"01", "02", "08"}  # ESTABLISHED, SYN_SENT, CLOSE_WAIT: not yet closed


def sockets_to(pid: int, port: int) -> int:
    """Process `pid`'s TCP sockets to loopback `port` that are not closed yet."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table_path in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table_path) as fh:
            for line in fh.readlines()[1:]:
                fields = line.split()
                remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                if remote_port == port and fields[3] in _OPEN_STATES and fields[9] in inodes:
                    count += 1
    return count


def fds(pid: int) -> int:
    """Open file descriptors of process `pid`."""
    return len(os.listdir(f"/proc/{pid}/fd"))


def fd_kinds(pid: int) -> Counter[str]:
    """Process `pid`'s descriptors by kind (socket, pipe, anon_inode:[eventpoll], a path)."""
    kinds: Counter[str] = Counter()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            kinds[target.split(":[")[0] if ":[" in target else target] += 1
    return kinds


class Soak:
    """One client's run: the API, its dependency, the load and the samples."""

    def __init__(self, client: str, api: Child, dependency: Child) -> None:
        self.client = client
        self.api = api
        self.dependency = dependency
        self.url = f"http://127.0.0.1:{api.port}"
        self.samples: list[dict[str, float]] = []
        self.statuses: Counter[str] = Counter()

    async def fire(self, session: aiohttp.ClientSession, kind: str, index: int) -> Any:
        """One request to the API; its status, or the error that stood for one."""
        try:
            async with session.get(self.url + "/") as response:
                await response.read()
                self.statuses[str(response.status)] += 1
                return response.status, None
        except (TimeoutError, aiohttp.ClientError) as exc:
            self.statuses[type(exc).__name__] += 1
            return None, type(exc).__name__

    def sample(self, session_t: float, in_flight: int) -> None:
        """Record one sample of the API process."""
        pid, port = self.api.pid, self.dependency.port
        self.samples.append(
            {
                "t": round(session_t, 2),
                "in_flight": in_flight,
                "rss_mb": round(rss_mb(pid), 2),
                "fds": fds(pid),
                "dependency_sockets": sockets_to(pid, port),
            }
        )

    async def sampler(self, control: aiohttp.ClientSession, every: float) -> None:
        """Sample every `every` seconds until cancelled."""
        start = time.monotonic()
        while True:
            async with control.get(self.url + "/_stats") as response:
                stats = await response.json()
            self.sample(time.monotonic() - start, stats["in_flight"])
            await asyncio.sleep(every)

    async def hung(self, duration: float, every: float) -> dict[str, Any]:
        """Load for `duration` s against the hung dependency; then watch it all close."""
        start_fds, start_kinds = await self.baseline()
        async with _sessions() as (load, control):
            sampler = asyncio.create_task(self.sampler(control, every))
            run = await run_open_loop(
                {"get": RATE}, duration, lambda k, i: self.fire(load, k, i), drain=5.0
            )
            sampler.cancel()
            await asyncio.gather(sampler, return_exceptions=True)
            stopped = time.monotonic()
            gone_after = None
            while time.monotonic() - stopped < 3.0:
                if sockets_to(self.api.pid, self.dependency.port) == 0:
                    gone_after = time.monotonic() - stopped
                    break
                await asyncio.sleep(0.02)
        # The load's keep-alive connections to the API are closed now: wait for the API
        # to see them go, then compare its descriptors with the start.
        end_fds = await _settle(lambda: fds(self.api.pid), start_fds, 2.0)
        unanswered = [s for s in run.shots if s.status is None]
        latencies = sorted(s.latency * 1000 for s in run.shots if s.latency is not None)
        return {
            "latency_ms_p50_p99_max": [
                round(latencies[int(q * (len(latencies) - 1))], 1) for q in (0.5, 0.99, 1.0)
            ],
            "load": run.rate_report(),
            "statuses": dict(self.statuses),
            "unanswered": len(unanswered),
            "sockets_gone_after_s": gone_after,
            "fds_start": start_fds,
            "fds_end": end_fds,
            "fds_new": dict(fd_kinds(self.api.pid) - start_kinds),
        }

    async def baseline(self) -> tuple[int, Counter[str]]:
        """The API's descriptors once it has served a request and its caller has left."""
        async with aiohttp.ClientSession() as warm, warm.get(self.url + "/_stats") as answer:
            await answer.read()
        before = -1
        while (now := fds(self.api.pid)) != before:  # steady for 0.2 s
            before = now
            await asyncio.sleep(0.2)
        return now, fd_kinds(self.api.pid)

    async def recovery(self) -> dict[str, Any]:
        """Load for 10 s; heal the dependency 3 s in; when does every request succeed?"""
        async with _sessions() as (load, _):

            async def heal() -> float:
                await asyncio.sleep(HEAL_AT)
                await asyncio.to_thread(self.dependency.ask, {"heal": True}, 5.0)
                return time.monotonic()

            healer = asyncio.create_task(heal())
            start = time.monotonic()  # the load's time zero, within microseconds
            run = await run_open_loop(
                {"get": RATE}, RECOVERY_RUN, lambda k, i: self.fire(load, k, i), drain=5.0
            )
            healed_at = (await healer) - start
        shots = run.shots
        failed_after = [s.started for s in shots if s.started >= healed_at and not s.ok]
        return {
            "healed_at_s": round(healed_at, 3),
            "failures_after_heal": len(failed_after),
            "recovered_after_s": round(max(failed_after) - healed_at, 3) if failed_after else 0.0,
            "ok_after_heal": sum(1 for s in shots if s.started >= healed_at and s.ok),
        }


async def _settle(measure: Any, target: int, timeout: float) -> int:
    """`measure()` once it equals `target`, or its last value after `timeout` s."""
    end = time.monotonic() + timeout
    while (value := measure()) != target and time.monotonic() < end:
        await asyncio.sleep(0.05)
    return int(value)


def _sessions() -> Any:
    class Both:
        async def __aenter__(self) -> tuple[aiohttp.ClientSession, aiohttp.ClientSession]:
            timeout = aiohttp.ClientTimeout(total=5.0)
            self.load = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), timeout=timeout
            )
            self.control = aiohttp.ClientSession(timeout=timeout)
            return self.load, self.control

        async def __aexit__(self, *exc_info: object) -> None:
            await self.load.close()
            await self.control.close()

    return Both()


def soak(client: str, duration: float, every: float) -> list[Row]:
    """One client's hung phase and recovery, as rows."""
    with Child("servers.py", "switch") as dependency:
        dep_url = f"http://127.0.0.1:{dependency.port}/"
        api_args = ["soak", "--client", client, "--dependency", dep_url]
        api_args += ["--budget", str(BUDGET), "--pool-size", str(POOL)]
        with Child("servers.py", *api_args) as api:
            run = Soak(client, api, dependency)
            hung = asyncio.run(run.hung(duration, every))
            recovered = asyncio.run(run.recovery())
    return _rows(client, duration, run.samples, hung, recovered)


def _statuses(statuses: dict[str, int]) -> str:
    """``'12000 x 504'``, most frequent first."""
    ranked = sorted(statuses.items(), key=lambda item: -item[1])
    return ", ".join(f"{count} x {status}" for status, count in ranked) or "none sent"


def _rows(
    client: str,
    duration: float,
    samples: list[dict[str, float]],
    hung: dict[str, Any],
    recovered: dict[str, Any],
) -> list[Row]:
    name = f"soak {client}:"
    during = [s for s in samples if s["t"] <= duration]
    warm = max(1, len(during) // 5)  # the first fifth is warm-up
    rss_after_warmup = during[warm - 1]["rss_mb"]
    notes = {"duration_s": duration, **hung, **recovered, "series": samples}
    gone = hung["sockets_gone_after_s"]
    return [
        Bounded(
            f"{name} in flight",
            "requests in flight",
            Summary.of([s["in_flight"] for s in during]),
            bound=RATE * BUDGET,
            # Little's law bounds the typical count; the max is one sample after the
            # load generator, itself late on a busy machine, catches up in a burst.
            goal=f"p50 <= {RATE:g}/s x {BUDGET:g} s",
            notes=notes,
            held="p50",
        ),
        Bounded(
            f"{name} API resident memory",
            "RSS MiB",
            Summary.of([s["rss_mb"] for s in during[warm:]]),
            bound=round(rss_after_warmup * 1.10, 1),
            goal="flat: <= 1.1 x after warm-up",
        ),
        Bounded(
            f"{name} sockets to the dependency",
            "sockets",
            Summary.of([s["dependency_sockets"] for s in during]),
            bound=POOL,
            goal=f"<= pool_size {POOL}",
        ),
        Bounded(
            f"{name} sockets gone after stop",
            "seconds",
            Summary.of([gone if gone is not None else float("inf")]),
            bound=1.0,
            goal="0 sockets within 1 s",
        ),
        Bounded(
            f"{name} descriptors leaked",
            "fds",
            Summary.of([hung["fds_end"] - hung["fds_start"]]),
            bound=0.0,
            goal="back to the start",
        ),
        Bounded(
            f"{name} requests unanswered",
            "requests",
            Summary.of([hung["unanswered"]]),
            bound=0.0,
            goal=f"every request answered ({_statuses(hung['statuses'])})",
            notes={"statuses": hung["statuses"]},
        ),
        Bounded(
            f"{name} recovery after healing",
            "seconds",
            Summary.of([recovered["recovered_after_s"]]),
            bound=RECOVERY_GOAL,
            goal=f"full goodput within {RECOVERY_GOAL:g} s",
        ),
    ]


def run(quick: bool, minutes: float = 5.0) -> list[Row]:
    """Both clients: 20 s each when quick, else `minutes` each."""
    duration = 20.0 if quick else minutes * 60.0
    rows: list[Row] = []
    for client in ("httpx", "aiohttp"):
        print(f"[soak] {client}: {duration:g} s hung, then recovery", file=sys.stderr)
        rows += soak(client, duration, every=1.0)
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the soak; print the table (and write JSON); 1 if a bound was broken."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 s per client")
    parser.add_argument("--minutes", type=float, default=5.0, help="per client (default 5)")
    parser.add_argument("--json", type=Path, help="write the rows to this file")
    args = parser.parse_args(argv)
    if args.minutes <= 0:
        parser.error("--minutes must be > 0")
    rows = run(args.quick, args.minutes)
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([r.to_json() for r in rows], indent=2))
    return 0 if all(isinstance(r, Bounded) and r.passed for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
