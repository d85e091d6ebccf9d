"""The service of experiment `overload`: fixed CPU work per request, one worker.

    python -m deadlines.lab.overload.service [--service-ms 40 | --iterations N]
        [--admission] [--codel]
        [--codel-target 0.1] [--codel-interval 0.5] [--rejection-budget 0.2]

An aiohttp.web application behind `deadlines.aiohttp_web.DeadlineMiddleware` (each
request's deadline from its ``x-request-timeout-ms`` header, 60 s without one).
``GET /work?level=NAME`` spins the CPU for a fixed number of iterations
(`--iterations`, or calibrated at start to take about `service-ms` on an idle core), one
request at a time, so the service's capacity is about one request per `service-ms`. The
work blocks the event loop, as CPU work in a Python service does.

Without flags, one worker takes the requests from a queue in arrival order and serves
every one, even one whose caller has left. With a protection, the middleware's
`deadlines.Gate` (``gate=``) is the queue, with a limit of one request at work:

* ``--admission``: `deadlines.Admission` at arrival (503 when the time left is less
  than the learned service time, within its rejection budget), and at the start of the
  work the same test with the time left then; a request whose caller left or whose
  deadline passed leaves the queue unworked;
* ``--codel``: `deadlines.CoDel` on each request's queue delay (arrival to start): 503,
  newest first while a queue stands (the gate's LIFO).

``GET /_stats`` reports, per level: arrived, served (work done), unused (work done for
a caller that had left, or after the deadline), refused (answered without work, by
reason); and the CPU seconds spent on work and in all.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import deadlines

from .._app import serve

if TYPE_CHECKING:
    from aiohttp import web

    Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

ROUTE = "/work"
#: The longest the worker waits for an answer to go out before the next job.
_SEND_WAIT = 0.05


def spin(iterations: int) -> int:
    """Fixed CPU work: `iterations` rounds of integer arithmetic."""
    acc = 0
    for i in range(iterations):
        acc = (acc + i * i) % 1_000_003
    return acc


def calibrate(seconds: float) -> int:
    """Iterations of `spin` that take about `seconds` on this core, unloaded (the fastest
    of a few tries)."""
    probe = 20_000
    best = float("inf")
    for _ in range(5):
        started = time.perf_counter()
        spin(probe)
        best = min(best, time.perf_counter() - started)
    return max(1, round(seconds / best * probe))


@dataclass(slots=True)
class _Job:
    level: str
    done: asyncio.Future[int] = field(default_factory=asyncio.Future)
    sent: asyncio.Event = field(default_factory=asyncio.Event)
    abandoned: bool = False


@dataclass
class _Level:
    arrived: int = 0
    served: int = 0
    unused: int = 0
    refused: int = 0
    why: dict[str, int] = field(default_factory=dict)

    def refuse(self, reason: str) -> None:
        self.refused += 1
        self.why[reason] = self.why.get(reason, 0) + 1

    def as_dict(self) -> dict[str, Any]:
        return {
            "arrived": self.arrived,
            "served": self.served,
            "unused": self.unused,
            "refused": self.refused,
            "why": self.why,
        }


@dataclass
class Service:
    """The work, the counters, and without a gate the queue and its worker."""

    iterations: int
    gate: deadlines.Gate | None = None
    queue: asyncio.Queue[_Job] = field(default_factory=asyncio.Queue)
    levels: dict[str, _Level] = field(default_factory=dict)
    work_cpu: float = 0.0

    def level(self, name: str) -> _Level:
        """The counters of load level `name`."""
        return self.levels.setdefault(name, _Level())

    def _spin(self) -> None:
        cpu = time.process_time()
        spin(self.iterations)  # blocks the loop: CPU work
        self.work_cpu += time.process_time() - cpu

    async def worker(self) -> None:
        """Without a gate: serve the queue in arrival order, one job at a time, each."""
        while True:
            job = await self.queue.get()
            counts = self.level(job.level)
            self._spin()
            counts.served += 1
            if job.abandoned or job.done.done():
                counts.unused += 1
                await asyncio.sleep(0)  # arrivals and /_stats are read between two jobs
                continue
            job.done.set_result(200)
            # The answer goes out before the next job blocks the loop for a whole job.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(job.sent.wait(), _SEND_WAIT)

    async def count(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Outside the deadline middleware: count arrivals, and refusals by reason (the
        gate's answers never reach `work`)."""
        if request.path != ROUTE:
            return await handler(request)
        counts = self.level(request.query.get("level", "-"))
        counts.arrived += 1
        try:
            response = await handler(request)
        except asyncio.CancelledError:
            if not request.get("worked"):
                counts.refuse("left")
            raise
        if not request.get("worked"):
            counts.refuse(_reason(response))
        return response

    async def work(self, request: web.Request) -> web.StreamResponse:
        """``GET /work``: the work, here behind the gate, else queued for the worker."""
        if self.gate is None:
            return await self._queued(request)
        from aiohttp import web

        request["worked"] = True
        counts = self.level(request.query.get("level", "-"))
        # The work blocks the loop: first let the requests that arrived meanwhile reach
        # the gate, so that they wait in its queue (with their arrival times), not unseen
        # in the loop's.
        await asyncio.sleep(0)
        self._spin()
        counts.served += 1
        if request.transport is None or deadlines.remaining() <= 0.0:
            counts.unused += 1  # the caller left, or the answer is too late: a 504
        return web.Response(text="done")

    async def _queued(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        request["worked"] = True  # served by the worker: its counts
        name = request.query.get("level", "-")
        job = _Job(name)
        self.queue.put_nowait(job)
        try:
            status = await job.done
            response = web.Response(status=status, text="done")
            await response.prepare(request)
            await response.write_eof()
        except asyncio.CancelledError:
            job.abandoned = True  # the caller left, or the middleware answered 504
            raise
        finally:
            job.sent.set()
        return response

    async def stats(self, request: web.Request) -> web.Response:
        """``GET /_stats``: the counters per level, the CPU spent."""
        from aiohttp import web

        return web.json_response(
            {
                "levels": {k: v.as_dict() for k, v in self.levels.items()},
                "queued": self.queue.qsize() + (self.gate.waiting if self.gate else 0),
                "work_cpu_s": round(self.work_cpu, 4),
                "cpu_s": round(time.process_time(), 4),
            }
        )


def _reason(response: web.StreamResponse) -> str:
    """Why the middleware answered `response` without the work: the gate's reason (503),
    late (504), the caller left (499)."""
    body = getattr(response, "body", None)
    if response.status == 503 and isinstance(body, bytes):
        with contextlib.suppress(ValueError, KeyError, TypeError):
            return str(json.loads(body)["reason"])
    return {504: "late", 499: "left"}.get(response.status, str(response.status))


def main(argv: list[str] | None = None) -> None:
    """Serve until SIGTERM; print ``READY {"port": N, "iterations": I}`` when listening."""
    parser = argparse.ArgumentParser(prog="python -m deadlines.lab.overload.service")
    parser.add_argument("--service-ms", type=float, default=40.0)
    parser.add_argument("--iterations", type=int, help="work per request (else calibrated)")
    parser.add_argument("--admission", action="store_true")
    parser.add_argument("--codel", action="store_true")
    parser.add_argument("--codel-target", type=float, default=0.1)
    parser.add_argument("--codel-interval", type=float, default=0.5)
    parser.add_argument("--rejection-budget", type=float, default=0.2)
    args = parser.parse_args(argv)

    async def setup() -> tuple[dict[str, Any], Callable[[], Awaitable[None]]]:
        from aiohttp import web

        from deadlines.aiohttp_web import DeadlineMiddleware

        gate = None
        if args.admission or args.codel:
            gate = deadlines.Gate(
                limit=1,  # the one worker
                admission=deadlines.Admission(rejection_budget=args.rejection_budget)
                if args.admission
                else None,
                codel=deadlines.CoDel(target=args.codel_target, interval=args.codel_interval)
                if args.codel
                else None,
            )
        service = Service(args.iterations or calibrate(args.service_ms / 1000.0), gate)
        deadline = DeadlineMiddleware(default=60.0, maximum=60.0, gate=gate)

        @web.middleware
        async def count(request: web.Request, handler: Handler) -> web.StreamResponse:
            return await service.count(request, handler)

        app = web.Application(middlewares=[count, deadline])
        app.router.add_get(ROUTE, service.work)
        app.router.add_get("/_stats", service.stats)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096, shutdown_timeout=0.2)
        await site.start()
        port = runner.addresses[0][1]
        worker = asyncio.create_task(service.worker())  # idle behind a gate

        async def cleanup() -> None:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
            await runner.cleanup()

        return {"port": port, "iterations": service.iterations}, cleanup

    serve(setup)


if __name__ == "__main__":
    main()
