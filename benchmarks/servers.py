"""Servers the benchmarks call, each in its own process so it never shares the client's CPU.

    python benchmarks/servers.py fast          # answers every GET at once: 200 "ok"
    python benchmarks/servers.py silent        # reads requests, never answers
    python benchmarks/servers.py starlette [--deadlines]   # uvicorn + a one-route app
    python benchmarks/servers.py fastapi [--deadlines]     # uvicorn + a FastAPI JSON route
    python benchmarks/servers.py starlette --standard      # ... on uvloop and httptools
    python benchmarks/servers.py starlette --reference gzip   # ... with Starlette's GZip
    python benchmarks/servers.py starlette --passthrough      # ... in a do-nothing middleware
    python benchmarks/servers.py switch        # silent until told {"heal": true} on stdin
    python benchmarks/servers.py soak --client httpx --dependency URL   # the soak's API

Each prints ``READY {"port": N}`` (uvicorn's also name the `deadlines` package they
imported, or null) once it listens on 127.0.0.1 and runs until SIGTERM
(or until its parent is gone). `fast` and `silent` are bare asyncio protocols, far
cheaper per request than any client measured against them, so the client is what the
figures measure. `silent` answers one path, ``GET /_hung``, with the number of
connections it holds that sent a request and are still open (the memory benchmark
waits for it). The lab's `deadlines.lab.servers` serve each connection from a thread
that polls every 20 ms: right for tests, too costly with hundreds of hung connections.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import contextvars
import json
import signal
import socket
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import announce, exit_with_parent

# What the ``/io`` routes await: a timer standing in for 1 ms of I/O (the loop waits in
# its selector, as for a socket's answer).
IO_WAIT = 0.001
_OK = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"


def _listen() -> socket.socket:
    # proto given explicitly: asyncio sets TCP_NODELAY on accepted sockets only when
    # their proto is IPPROTO_TCP, and Nagle with delayed ACKs costs 40 ms per answer
    # written in two pieces (uvicorn writes the head and the body separately).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(4096)
    return sock


class _Fast(asyncio.Protocol):
    """Keep-alive HTTP/1.1 for body-less requests: one fixed answer per request head."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.buffer = b""
        sock = transport.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        heads = self.buffer.count(b"\r\n\r\n")
        if heads:
            self.buffer = self.buffer.rsplit(b"\r\n\r\n", 1)[1]
            self.transport.write(_OK * heads)


class _Silent(asyncio.Protocol):
    """Reads and keeps the connection open; answers only ``GET /_hung``."""

    hung: set[_Silent] = set()  # noqa: RUF012 - one server per process

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if b"\r\n\r\n" not in self.buffer:
            return
        if self.buffer.startswith(b"GET /_hung "):
            body = str(len(self.hung)).encode()
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            self.transport.write(head.encode() + body)
            self.transport.close()
            return
        self.hung.add(self)
        self.buffer = b""

    def connection_lost(self, exc: Exception | None) -> None:
        self.hung.discard(self)


