"""An aiohttp.web service calling a dependency with deadlines.aiohttp, in one budget.

    pip install 'deadlines[aiohttp]'
    python examples/services/aiohttp_service.py --port 8001

    curl -H 'x-request-timeout-ms: 1000' localhost:8001/home                 # 200
    curl 'localhost:8001/home?slow=1'                                        # 200, no recs

GET /home asks GET /recs (this same service stands in for the recommendations service)
and renders without them if they do not come within their limit: an optional call
never costs the page its deadline. GET /recs?slow=1 never answers in time.
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
from aiohttp import web

import deadlines
import deadlines.aiohttp
import deadlines.fallback
from deadlines.aiohttp_web import DeadlineMiddleware

RECS = deadlines.Dependency("recs", connect=0.3, headers=0.3, total=0.5)
SESSION = web.AppKey("session", aiohttp.ClientSession)


@deadlines.fallback.returning([], limit=0.4)  # optional: the page renders without them
async def recommendations(http: aiohttp.ClientSession, url: str) -> list[str]:
    """The recommendations, or [] if they are late."""
    async with http.get(url) as response:
        response.raise_for_status()
        return list((await response.json())["items"])


async def home(request: web.Request) -> web.Response:
    """The page: its own work plus the optional recommendations."""
    slow = request.query.get("slow", "0")
    url = f"http://{request.host}/recs?slow={slow}"
    recs = await recommendations(request.app[SESSION], url)
    return web.json_response({"recs": recs, "left": deadlines.remaining()})


async def recs(request: web.Request) -> web.Response:
    """A recommendations service; with ?slow=1 it never answers in time."""
    if request.query.get("slow") == "1":
        await asyncio.sleep(30)  # cancelled when the caller gives up (the caller left)
    return web.json_response({"items": ["a", "b"]})


def make_app() -> web.Application:
    """The service with its middleware and its client session."""
    app = web.Application(middlewares=[DeadlineMiddleware(default=2.0, maximum=10.0)])
    app.router.add_get("/home", home)
    app.router.add_get("/recs", recs)

    async def session(app: web.Application):  # type: ignore[no-untyped-def]
        async with deadlines.aiohttp.session(RECS) as http:
            app[SESSION] = http
            yield

    app.cleanup_ctx.append(session)
    return app


def main() -> None:
    """Serve on loopback until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args()
    web.run_app(make_app(), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
