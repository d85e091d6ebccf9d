"""Latency of a route that awaits 1 ms of I/O, at a fixed rate below capacity.

    python benchmarks/latency.py                   # 8 rounds x 1,000 requests at 200/s each
    python benchmarks/latency.py --rate 300 --requests 2000 --rounds 4

Five uvicorn servers (`servers.py`): the Starlette ``/io`` route bare and with
`DeadlineMiddleware`, the FastAPI ``/io/items/42`` route bare and with it, and a second
bare Starlette server, the control: its ratio to the first (A/A) shows how far a run
can tell two servers apart. Each round
sends every server, in turn and in a rotating order, `--requests` requests at `--rate`
per second on a fixed schedule (open loop: a request that waits for a connection counts
that wait), from this process over keep-alive connections on loopback. A request's
latency is from its scheduled instant to the end of its answer. The goal: p50 and p99
with the middleware at most 1.02x those of the same route bare, measured side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Child, quantile

GOAL = 1.02
SERVERS = {
    "Starlette /io, bare": (("starlette",), "/io"),
    "Starlette /io, bare again (A/A)": (("starlette",), "/io"),
    "Starlette /io + DeadlineMiddleware": (("starlette", "--deadlines"), "/io"),
    "FastAPI /io, bare": (("fastapi",), "/io/items/42?q=x"),
    "FastAPI /io + DeadlineMiddleware": (("fastapi", "--deadlines"), "/io/items/42?q=x"),
}
_LENGTH = re.compile(rb"content-length: *(\d+)", re.IGNORECASE)


class _Connection:
    """One keep-alive HTTP/1.1 connection that sends a request and reads its answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def exchange(self, request: bytes) -> None:
        self.writer.write(request)
        head = await self.reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"answered {head[:40]!r}")
        length = _LENGTH.search(head)
        if length is None:
            raise RuntimeError(f"no Content-Length in {head!r}")
        await self.reader.readexactly(int(length.group(1)))


async def _round(port: int, path: str, requests: int, rate: float) -> list[float]:
    """Latencies (ms) of `requests` requests sent at `rate` per second on a schedule."""
    request = (f"GET {path} HTTP/1.1\r\nHost: bench\r\nx-request-timeout-ms: 2000\r\n\r\n").encode()
    idle: list[_Connection] = []
    opened: list[_Connection] = []
    latencies: list[float] = []
    loop = asyncio.get_running_loop()

    async def one(due: float) -> None:
        conn = idle.pop() if idle else None
        if conn is None:
            conn = _Connection(*await asyncio.open_connection("127.0.0.1", port))
            opened.append(conn)
        await conn.exchange(request)
        latencies.append((loop.time() - due) * 1000)
        idle.append(conn)

    # Warm the connections the rate needs, so that opening them is not measured.
    for _ in range(4):
        conn = _Connection(*await asyncio.open_connection("127.0.0.1", port))
        await conn.exchange(request)
        opened.append(conn)
        idle.append(conn)
    start = loop.time() + 0.05
    tasks = []
    for i in range(requests):
        due = start + i / rate
        await asyncio.sleep(max(0.0, due - loop.time()))
        tasks.append(asyncio.create_task(one(due)))
    await asyncio.gather(*tasks)
    for conn in opened:
        conn.writer.close()
    return latencies


async def _run(
    ports: dict[str, tuple[int, str]], rounds: int, requests: int, rate: float
) -> dict[str, list[float]]:
    seen: dict[str, list[float]] = {label: [] for label in ports}
    labels = list(ports)
    for turn in range(rounds):
        order = labels[turn % len(labels) :] + labels[: turn % len(labels)]
        for label in order:
            port, path = ports[label]
            seen[label] += await _round(port, path, requests, rate)
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=200.0, help="requests per second")
    parser.add_argument("--requests", type=int, default=1000, help="per server and round")
    parser.add_argument("--rounds", type=int, default=8)
    options = parser.parse_args()
    children = {label: Child("servers.py", *args) for label, (args, _) in SERVERS.items()}
    try:
        ports = {}
        for label, child in children.items():
            child.__enter__()
            ports[label] = (child.port, SERVERS[label][1])
        seen = asyncio.run(_run(ports, options.rounds, options.requests, options.rate))
    finally:
        for child in children.values():
            child.stop()
    print(
        f"{options.rounds} rounds x {options.requests} requests at {options.rate:.0f}/s per server"
    )
    print(f"{'server':36} {'p50 ms':>7} {'p99 ms':>7} {'p50 x':>6} {'p99 x':>6}")
    for label, values in seen.items():
        base = seen[label.split(",")[0].split(" + ")[0] + ", bare"]
        p50, p99 = quantile(values, 0.5), quantile(values, 0.99)
        r50, r99 = p50 / quantile(base, 0.5), p99 / quantile(base, 0.99)
        met = "" if ", bare" in label else ("  met" if max(r50, r99) <= GOAL else "  missed")
        print(f"{label:36} {p50:7.2f} {p99:7.2f} {r50:6.3f} {r99:6.3f}{met}")


if __name__ == "__main__":
    main()
