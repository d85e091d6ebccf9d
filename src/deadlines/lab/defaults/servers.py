"""The misbehaving servers for experiment `defaults`, one per case, in their own process.

    python -m deadlines.lab.defaults.servers --kinds silent,trickle,... [--interval 1.0]

Announces ``READY {"urls": [...]}`` in the order of `--kinds`.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .._app import serve


def _make(kind: str, interval: float) -> Any:
    from ..servers import SERVERS

    cls: Any = SERVERS[kind]
    if kind in ("trickle", "header-trickle"):
        return cls(interval=interval)
    return cls()


def main(argv: list[str] | None = None) -> None:
    """Start every server, announce their URLs, serve until SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m deadlines.lab.defaults.servers")
    parser.add_argument("--kinds", required=True, help="comma-separated server names")
    parser.add_argument("--interval", type=float, default=1.0, help="trickle: s per byte")
    args = parser.parse_args(argv)
    servers = [_make(kind, args.interval) for kind in args.kinds.split(",")]

    async def setup() -> tuple[dict[str, Any], Callable[[], Awaitable[None]]]:
        # A blackhole checks for 0.2 s that its SYNs are dropped: start them side by side.
        with ThreadPoolExecutor(max_workers=16) as pool:
            list(pool.map(lambda s: s.start(), servers))

        async def cleanup() -> None:
            with ThreadPoolExecutor(max_workers=16) as pool:
                await asyncio.get_running_loop().run_in_executor(
                    None, lambda: list(pool.map(lambda s: s.stop(), servers))
                )

        return {"urls": [s.url for s in servers]}, cleanup

    serve(setup)


if __name__ == "__main__":
    main()
