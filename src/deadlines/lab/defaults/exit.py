"""A case of experiment `defaults` that needs a process of its own: can it exit?

    python -m deadlines.lab.defaults.exit CASES_JSON       # a list of one case

A blocking call is awaited through a thread (``asyncio.to_thread``, or
``loop.run_in_executor`` with a ``ThreadPoolExecutor``) under ``asyncio.wait_for``. The
waiter gives up at the limit and the line ``CASE {json}`` reports it; then the program
returns from ``asyncio.run``, as a real one would, and the lab watches whether the
process exits. It cannot while the thread still waits: ``asyncio.run`` and the
executor both join their threads on the way out.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .._app import READY
from .clients import print_row

#: The outcome of a case whose waiter gave up on time (the lab adds whether it exited).
WAITER_STOPPED = "waiter stopped"


def _watch_parent(parent: int) -> None:
    # The lab gone without cleanup: end at once (the blocked thread cannot be joined).
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(0)


async def _wait(case: dict[str, Any]) -> None:
    import requests

    url, limit = case["url"], case["limit"]
    start = time.monotonic()
    # What the cases show: a timeout around a thread stops the waiter, not the thread.
    if case["key"] == "to_thread":
        work = asyncio.to_thread(requests.get, url)
        try:
            await asyncio.wait_for(work, limit)  # deadlines: ignore[DLN105]
        except TimeoutError as exc:
            print_row(case, time.monotonic() - start, WAITER_STOPPED, exc)
            return  # asyncio.run then joins the default executor's thread
    else:
        with ThreadPoolExecutor(max_workers=1) as pool:
            future = asyncio.get_running_loop().run_in_executor(pool, requests.get, url)
            try:
                await asyncio.wait_for(future, limit)  # deadlines: ignore[DLN105]
            except TimeoutError as exc:
                print_row(case, time.monotonic() - start, WAITER_STOPPED, exc)
                return  # leaving the block joins the pool's thread
    print_row(case, time.monotonic() - start, "answered", None)


def main(argv: list[str] | None = None) -> None:
    """Run the one case given as JSON, then try to exit."""
    args = sys.argv[1:] if argv is None else argv
    [case] = json.loads(args[0])
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    import requests  # noqa: F401  (imported before the timing starts)

    print(READY + "{}", flush=True)
    time.sleep(case["delay"])
    asyncio.run(_wait(case))


if __name__ == "__main__":
    main()
