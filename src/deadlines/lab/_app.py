"""What every lab child process shares: announce readiness, stop on signal or orphaning.

An app module's `main` builds its servers inside `serve(...)`, which prints one line,
``READY {json}``, on stdout once every socket listens (the harness waits for it), then
runs until SIGTERM/SIGINT, or until its parent process is gone: a lab run that is
killed outright must not leave servers behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

#: The prefix of the readiness line a child prints on stdout.
READY = "READY "

Setup = Callable[[], Awaitable[tuple[dict[str, Any], Callable[[], Awaitable[None]]]]]


async def _watch_parent(parent: int, stop: asyncio.Event) -> None:
    # Reparenting (to init or a subreaper) means the lab process died without cleanup.
    while not stop.is_set():
        if os.getppid() != parent:
            stop.set()
            return
        await asyncio.sleep(0.5)


async def _serve(setup: Setup) -> None:
    parent = os.getppid()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    info, cleanup = await setup()
    print(READY + json.dumps(info), flush=True)
    watcher = asyncio.create_task(_watch_parent(parent, stop))
    try:
        await stop.wait()
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        await cleanup()


def serve(setup: Setup) -> None:
    """Run `setup` (returns the info to announce and a cleanup) until told to stop."""
    # SIGINT before the handler is installed ends the child quietly.
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(setup))
    sys.stdout.flush()
