"""The cascade's downstream host: `/price` answers in a few ms, `/recs` never answers.

    python -m deadlines.lab.cascade.downstream [--price-ms 5]

`/_stats` reports the connections the API opened (now and the most at once) and the
requests in progress; the lab reads it to show the downstream was never overloaded.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from .._app import serve
from .._http import HttpServer, Request, Response


def _handler(price_s: float, server: list[HttpServer]) -> Callable[[Request], Awaitable[Response]]:
    async def handle(request: Request) -> Response:
        if request.path == "/price":
            await asyncio.sleep(price_s)
            return Response.json({"sku": "42", "price": 9.99})
        if request.path == "/recs":
            await asyncio.Event().wait()  # stopped answering at t=0; ends only on close
        if request.path == "/_stats":
            c = server[0].counters
            return Response.json(
                {
                    "open": c.open,
                    "max_open": c.max_open,
                    "accepted": c.accepted,
                    "requests": c.requests,
                    "in_progress": c.in_progress,
                }
            )
        return Response(404)

    return handle


def main(argv: list[str] | None = None) -> None:
    """Serve until SIGTERM; print ``READY {"port": N}`` when listening."""
    parser = argparse.ArgumentParser(prog="python -m deadlines.lab.cascade.downstream")
    parser.add_argument("--price-ms", type=float, default=5.0)
    args = parser.parse_args(argv)

    async def setup() -> tuple[dict[str, Any], Callable[[], Awaitable[None]]]:
        holder: list[HttpServer] = []
        server = HttpServer(_handler(args.price_ms / 1000.0, holder))
        holder.append(server)
        port = await server.start()
        return {"port": port}, server.close

    serve(setup)


if __name__ == "__main__":
    main()
