"""The cascade's API: `/home` (recommendations ∥ price) and `/checkout` (price only).

    python -m deadlines.lab.cascade.api --downstream URL --variant NAME [--pool-size 20]

Both routes call ONE downstream host. The variant decides how:

* ``no_timeout``: one shared aiohttp pool, aiohttp's defaults (5 min total): nothing
  bounds the wait for recommendations;
* ``timeout``: the same shared pool; the recommendations call is limited to
  ``--recs-timeout`` and the page renders without them;
* ``bulkhead``: a separate pool for recommendations, no timeout;
* ``deadlines``: the library — a deadline per request from the inbound middleware,
  a `deadlines.Dependency` (own pool) per downstream endpoint, and a fallback for
  the optional recommendations.

`/_stats` reports the requests in flight per route.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

from .._app import serve

VARIANTS = ("no_timeout", "timeout", "bulkhead", "deadlines")


@dataclass
class Options:
    """What the API was started with."""

    downstream: str
    variant: str
    pool_size: int
    recs_timeout: float
    home_deadline: float
    checkout_deadline: float


class Calls(Protocol):
    """The two downstream calls, as one variant makes them."""

    async def recs(self) -> Any:
        """Recommendations, or None when the page renders without them."""

    async def price(self) -> Any:
        """The price."""

    async def close(self) -> None:
        """Close the pools."""


class RawCalls:
    """The raw-aiohttp variants: shared pool, per-call timeout, or a bulkhead."""

    def __init__(self, opts: Options) -> None:
        """Build the pool(s) the variant asks for."""
        self.opts = opts
        # The raw variants set (or, on purpose, omit) each call's timeout themselves.
        connector = TCPConnector(limit=opts.pool_size, limit_per_host=0)
        self.shared = ClientSession(connector=connector)  # deadlines: ignore[DLN101]
        self.recs_session = self.shared
        if opts.variant == "bulkhead":
            recs_connector = TCPConnector(limit=opts.pool_size, limit_per_host=0)
            self.recs_session = ClientSession(connector=recs_connector)  # deadlines: ignore[DLN101]

    async def recs(self) -> Any:
        """GET /recs; under ``timeout``, give up after `recs_timeout` and render without."""
        url = self.opts.downstream + "/recs"
        if self.opts.variant == "timeout":
            try:
                timeout = ClientTimeout(total=self.opts.recs_timeout)
                async with self.recs_session.get(url, timeout=timeout) as resp:
                    return await resp.json()
            except TimeoutError:
                return None
        async with self.recs_session.get(url) as resp:
            return await resp.json()

    async def price(self) -> Any:
        """GET /price through the shared pool."""
        async with self.shared.get(self.opts.downstream + "/price") as resp:
            return await resp.json()

    async def close(self) -> None:
        """Close the pool(s)."""
        await self.shared.close()
        if self.recs_session is not self.shared:
            await self.recs_session.close()


def build_app(opts: Options, calls: Calls, middlewares: list[Any]) -> web.Application:
    """The aiohttp.web app; in-flight counting wraps everything else."""
    in_flight = {"home": 0, "checkout": 0}
    done = {"home": 0, "checkout": 0}

    @web.middleware
    async def count(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        route = request.path.strip("/")
        if route not in in_flight:
            return await handler(request)
        in_flight[route] += 1
        try:
            return await handler(request)
        finally:
            in_flight[route] -= 1
            done[route] += 1

    async def home(request: web.Request) -> web.Response:
        recs, price = await asyncio.gather(calls.recs(), calls.price())
        return web.json_response({"recs": recs, "price": price})

    async def checkout(request: web.Request) -> web.Response:
        return web.json_response({"price": await calls.price(), "ordered": True})

    async def set_downstream(request: web.Request) -> web.Response:
        opts.downstream = request.query["url"]  # started beside the downstream, linked after
        return web.json_response({"downstream": opts.downstream})

    async def stats(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "home_in_flight": in_flight["home"],
                "checkout_in_flight": in_flight["checkout"],
                "home_done": done["home"],
                "checkout_done": done["checkout"],
            }
        )

    app = web.Application(middlewares=[count, *middlewares])
    app.router.add_get("/home", home)
    app.router.add_get("/checkout", checkout)
    app.router.add_get("/_stats", stats)
    app.router.add_get("/_downstream", set_downstream)
    return app


def _calls_and_middlewares(opts: Options) -> tuple[Calls, list[Any]]:
    if opts.variant == "deadlines":
        from ._deadlines import deadlines_variant

        return deadlines_variant(opts)
    return RawCalls(opts), []


def main(argv: list[str] | None = None) -> None:
    """Serve until SIGTERM; print ``READY {"port": N}`` when listening."""
    parser = argparse.ArgumentParser(prog="python -m deadlines.lab.cascade.api")
    parser.add_argument("--downstream", default="", help="or set later: GET /_downstream?url=")
    parser.add_argument("--variant", choices=VARIANTS, required=True)
    parser.add_argument("--pool-size", type=int, default=20)
    parser.add_argument("--recs-timeout", type=float, default=0.3)
    parser.add_argument("--home-deadline", type=float, default=1.0)
    parser.add_argument("--checkout-deadline", type=float, default=5.0)
    ns = parser.parse_args(argv)
    opts = Options(
        ns.downstream,
        ns.variant,
        ns.pool_size,
        ns.recs_timeout,
        ns.home_deadline,
        ns.checkout_deadline,
    )

    async def setup() -> tuple[dict[str, Any], Callable[[], Awaitable[None]]]:
        calls, middlewares = _calls_and_middlewares(opts)
        runner = web.AppRunner(build_app(opts, calls, middlewares), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=2048, shutdown_timeout=0.2)
        await site.start()
        port = runner.addresses[0][1]

        async def cleanup() -> None:
            await runner.cleanup()
            await calls.close()

        return {"port": port}, cleanup

    serve(setup)


if __name__ == "__main__":
    main()
