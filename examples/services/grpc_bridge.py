"""An HTTP hop bridged to a gRPC hop: one deadline, from a header to grpc-timeout and back.

    pip install 'deadlines[aiohttp,grpc]'
    python examples/services/grpc_bridge.py --port 8003        # HTTP on 8003, gRPC on 8004

    curl -H 'x-request-timeout-ms: 900' localhost:8003/quote/ACME            # 200
    curl -H 'x-request-timeout-ms: 300' 'localhost:8003/quote/ACME?delay=1'  # 504

The HTTP service (aiohttp.web) calls ``/quotes.Quotes/Get`` on the gRPC service through
``deadlines.grpc.client_interceptors``: the time left goes out as the call's
``grpc-timeout``, the gRPC service runs under it (``DeadlineInterceptor``) and says how
much it had. Past the deadline the HTTP caller gets a 504 and the gRPC handler is cancelled.
No protobuf: the messages are raw bytes.
"""

from __future__ import annotations

import argparse
import asyncio
import json

import grpc
from aiohttp import web

import deadlines
import deadlines.grpc
from deadlines.aiohttp_web import DeadlineMiddleware

QUOTES = deadlines.Dependency("quotes", connect=0.5, total=2.0)
METHOD = "/quotes.Quotes/Get"
CHANNEL = web.AppKey("channel", grpc.aio.Channel)


async def get_quote(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    """The gRPC handler: a quote, and the budget it was given."""
    query = json.loads(request)
    await asyncio.sleep(query.get("delay", 0.0))  # cancelled at the caller's deadline
    answer = {"symbol": query["symbol"], "price": 42.0, "grpc_left": deadlines.remaining()}
    return json.dumps(answer).encode()


async def quote(request: web.Request) -> web.Response:
    """The HTTP handler: ask the gRPC service within what is left."""
    query = {"symbol": request.match_info["symbol"], "delay": float(request.query.get("delay", 0))}
    call = request.app[CHANNEL].unary_unary(METHOD)
    answer = json.loads(await call(json.dumps(query).encode()))
    return web.json_response({**answer, "http_left": deadlines.remaining()})


async def serve(port: int) -> None:
    """Run the gRPC service on port+1 and the HTTP service on port until cancelled."""
    server = grpc.aio.server(
        interceptors=[deadlines.grpc.DeadlineInterceptor(default=1, maximum=5)]
    )
    handler = grpc.unary_unary_rpc_method_handler(get_quote)
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("quotes.Quotes", {"Get": handler})]
    )
    server.add_insecure_port(f"127.0.0.1:{port + 1}")
    await server.start()
    channel = grpc.aio.insecure_channel(
        f"127.0.0.1:{port + 1}", interceptors=deadlines.grpc.client_interceptors(dependency=QUOTES)
    )
    app = web.Application(middlewares=[DeadlineMiddleware(default=2.0, maximum=10.0)])
    app[CHANNEL] = channel
    app.router.add_get("/quote/{symbol}", quote)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print(f"HTTP on 127.0.0.1:{port}, gRPC on 127.0.0.1:{port + 1}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
        await channel.close()
        await server.stop(0)


def main() -> None:
    """Serve both hops on loopback until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8003)
    args = parser.parse_args()
    asyncio.run(serve(args.port))


if __name__ == "__main__":
    main()
