"""Starlette and FastAPI apps that report what their handlers saw, for the ASGI tests."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route

import deadlines
import deadlines.fastapi as dfa
from deadlines.asgi import DeadlineMiddleware, Limits, limits


class Record:
    """What handlers observed, keyed by the request's ``id`` query parameter."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.data: dict[str, dict[str, Any]] = {}

    def put(self, key: str, **values: Any) -> None:
        """Merge `values` into the record for `key`."""
        with self._lock:
            self.data.setdefault(key, {}).update(values)

    def get(self, key: str) -> dict[str, Any]:
        """A copy of the record for `key` (empty when nothing was recorded)."""
        with self._lock:
            return dict(self.data.get(key, {}))

    def wait(self, key: str, field: str, timeout: float = 5.0) -> Any:
        """Block until `field` is recorded for `key`, and return it."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            found = self.get(key)
            if field in found:
                return found[field]
            time.sleep(0.005)
        raise AssertionError(f"{key}.{field} was never recorded: {self.get(key)}")


async def sleep_recorded(record: Record, key: str, seconds: float) -> None:
    """Sleep, recording when it started and when and why it was cancelled."""
    record.put(key, started=time.monotonic(), deadline=deadlines.current())
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError as exc:
        reason = exc.args[0] if exc.args else None
        record.put(key, cancelled=time.monotonic(), reason=reason)
        raise
    record.put(key, finished=time.monotonic())


def starlette_app(record: Record, *, base_http: str | None = None, **options: Any) -> Starlette:
    """A Starlette app behind DeadlineMiddleware; `base_http` adds a BaseHTTPMiddleware
    ("outer" or "inner" relative to ours)."""

    async def info(request: Request) -> JSONResponse:
        current = deadlines.current()
        return JSONResponse(
            {
                "remaining": deadlines.remaining() if current else None,
                "route": request.url.path,
                "seen_by_base": getattr(request.state, "seen_remaining", None),
            }
        )

    def sync_info(request: Request) -> JSONResponse:
        return JSONResponse({"remaining": deadlines.remaining() if deadlines.current() else None})

    async def slow(request: Request) -> Response:
        await sleep_recorded(record, request.query_params["id"], 10.0)
        return Response("done")

    async def unread(request: Request) -> Response:
        await sleep_recorded(record, request.query_params["id"], 10.0)
        return Response("done")

    async def echo(request: Request) -> JSONResponse:
        if "delay" in request.query_params:
            await asyncio.sleep(float(request.query_params["delay"]))
        body = await request.body()
        return JSONResponse({"length": len(body), "sha": hashlib.sha256(body).hexdigest()})

    async def stream(request: Request) -> StreamingResponse:
        async def chunks() -> AsyncIterator[bytes]:
            for i in range(5):
                await asyncio.sleep(0.02)
                yield f"chunk{i};".encode()

        return StreamingResponse(chunks())

    async def stall(request: Request) -> StreamingResponse:
        key = request.query_params["id"]

        async def chunks() -> AsyncIterator[bytes]:
            yield b"first;"
            await sleep_recorded(record, key, 10.0)
            yield b"never"

        return StreamingResponse(chunks())

    async def after(request: Request) -> Response:
        """A complete response, then background work that outlives the deadline."""
        key = request.query_params["id"]
        return Response("done", background=BackgroundTask(sleep_recorded, record, key, 10.0))

    async def poll(request: Request) -> JSONResponse:
        polls = 0
        for _ in range(20):
            assert not await request.is_disconnected()
            polls += 1
            await asyncio.sleep(0.005)
        return JSONResponse({"polls": polls})

    @limits(default=5.0, maximum=8.0)
    async def report(request: Request) -> JSONResponse:
        return JSONResponse({"remaining": deadlines.remaining()})

    async def item(request: Request) -> JSONResponse:
        return JSONResponse({"remaining": deadlines.remaining()})

    routes = [
        Route("/info", info),
        Route("/sync", sync_info),
        Route("/slow", slow),
        Route("/unread", unread, methods=["POST"]),
        Route("/echo", echo, methods=["POST"]),
        Route("/stream", stream),
        Route("/stall", stall),
        Route("/after", after),
        Route("/report", report),
        Route("/poll", poll),
        Route("/items/{item_id}", item),
        Route("/bulk/run", item),
        Mount("/admin", routes=[Route("/users/{user_id}", item)]),
    ]
    settings: dict[str, Any] = {
        "default": 1.0,
        "maximum": 2.0,
        "routes": {"/bulk/*": Limits(default=3.0, maximum=4.0)},
    }
    settings.update(options)
    ours = Middleware(DeadlineMiddleware, **settings)
    middleware = [ours]
    if base_http is not None:
        base = Middleware(_base_http_class())
        middleware = [base, ours] if base_http == "outer" else [ours, base]
    return Starlette(routes=routes, middleware=middleware)


def _base_http_class() -> Callable[..., Any]:
    from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint

    class Recorder(BaseHTTPMiddleware):
        """What `@app.middleware("http")` builds: a BaseHTTPMiddleware with a dispatch."""

        async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
            request.state.seen_remaining = (
                deadlines.remaining() if deadlines.current() is not None else None
            )
            response = await call_next(request)
            response.headers["x-base-http"] = "1"
            return response

    return Recorder


def fastapi_app(record: Record) -> Any:
    """A FastAPI app with a `@app.middleware("http")` and the deadline dependency."""
    app = FastAPI()

    @app.middleware("http")
    async def tag(request: Request, call_next: Any) -> Response:
        response: Response = await call_next(request)
        response.headers["x-tagged"] = str(deadlines.current() is not None)
        return response

    @app.get("/info")
    async def info(deadline: Annotated[deadlines.Deadline | None, Depends(dfa.deadline)]) -> Any:
        return {"remaining": deadline.remaining() if deadline else None}

    @app.get("/sync")
    def sync_info() -> Any:
        return {"remaining": deadlines.remaining() if deadlines.current() else None}

    @app.get("/long", dependencies=[dfa.limits(default=4.0, maximum=6.0)])
    async def long() -> Any:
        return {"remaining": deadlines.remaining()}

    @app.get("/slow")
    async def slow(id: str) -> Any:
        await sleep_recorded(record, id, 10.0)
        return {"done": True}

    app.add_middleware(DeadlineMiddleware, default=1.0, maximum=2.0)
    return app
