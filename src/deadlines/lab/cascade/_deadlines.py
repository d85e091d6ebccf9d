"""The cascade API's `deadlines` variant: what the library gives a service by default.

* `deadlines.aiohttp_web.DeadlineMiddleware`: every request gets a deadline (the
  header's, or the route default), and is answered 504 when it passes;
* `deadlines.aiohttp.session(Dependency(...))`: one bounded pool per downstream
  endpoint (a bulkhead), every phase limited inside the deadline;
* `deadlines.fallback.call(..., default=None, limit=...)`: the optional
  recommendations get a tight limit, and the page renders without them.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from .api import Calls, Options

_NEEDED = ("deadlines.aiohttp", "deadlines.aiohttp_web", "deadlines.fallback")


def missing() -> str | None:
    """Why the variant cannot run here, or None when it can."""
    absent = [m for m in _NEEDED if importlib.util.find_spec(m) is None]
    return f"waiting for {', '.join(absent)}" if absent else None


class DeadlinesCalls:
    """Recommendations and price through their own `deadlines.aiohttp` sessions."""

    def __init__(self, opts: Options) -> None:
        """One session (pool) per dependency."""
        import deadlines
        import deadlines.aiohttp

        self.opts = opts
        self.recs_session = deadlines.aiohttp.session(
            deadlines.Dependency("recs", pool_size=opts.pool_size)
        )
        self.price_session = deadlines.aiohttp.session(
            deadlines.Dependency("price", pool_size=opts.pool_size)
        )

    async def _get(self, session: Any, path: str) -> Any:
        async with session.get(self.opts.downstream + path) as resp:
            return await resp.json()

    async def recs(self) -> Any:
        """Recommendations within `recs_timeout`, or None (the page renders without)."""
        from deadlines import fallback

        return await fallback.call(
            lambda: self._get(self.recs_session, "/recs"),
            default=None,
            limit=self.opts.recs_timeout,
        )

    async def price(self) -> Any:
        """The price, inside the request's deadline."""
        return await self._get(self.price_session, "/price")

    async def close(self) -> None:
        """Close both pools."""
        await self.recs_session.close()
        await self.price_session.close()


def deadlines_variant(opts: Options) -> tuple[Calls, list[Any]]:
    """The calls and middlewares of the `deadlines` variant."""
    from deadlines.aiohttp_web import DeadlineMiddleware

    middleware = DeadlineMiddleware(default=opts.home_deadline, maximum=opts.checkout_deadline)
    return DeadlinesCalls(opts), [middleware]
