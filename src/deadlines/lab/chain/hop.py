"""One hop of the chain A → B → C: a Starlette app under uvicorn, in its own process.

    python -m deadlines.lab.chain.hop --name B --variant fixed --work 0.3 \
        --next http://127.0.0.1:PORT --timeout 2.0

Each hop does `--work` seconds of work, then calls `--next` (A and B), or commits a
row (C: an INSERT into SQLite, or Postgres with `--dsn`). The variant decides how:

* ``fixed``: httpx with a fixed timeout per call; nothing stops when the caller leaves;
* ``propagated``: the library — `deadlines.asgi.DeadlineMiddleware` makes the request's
  deadline from the header (minus a reserve) and cancels the work at the deadline or
  when the caller hangs up; `deadlines.httpx` sends the remaining time onward.

What happened and when (on the shared monotonic clock) is kept and served at
``/_events`` for the lab to read.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .._app import serve

Event = dict[str, Any]


def commit(db: str, dsn: str | None, request_id: str, hop: str) -> None:
    """INSERT one row and COMMIT: the real side effect at the end of C's work."""
    if dsn:
        import psycopg

        with psycopg.connect(dsn, connect_timeout=5) as conn:
            conn.execute(
                "INSERT INTO deadlines_lab_chain (request_id, hop) VALUES (%s, %s)",
                (request_id, hop),
            )
        return
    with sqlite3.connect(db, timeout=5) as conn:
        conn.execute(
            "INSERT INTO deadlines_lab_chain (request_id, hop) VALUES (?, ?)", (request_id, hop)
        )


def build_app(ns: argparse.Namespace, events: list[Event]) -> Any:
    """The hop's ASGI app (with the deadline middleware when propagated)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    propagated = ns.variant == "propagated"
    client: Any
    if propagated:
        import deadlines
        import deadlines.httpx

        client = deadlines.httpx.AsyncClient(deadlines.Dependency(f"hop-{ns.name}"))
    else:
        import httpx

        # The chapter's fixed timeouts, per phase, on purpose.
        client = httpx.AsyncClient(timeout=httpx.Timeout(ns.timeout))  # deadlines: ignore[DLN109]

    def note(kind: str, **data: Any) -> None:
        events.append({"hop": ns.name, "event": kind, "t": time.monotonic(), **data})

    async def work(request: Request) -> Response:
        rid = request.query_params.get("id", "")
        header = request.headers.get("x-request-timeout-ms")
        note("arrived", id=rid, budget_ms=int(header) if header and header.isdigit() else None)
        try:
            await asyncio.sleep(ns.work)
            if ns.next:
                return await _call_next(rid)
            await asyncio.to_thread(commit, ns.db, ns.dsn, rid, ns.name)
            note("finished", id=rid, committed=True)
            return JSONResponse({"ok": True})
        except asyncio.CancelledError:
            import deadlines

            deadline = deadlines.current()
            why = "deadline" if deadline is not None and deadline.expired else "caller left"
            note("stopped", id=rid, reason=why)
            raise

    async def _call_next(rid: str) -> Response:
        try:
            resp = await client.get(f"{ns.next}/work", params={"id": rid})
        except asyncio.CancelledError:
            note("gave_up", id=rid, error="cancelled")
            raise
        except Exception as exc:  # the call failed: this hop answers 504
            note("gave_up", id=rid, error=type(exc).__name__)
            return JSONResponse({"error": type(exc).__name__}, status_code=504)
        if resp.status_code >= 400:
            note("gave_up", id=rid, error=f"status {resp.status_code}")
        return Response(resp.content, status_code=resp.status_code)

    async def show_events(request: Request) -> Response:
        return JSONResponse(events)

    async def set_next(request: Request) -> Response:
        ns.next = request.query_params["url"]  # the lab starts all hops at once, then links them
        return JSONResponse({"next": ns.next})

    async def warm(request: Request) -> Response:
        # Open the keep-alive connection to the next hop and load what a first call
        # loads, so the measured request pays for neither.
        if ns.next:
            await client.get(f"{ns.next}/_warm")
        return JSONResponse({"warm": True})

    inner = Starlette(
        routes=[
            Route("/work", work),
            Route("/_events", show_events),
            Route("/_warm", warm),
            Route("/_next", set_next),
        ]
    )
    app: Any = inner
    if propagated:
        from deadlines.asgi import DeadlineMiddleware

        app = DeadlineMiddleware(inner, default=ns.default, maximum=60.0, reserve=ns.reserve)
    return _Answers(app, note), client


class _Answers:
    """Outermost ASGI wrapper: notes when and with what status the hop answered."""

    def __init__(self, app: Any, note: Callable[..., None]) -> None:
        self.app = app
        self.note = note

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != "/work":
            await self.app(scope, receive, send)
            return

        async def sending(message: Any) -> None:
            if message["type"] == "http.response.start":
                self.note("answered", status=message["status"])
            await send(message)

        await self.app(scope, receive, sending)


def main(argv: list[str] | None = None) -> None:
    """Serve the hop until SIGTERM; print ``READY {"port": N}`` when listening."""
    parser = argparse.ArgumentParser(prog="python -m deadlines.lab.chain.hop")
    parser.add_argument("--name", required=True)
    parser.add_argument("--variant", choices=("fixed", "propagated"), required=True)
    parser.add_argument("--work", type=float, required=True)
    parser.add_argument("--next", default="")
    parser.add_argument("--timeout", type=float, default=2.0, help="fixed: this hop's limit")
    parser.add_argument("--default", type=float, default=10.0, help="propagated: no header")
    parser.add_argument("--reserve", type=float, default=0.05)
    parser.add_argument("--db", default="")
    parser.add_argument("--dsn", default=None)
    ns = parser.parse_args(argv)

    async def setup() -> tuple[dict[str, Any], Callable[[], Awaitable[None]]]:
        import uvicorn

        events: list[Event] = []
        app, client = build_app(ns, events)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(1024)
        config = uvicorn.Config(
            app, log_level="warning", access_log=False, lifespan="off",
            timeout_graceful_shutdown=1,
        )  # fmt: skip
        config.load()
        server = uvicorn.Server(config)
        server.lifespan = config.lifespan_class(config)
        await server.startup(sockets=[sock])

        async def cleanup() -> None:
            server.should_exit = True
            await server.shutdown(sockets=[sock])
            await client.aclose()

        return {"port": sock.getsockname()[1]}, cleanup

    serve(setup)


if __name__ == "__main__":
    main()
