"""An LLM answer streamed under its three limits: first token, idle gap, total.

    pip install 'deadlines[aiohttp,httpx]'
    python examples/services/llm_stream.py --port 8005

    curl localhost:8005/chat?primary=ok        # the primary's tokens
    curl localhost:8005/chat?primary=silent    # no first token in 0.5 s: the backup answers
    curl localhost:8005/chat?primary=stall     # stops mid-answer: idle limit, partial answer
    curl localhost:8005/chat?primary=trickle   # never ends: the total limit cuts it

GET /chat relays a provider's token stream (``/provider/{mode}`` on this same service
plays the providers) through ``deadlines.streams.failover``: a provider that has not
started within ``first`` is abandoned for the backup with the same prompt; after the
first token there is no fail-over, and ``idle`` and ``total`` end the answer. Every
stream that ends early is closed, so the provider stops generating (and billing).
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator

from aiohttp import web

import deadlines
import deadlines.httpx
from deadlines import streams

LLM = deadlines.Dependency("llm", connect=0.5, headers=2.0, idle=10.0, total=60.0)
CLIENT = web.AppKey("client", deadlines.httpx.AsyncClient)
# Seconds before each token, per mode: "ok" answers, the others misbehave.
DELAYS = {
    "ok": [0.05] * 5,
    "silent": [30.0],
    "stall": [0.05, 0.05, 30.0],
    "trickle": [0.2] * 1000,
}


async def provider(request: web.Request) -> web.StreamResponse:
    """A fake provider: one token a line, paced by its mode."""
    mode = request.match_info["mode"]
    response = web.StreamResponse(headers={"Content-Type": "text/plain"})
    await response.prepare(request)
    for index, delay in enumerate(DELAYS[mode]):
        await asyncio.sleep(delay)
        await response.write(f"{mode}-{index}\n".encode())
    await response.write_eof()
    return response


async def tokens(client: deadlines.httpx.AsyncClient, url: str) -> AsyncIterator[str]:
    """A provider's tokens as they arrive."""
    async with client.stream("GET", url) as response:
        async for line in response.aiter_lines():
            if line:
                yield line


async def chat(request: web.Request) -> web.Response:
    """Relay the answer of the first provider that starts; say how it ended."""
    client, base = request.app[CLIENT], f"http://{request.host}/provider"
    primary = request.query.get("primary", "ok")
    answer: list[str] = []
    ended = "complete"
    try:
        async for token in streams.failover(
            {
                "primary": lambda: tokens(client, f"{base}/{primary}"),
                "backup": lambda: tokens(client, f"{base}/ok"),
            },
            first=0.5,
            idle=0.5,
            total=2.0,
        ):
            answer.append(token)
    except (deadlines.StreamIdleTimeout, deadlines.TotalTimeout) as exc:
        ended = type(exc).__name__  # the user keeps the part already shown
    return web.json_response({"answer": answer, "ended": ended})


def make_app() -> web.Application:
    """The relay and the fake providers."""
    app = web.Application()
    app.router.add_get("/chat", chat)
    app.router.add_get("/provider/{mode}", provider)

    async def client(app: web.Application):  # type: ignore[no-untyped-def]
        async with deadlines.httpx.AsyncClient(LLM) as http:
            app[CLIENT] = http
            yield

    app.cleanup_ctx.append(client)
    return app


def main() -> None:
    """Serve on loopback until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8005)
    args = parser.parse_args()
    web.run_app(make_app(), host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
