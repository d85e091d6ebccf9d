"""The clients of experiment `defaults`, all cases at once, in their own process.

    python -m deadlines.lab.defaults.clients CASES_JSON

Prints ``READY {}``, starts every case (each `delay` s after the start: staggered, so
that limits do not all fire in the same instant and contend for the GIL), and prints one line
``CASE {json}`` per case as it ends. A case that never ends prints nothing: the lab
reports it as still waiting at its cap and then kills this process, which is the only
way to stop a blocked `requests` or `urllib` call.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any
from urllib.parse import urlsplit

from .._app import READY
from . import ROUNDED_TOTAL

#: (client, setup) pairs that run in a thread of their own (blocking clients).
SYNC = {("requests", "no options"), ("requests", "timeout"), ("urllib", "no options"),
        ("urllib", "timeout"), ("requests", "executor")}  # fmt: skip
WORKER_RUNNING = "waiter stopped, worker still running"

_OPEN_STATES = {"01", "02", "08"}  # ESTABLISHED, SYN_SENT, CLOSE_WAIT: still ours to close
_print_lock = threading.Lock()


def _own_socket_inodes() -> set[str]:
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def open_connections(port: int) -> int | None:
    """This process's TCP sockets to loopback `port` not yet closed; None off Linux."""
    if not os.path.exists("/proc/net/tcp"):
        return None
    mine = _own_socket_inodes()
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                lines = fh.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            remote_port = int(fields[2].rsplit(":", 1)[1], 16)
            if remote_port == port and fields[3] in _OPEN_STATES and fields[9] in mine:
                count += 1
    return count


def _sync_call(key: str, client: str, url: str, limit: float) -> str:
    if client == "requests":
        import requests

        if key == "executor":
            pool = ThreadPoolExecutor(max_workers=1)
            future: Future[Any] = pool.submit(requests.get, url)
            try:
                # Shows that the worker is left running.
                future.result(timeout=limit)  # deadlines: ignore[DLN103]
            except FutureTimeout:
                pool.shutdown(wait=False)
                if future.running():
                    return WORKER_RUNNING
                raise
            return "answered"
        requests.get(url, timeout=limit if key == "timeout" else None)
        return "answered"
    if key == "timeout":
        urllib.request.urlopen(url, timeout=limit).read()
    else:
        urllib.request.urlopen(url).read()  # deadlines: ignore[DLN101] no options
    return "answered"


Call = Callable[[], Awaitable[None]]


def _prepare_httpx(case: dict[str, Any]) -> tuple[Call, Call]:
    import httpx

    key, url, limit = case["key"], case["url"], case["limit"]
    # The cases show what per-phase limits do: DLN109's findings, on purpose.
    if key == "no options":  # httpx's default: Timeout(5.0), each read its own 5 s
        hc = httpx.AsyncClient()  # deadlines: ignore[DLN109]
    elif key == "timeout":
        hc = httpx.AsyncClient(timeout=httpx.Timeout(limit))  # deadlines: ignore[DLN109]
    elif key == "pool":
        hc = httpx.AsyncClient(  # deadlines: ignore[DLN109]
            timeout=httpx.Timeout(limit), limits=httpx.Limits(max_connections=1)
        )
    else:  # the limit is around the call (wait_for, fail_after)
        hc = httpx.AsyncClient(timeout=None)  # deadlines: ignore[DLN101]

    async def call_httpx() -> None:
        if key == "wait_for":
            await asyncio.wait_for(hc.get(url), limit)
        elif key == "fail_after":
            import anyio

            with anyio.fail_after(limit):
                await hc.get(url)
        elif key == "pool":
            await _behind_a_hung_call(case, hc)
        else:
            await hc.get(url)

    return call_httpx, hc.aclose


async def _behind_a_hung_call(case: dict[str, Any], hc: Any) -> None:
    """A call whose pool of one is held by another call until that one's read timeout.

    The measured call starts `limit`/4 after the first one (noted in the case as
    ``measured_from``), waits for the pool until the first one gives up, then for its
    own answer: both limits add up.
    """
    import httpx

    async def hog() -> None:
        with contextlib.suppress(httpx.TimeoutException):
            await hc.get(case["url"])

    first = asyncio.create_task(hog())
    await asyncio.sleep(case["limit"] / 4)
    case["measured_from"] = time.monotonic()
    try:
        await hc.get(case["url"])
    finally:
        await first


