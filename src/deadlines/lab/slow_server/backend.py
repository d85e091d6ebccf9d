"""One backend of experiment `slow-server`: a server with a fixed number of workers.

    python -m deadlines.lab.slow_server.backend [--service-ms 20] [--workers 1] [--shed]

Requests wait in a queue for a worker; each takes `service-ms` (times the slowness
factor, which ``POST /_slow?factor=5`` sets: slower, but still healthy). Without
`--shed` a request is served even when its client has already given up — work for
nobody. With `--shed` (the deadlines policy) the backend reads the request's budget from
its header on arrival; a worker drops a request whose remaining budget is shorter than
the work, or whose client left, and work in progress stops when its client leaves.
``/_stats`` reports the queue.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from deadlines import Deadline, wire

from .._app import serve
from .._http import HttpServer, Request, Response


@dataclass(slots=True)
class _Job:
    deadline: Deadline | None
    done: asyncio.Future[int] = field(default_factory=asyncio.Future)
    abandoned: bool = False
    work: asyncio.Future[None] | None = None


def _too_late(deadline: Deadline | None, need: float) -> bool:
    # Less time left than the work takes: its answer would come after the caller left.
    return deadline is not None and deadline.remaining() < need


@dataclass
class _Backend:
    service: float
    shed: bool
    factor: float = 1.0
    queue: asyncio.Queue[_Job] = field(default_factory=asyncio.Queue)
    busy: int = 0
    served: int = 0
    wasted: int = 0  # served after the client had already left
    dropped: int = 0  # shed: expired or abandoned before any work

    async def worker(self) -> None:
        while True:
            job = await self.queue.get()
            need = self.service * self.factor
            if self.shed and (job.abandoned or _too_late(job.deadline, need)):
                self.dropped += 1
                if not job.done.done():
                    job.done.set_result(504)
                continue
            self.busy += 1
            job.work = asyncio.ensure_future(asyncio.sleep(need))
            try:
                await asyncio.wait({job.work})
            finally:
                self.busy -= 1
            if job.work.cancelled():  # shed: its client left, the work was stopped
                self.dropped += 1
                continue
            self.served += 1
            if job.abandoned:
                self.wasted += 1
            if not job.done.done():
                job.done.set_result(200)

    async def handle(self, request: Request) -> Response:
        if request.path == "/work":
            return await self._work(request)
        if request.path == "/_slow":
            params = dict(part.split("=", 1) for part in request.query.split("&") if "=" in part)
            self.factor = float(params.get("factor", "1"))
            return Response.json({"factor": self.factor})
        if request.path == "/_stats":
            return Response.json(
                {
                    "queued": self.queue.qsize(),
                    "busy": self.busy,
                    "served": self.served,
                    "wasted": self.wasted,
                    "dropped": self.dropped,
                    "factor": self.factor,
                }
            )
        return Response(404)

    async def _work(self, request: Request) -> Response:
        deadline = None
        if self.shed:
            budget = wire.header_budget(list(request.headers.items()))
            if budget is not None:
                deadline = Deadline.after(budget)
        job = _Job(deadline)
        self.queue.put_nowait(job)
        try:
            status = await job.done
        except asyncio.CancelledError:
            job.abandoned = True  # the client left; without --shed the job still runs
            if self.shed and job.work is not None:
                job.work.cancel()
            raise
        return Response(status, b"done" if status == 200 else b"deadline passed")


def main(argv: list[str] | None = None) -> None:
    """Serve until SIGTERM; print ``READY {"port": N}`` when listening."""
    parser = argparse.ArgumentParser(prog="python -m deadlines.lab.slow_server.backend")
    parser.add_argument("--service-ms", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--shed", action="store_true")
    args = parser.parse_args(argv)

    async def setup() -> tuple[dict[str, Any], Callable[[], Awaitable[None]]]:
        backend = _Backend(args.service_ms / 1000.0, args.shed)
        workers = [asyncio.create_task(backend.worker()) for _ in range(args.workers)]
        server = HttpServer(backend.handle)
        port = await server.start()

        async def cleanup() -> None:
            await server.close()
            for task in workers:
                task.cancel()
            for task in workers:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

        return {"port": port}, cleanup

    serve(setup)


if __name__ == "__main__":
    main()
