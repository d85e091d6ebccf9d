"""Memory held per in-flight call hung on a silent server, with and without `deadlines`.

Each measurement is a fresh process (``python benchmarks/memory.py KIND URL N``) that
warms its client up, takes its resident memory, starts N calls to the `silent` server
(benchmarks/servers.py), waits until the server holds all N requests, and takes it
again: (after - before) / N. Bare clients use their own timeout; `deadlines` clients
run each call inside its own `deadlines.scope`, as a request handler would. Kinds
alternate across rounds in fresh processes, so no side inherits the other's heap.
"""

from __future__ import annotations

import asyncio
import gc
import json
import statistics
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Child, Comparison, Summary, rss_mb

KINDS = ("httpx", "deadlines.httpx", "aiohttp", "deadlines.aiohttp")
Get = Callable[[str], Coroutine[Any, Any, Any]]
LIMIT = 120.0  # seconds: no call ends by itself while being measured


async def _hung(port: int) -> int:
    """How many requests the silent server holds open."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /_hung HTTP/1.1\r\nHost: bench\r\n\r\n")
    data = await reader.read()
    writer.close()
    return int(data.rsplit(b"\r\n\r\n", 1)[1])


async def _until_hung(port: int, count: int, within: float = 30.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + within
    while (held := await _hung(port)) != count:
        if loop.time() > end:
            raise RuntimeError(f"the silent server holds {held} requests, expected {count}")
        await asyncio.sleep(0.05)


async def _client(kind: str, n: int) -> tuple[Callable[[str], Coroutine[Any, Any, Any]], Any]:
    """A call function and the client to close, for `kind`."""
    import deadlines

    if kind == "httpx":
        import httpx

        bare = httpx.AsyncClient(
            timeout=httpx.Timeout(LIMIT), limits=httpx.Limits(max_connections=n + 10)
        )
        return bare.get, bare.aclose
    if kind == "deadlines.httpx":
        import deadlines.httpx

        dep = deadlines.Dependency("silent", headers=LIMIT, total=LIMIT, pool_size=n + 10)
        ours = deadlines.httpx.AsyncClient(dep)

        async def get(url: str) -> Any:
            async with deadlines.scope(LIMIT):
                return await ours.get(url)

        return get, ours.aclose
    if kind == "aiohttp":
        import aiohttp

        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=n + 10), timeout=aiohttp.ClientTimeout(LIMIT)
        )

        async def aget(url: str) -> Any:
            async with session.get(url) as response:
                return await response.read()

        return aget, session.close
    import deadlines.aiohttp

    dep = deadlines.Dependency("silent", headers=LIMIT, total=LIMIT, pool_size=n + 10)
    our_session = deadlines.aiohttp.session(dep)

    async def dget(url: str) -> Any:
        async with deadlines.scope(LIMIT), our_session.get(url) as response:
            return await response.read()

    return dget, our_session.close


async def _hold(get: Get, url: str, port: int, n: int) -> list[Any]:
    tasks: list[Any] = [asyncio.create_task(get(url)) for _ in range(n)]
    await _until_hung(port, n)
    return tasks


async def _release(tasks: list[Any], port: int) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await _until_hung(port, 0)


async def _measure(kind: str, port: int, n: int) -> dict[str, float]:
    url = f"http://127.0.0.1:{port}/"
    get, close = await _client(kind, n)
    try:
        await _release(await _hold(get, url, port, 20), port)  # warm up code paths
        gc.collect()
        before = rss_mb()
        tasks = await _hold(get, url, port, n)
        gc.collect()
        after = rss_mb()
        await _release(tasks, port)
    finally:
        await close()
    return {"before_mb": before, "after_mb": after, "per_call_kb": (after - before) * 1024 / n}


def _child(argv: list[str]) -> None:
    kind, port, n = argv[0], int(argv[1]), int(argv[2])
    print(json.dumps(asyncio.run(_measure(kind, port, n))), flush=True)


def _one(kind: str, port: int, n: int) -> dict[str, float]:
    import subprocess

    out = subprocess.run(
        [sys.executable, __file__, kind, str(port), str(n)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if out.returncode:
        raise RuntimeError(f"memory child {kind} failed: {out.stderr[-2000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def run(quick: bool) -> list[Comparison]:
    """KiB per hung call, bare vs `deadlines`, for httpx and aiohttp (N = 500; 200 quick)."""
    n, rounds = (200, 1) if quick else (500, 4)
    figures: dict[str, list[dict[str, float]]] = {kind: [] for kind in KINDS}
    with Child("servers.py", "silent") as silent:
        for i in range(rounds):
            for kind in KINDS if i % 2 == 0 else reversed(KINDS):
                figures[kind].append(_one(kind, silent.port, n))
    rows = []
    for lib in ("httpx", "aiohttp"):
        a = [f["per_call_kb"] for f in figures[lib]]
        b = [f["per_call_kb"] for f in figures[f"deadlines.{lib}"]]
        rows.append(
            Comparison(
                f"memory per hung call: {lib}",
                "KiB per call",
                f"{lib}, {n} calls hung",
                f"deadlines.{lib}, each in a scope",
                a=Summary.of(a),
                b=Summary.of(b),
                goal="report",
                notes={
                    "calls": n,
                    "added_kb": round(statistics.median(b) - statistics.median(a), 2),
                    "rss_before_mb": {
                        k: [round(f["before_mb"], 1) for f in v] for k, v in figures.items()
                    },
                },
            )
        )
    return rows


if __name__ == "__main__":
    _child(sys.argv[1:])