async def _prepare(case: dict[str, Any]) -> tuple[Call, Call]:
    """Build the client first (TLS contexts are slow to make); return (call, close)."""
    client, key, url, limit = case["client"], case["key"], case["url"], case["limit"]
    if client == "httpx":
        return _prepare_httpx(case)
    if client == "aiohttp":
        import aiohttp

        kwargs: dict[str, Any] = {}
        if key == "timeout":
            kwargs["timeout"] = aiohttp.ClientTimeout(total=limit + 0.3)
        elif key == "sock_read":  # no total: aiohttp's ClientTimeout fields default to None
            kwargs["timeout"] = aiohttp.ClientTimeout(sock_read=limit)  # deadlines: ignore[DLN101]
        elif key == "total_rounded":  # over 5 s, aiohttp rounds its deadline up to a whole second
            kwargs["timeout"] = aiohttp.ClientTimeout(total=ROUNDED_TOTAL)
        session = aiohttp.ClientSession(**kwargs)

        async def call_aiohttp() -> None:
            async with session.get(url) as resp:
                await resp.read()

        return call_aiohttp, session.close
    import deadlines
    from deadlines.httpx import AsyncClient

    dc = AsyncClient(deadlines.Dependency("lab"))

    async def call_deadlines() -> None:
        if key == "scope":
            async with deadlines.scope(limit):
                await dc.get(url)
        else:
            await dc.get(url)

    return call_deadlines, dc.aclose


def print_row(
    case: dict[str, Any], elapsed: float, outcome: str, error: BaseException | None
) -> None:
    """Print the case's row; `elapsed` (s) was taken when the call returned or raised.

    Runs in a thread (it sleeps): a row that waited there for a free worker must not
    count that wait as the call's.
    """
    time.sleep(0.2)  # let a close that the client started reach the kernel
    port = urlsplit(case["url"]).port
    still_open = open_connections(port) if port else None
    row = {
        "client": case["client"],
        "setup": case["setup"],
        "server": case["server"],
        "outcome": outcome,
        "error": None if error is None else _describe(error),
        "elapsed_ms": round(elapsed * 1000.0, 1),
        "connection_closed": None if still_open is None else still_open == 0,
    }
    with _print_lock:
        print("CASE " + json.dumps(row), flush=True)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if len(text) > 90:
        text = text[:87] + "..."
    name = f"{type(exc).__module__.split('.')[0]}.{type(exc).__name__}"
    return f"{name}: {text}" if text else name


def _run_sync(case: dict[str, Any], go: threading.Event) -> None:
    go.wait()
    time.sleep(case["delay"])
    start = time.monotonic()
    try:
        outcome = _sync_call(case["key"], case["client"], case["url"], case["limit"])
    except Exception as exc:
        print_row(case, time.monotonic() - start, "error", exc)
    else:
        print_row(case, time.monotonic() - start, outcome, None)


async def _run_async(case: dict[str, Any], call: Call, close: Call) -> None:
    await asyncio.sleep(case["delay"])
    start = time.monotonic()
    error: BaseException | None = None
    outcome = "answered"
    try:
        await call()
    except Exception as exc:
        outcome, error = "error", exc
    start = case.get("measured_from", start)
    elapsed = time.monotonic() - start
    # Look at the socket before closing the client: what did the call itself leave open?
    await asyncio.to_thread(print_row, case, elapsed, outcome, error)
    with contextlib.suppress(Exception):
        await close()


async def _main(cases: list[dict[str, Any]]) -> None:
    parent = os.getppid()
    # Import and build the clients first, so no case pays for that inside its timing.
    import aiohttp  # noqa: F401
    import httpx  # noqa: F401
    import requests  # noqa: F401

    go = threading.Event()
    prepared = []
    for case in cases:
        if (case["client"], case["key"]) in SYNC:
            threading.Thread(target=_run_sync, args=(case, go), daemon=True).start()
        else:
            prepared.append((case, *await _prepare(case)))
    print(READY + "{}", flush=True)
    go.set()
    await asyncio.gather(*(_run_async(case, call, close) for case, call, close in prepared))
    # Stay until the lab stops us (threads may still wait), or until it is gone.
    while os.getppid() == parent:
        await asyncio.sleep(0.5)


def main(argv: list[str] | None = None) -> None:
    """Run the cases given as JSON (a list of {client, setup, server, url, limit})."""
    args = sys.argv[1:] if argv is None else argv
    cases = json.loads(args[0])
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(cases))
    os._exit(0)  # blocked client threads cannot be joined; end the process as it is


if __name__ == "__main__":
    main()