class _Switch(asyncio.Protocol):
    """A dependency that hangs (reads, never answers) until healed, then answers at once.

    Healing (``{"heal": true}`` on stdin, answered ``{"healed": N}``) also answers the
    requests already waiting, as a dependency that comes back does.
    """

    healed = False
    waiting: set[_Switch] = set()  # noqa: RUF012 - one server per process

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.pending = 0
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        heads = self.buffer.count(b"\r\n\r\n")
        if heads:
            self.buffer = self.buffer.rsplit(b"\r\n\r\n", 1)[1]
            self.pending += heads
            self.waiting.add(self)
            if _Switch.healed:
                self.answer()

    def answer(self) -> None:
        self.transport.write(_OK * self.pending)
        self.pending = 0
        self.waiting.discard(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.waiting.discard(self)

    @classmethod
    def heal(cls) -> int:
        cls.healed = True
        waiting = list(cls.waiting)
        for protocol in waiting:
            protocol.answer()
        return len(waiting)


def _obey_stdin() -> None:
    """Read ``{"heal": true}`` commands from stdin and answer each with one JSON line."""
    loop = asyncio.get_running_loop()

    def command() -> None:
        line = sys.stdin.readline()
        if not line:
            loop.remove_reader(sys.stdin.fileno())
            return
        if json.loads(line).get("heal"):
            print(json.dumps({"healed": _Switch.heal()}), flush=True)

    loop.add_reader(sys.stdin.fileno(), command)


async def _serve_protocol(factory: Any) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    sock = _listen()
    server = await loop.create_server(factory, sock=sock, backlog=4096)
    if factory is _Switch:
        _obey_stdin()
    announce({"port": sock.getsockname()[1]})
    await stop.wait()
    server.close()


class _Floor:
    """The least a deadline middleware does: a context variable set, `send` watched.

    Pure ASGI, no deadline: the benchmark's floor for any middleware that gives the
    handler its request's deadline and must know whether the response has started.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self.var: contextvars.ContextVar[float] = contextvars.ContextVar("floor")

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started: list[bool] = []

        def watched(message: Any) -> Any:
            if message["type"] == "http.response.start":
                started.append(True)
            return send(message)

        token = self.var.set(2.0)
        try:
            await self.app(scope, receive, watched)
        finally:
            self.var.reset(token)


class _PassThrough:
    """A pure ASGI middleware that only calls the app: what one more layer costs."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app(scope, receive, send)


def _reference(name: str) -> Any:
    """One of Starlette's own pure ASGI middlewares, as many apps run it: what a
    middleware common in production costs on the same app (a yardstick, not a goal)."""
    from starlette.middleware import Middleware

    if name == "trustedhost":
        from starlette.middleware.trustedhost import TrustedHostMiddleware

        return Middleware(TrustedHostMiddleware, allowed_hosts=["bench", "127.0.0.1"])
    from starlette.middleware.gzip import GZipMiddleware

    return Middleware(GZipMiddleware)  # the generator asks for no gzip: passed through


# The names `--reference` takes, and the middleware each stands for.
REFERENCES = {"trustedhost": "TrustedHostMiddleware", "gzip": "GZipMiddleware"}


def starlette_app(
    *,
    with_deadlines: bool,
    watch_after: float | None = None,
    floor: bool = False,
    passthrough: bool = False,
    reference: str | None = None,
) -> Any:
    """``GET /`` → 200 "ok" (and ``GET /io``, the same after `IO_WAIT`); optionally
    wrapped in `DeadlineMiddleware`.

    `floor`: wrapped instead in `_Floor`, the least any such middleware does;
    `passthrough`: in `_PassThrough`, the least any middleware at all does;
    `reference`: in one of Starlette's own middlewares (`REFERENCES`).
    """
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def home(request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    async def io(request: Request) -> PlainTextResponse:
        await asyncio.sleep(IO_WAIT)
        return PlainTextResponse("ok")

    middleware = [Middleware(_Floor)] if floor else []
    if passthrough:
        middleware.append(Middleware(_PassThrough))
    if reference is not None:
        middleware.append(_reference(reference))
    if with_deadlines:
        from deadlines.asgi import DeadlineMiddleware

        options: dict[str, Any] = {} if watch_after is None else {"watch_after": watch_after}
        middleware.append(Middleware(DeadlineMiddleware, default=2.0, maximum=10.0, **options))
    return Starlette(routes=[Route("/", home), Route("/io", io)], middleware=middleware)


def fastapi_app(*, with_deadlines: bool, watch_after: float | None = None) -> Any:
    """``GET /items/{item_id}?q=`` → a validated pydantic model as JSON, as real routes
    do (``/io/items/{item_id}``: the same after `IO_WAIT`)."""
    from fastapi import FastAPI
    from pydantic import BaseModel

    class Item(BaseModel):
        id: int
        name: str
        price: float
        tags: list[str]
        query: str | None = None

    app = FastAPI(openapi_url=None, docs_url=None, redoc_url=None)
    if with_deadlines:
        from deadlines.asgi import DeadlineMiddleware

        options: dict[str, Any] = {} if watch_after is None else {"watch_after": watch_after}
        app.add_middleware(DeadlineMiddleware, default=2.0, maximum=10.0, **options)

    # response_model, not the return annotation: this module's annotations are strings
    # and `Item` is local, out of FastAPI's reach.
    @app.get("/items/{item_id}", response_model=Item)
    async def item(item_id: int, q: str | None = None) -> Any:
        return Item(id=item_id, name=f"item {item_id}", price=9.5, tags=["a", "b"], query=q)

    @app.get("/io/items/{item_id}", response_model=Item)
    async def io_item(item_id: int, q: str | None = None) -> Any:
        await asyncio.sleep(IO_WAIT)
        return Item(id=item_id, name=f"item {item_id}", price=9.5, tags=["a", "b"], query=q)

    return app


def soak_app(*, client: str, dependency: str, budget: float, pool_size: int) -> Any:
    """``GET /`` calls `dependency` through ``deadlines.<client>`` and answers its body.

    Behind `DeadlineMiddleware` with a `budget` s deadline (a 504 when it passes); the
    dependency's pool holds `pool_size` connections. ``GET /_stats`` says how many
    requests are in flight, counted outside the middleware, from arrival to the end of
    the answer.
    """
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    import deadlines
    from deadlines.asgi import DeadlineMiddleware

    dep = deadlines.Dependency("dependency", pool_size=pool_size)
    held: dict[str, Any] = {}

    async def home(request: Request) -> Response:
        if client == "httpx":
            answer = await held["client"].get(dependency)
            return Response(answer.content)
        async with held["client"].get(dependency) as answer:
            return Response(await answer.read())

    async def stats(request: Request) -> JSONResponse:
        return JSONResponse({"in_flight": counter.in_flight})

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> Any:
        if client == "httpx":
            import deadlines.httpx

            async with deadlines.httpx.AsyncClient(dep) as held["client"]:
                yield
        else:
            import deadlines.aiohttp

            async with deadlines.aiohttp.session(dep) as held["client"]:
                yield

    app = Starlette(
        routes=[Route("/", home), Route("/_stats", stats)],
        middleware=[Middleware(DeadlineMiddleware, default=budget, maximum=budget)],
        lifespan=lifespan,
    )
    counter = _InFlight(app)
    return counter


class _InFlight:
    """Counts the HTTP requests between arrival and the end of their answer."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.in_flight = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.in_flight -= 1


def _serve_uvicorn(app: Any, *, standard: bool = False, lifespan: str = "off") -> None:
    """Serve `app` with uvicorn: asyncio and h11, or with `standard` uvloop and httptools
    (what ``uvicorn[standard]`` runs in production)."""
    import uvicorn

    sock = _listen()
    loop, http = ("uvloop", "httptools") if standard else ("asyncio", "h11")
    config = uvicorn.Config(
        app, log_level="warning", access_log=False, lifespan=lifespan, loop=loop, http=http
    )
    server = uvicorn.Server(config)
    deadlines = sys.modules.get("deadlines")  # which tree it came from (versus.py checks)
    where = None if deadlines is None else deadlines.__file__
    announce({"port": sock.getsockname()[1], "deadlines": where})
    asyncio.run(server.serve(sockets=[sock]))


def main() -> None:
    """Serve the chosen kind until SIGTERM."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "kind", choices=["fast", "silent", "switch", "starlette", "fastapi", "soak"]
    )
    parser.add_argument("--deadlines", action="store_true", help="add the middleware")
    parser.add_argument("--watch-after", type=float, help="the middleware's watch_after (s)")
    parser.add_argument(
        "--floor", action="store_true", help="a minimal context-variable + send middleware"
    )
    parser.add_argument(
        "--passthrough", action="store_true", help="a middleware that only calls the app"
    )
    parser.add_argument(
        "--reference", choices=list(REFERENCES), help="wrap it in one of Starlette's own too"
    )
    parser.add_argument(
        "--standard", action="store_true", help="uvloop and httptools, as uvicorn[standard]"
    )
    parser.add_argument("--client", choices=["httpx", "aiohttp"], help="soak: the client")
    parser.add_argument("--dependency", help="soak: the URL the route calls")
    parser.add_argument("--budget", type=float, default=0.3, help="soak: the route's deadline")
    parser.add_argument("--pool-size", type=int, default=20, help="soak: the dependency's pool")
    args = parser.parse_args()
    exit_with_parent()
    if args.kind == "fast":
        asyncio.run(_serve_protocol(_Fast))
    elif args.kind == "silent":
        asyncio.run(_serve_protocol(_Silent))
    elif args.kind == "switch":
        asyncio.run(_serve_protocol(_Switch))
    elif args.kind == "soak":
        if args.client is None or args.dependency is None:
            parser.error("soak needs --client and --dependency")
        app = soak_app(
            client=args.client,
            dependency=args.dependency,
            budget=args.budget,
            pool_size=args.pool_size,
        )
        _serve_uvicorn(app, lifespan="on")
    elif args.kind == "fastapi":
        app = fastapi_app(with_deadlines=args.deadlines, watch_after=args.watch_after)
        _serve_uvicorn(app, standard=args.standard)
    else:
        app = starlette_app(
            with_deadlines=args.deadlines,
            watch_after=args.watch_after,
            floor=args.floor,
            passthrough=args.passthrough,
            reference=args.reference,
        )
        _serve_uvicorn(app, standard=args.standard)


if __name__ == "__main__":
    main()
