"""The service of experiment `overload`: fixed CPU work per request, one worker.

    python -m deadlines.lab.overload.service [--service-ms 40 | --iterations N]
        [--admission] [--codel]
        [--codel-target 0.1] [--codel-interval 0.5] [--rejection-budget 0.2]

An aiohttp.web application behind `deadlines.aiohttp_web.DeadlineMiddleware` (each
request's deadline from its ``x-request-timeout-ms`` header, 60 s without one).
``GET /work?level=NAME`` queues a job; one worker takes the jobs in arrival order and
spins the CPU for a fixed number of iterations (`--iterations`, or calibrated at start
to take about `service-ms` on an idle core), so the service's capacity is about one job per
`service-ms`. The work blocks the event loop, as CPU work in a Python service does.

Without flags the worker serves every job, even one whose caller has left. The
middlewares do not call the overload building blocks yet, so this service calls them
itself:

* ``--admission``: `deadlines.Admission` at arrival (503 ``shed`` when the time left is
  less than the learned service time, within its rejection budget), and at the start
  of the work the same test with the time left then; a job whose caller left or whose
  deadline passed is dropped unworked;
* ``--codel``: `deadlines.CoDel` on each job's queue delay (arrival to start): 503.

``GET /_stats`` reports, per level: arrived, served (work done), unused (work done for
a caller that had left), refused (503/504 without work); and the CPU seconds spent on
work and in all.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import deadlines

from .._app import serve

if TYPE_CHECKING:
    from aiohttp import web

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
    arrived: float
    expires: float
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
    """The queue, the worker and the counters."""

    iterations: int
    admission: deadlines.Admission | None
    codel: deadlines.CoDel | None
    queue: asyncio.Queue[_Job] = field(default_factory=asyncio.Queue)
    levels: dict[str, _Level] = field(default_factory=dict)
    work_cpu: float = 0.0

    def level(self, name: str) -> _Level:
        """The counters of load level `name`."""
        return self.levels.setdefault(name, _Level())

    async def worker(self) -> None:
        """Serve the queue in arrival order, one job at a time."""
        while True:
            job = await self.queue.get()
            counts = self.level(job.level)
            if self.admission is not None and job.abandoned:
                counts.refuse("left")  # the caller left (or its deadline passed): no work
                continue
            started = time.monotonic()
            reason = self._refuse(job, started)
            if reason:
                counts.refuse(reason)
                if not job.done.done():
                    job.done.set_result(503)
                await asyncio.sleep(0)  # the refusal goes out now, not after the next job
                continue
            cpu = time.process_time()
            spin(self.iterations)  # blocks the loop: CPU work
            self.work_cpu += time.process_time() - cpu
            if self.admission is not None:
                self.admission.observe(ROUTE, time.monotonic() - started)
            counts.served += 1
            if job.abandoned or job.done.done():
                counts.unused += 1
                await asyncio.sleep(0)  # arrivals and /_stats are read between two jobs
                continue
            job.done.set_result(200)
            # The answer goes out before the next job blocks the loop for a whole job.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(job.sent.wait(), _SEND_WAIT)

    def _refuse(self, job: _Job, started: float) -> str:
        """Why to refuse `job` now ("" to serve it)."""
        if self.codel is not None and self.codel.shed(started - job.arrived):
            return "codel"
        if self.admission is None:
            return ""
        expected = self.admission.expected(ROUTE)
        return "too_late" if expected is not None and job.expires - started < expected else ""

    async def work(self, request: web.Request) -> web.Response:
        """``GET /work``: queue a job and answer when it is done (or refused)."""
        from aiohttp import web

        name = request.query.get("level", "-")
        counts = self.level(name)
        counts.arrived += 1
        if self.admission is not None:
            decision = self.admission.decide(ROUTE, deadlines.remaining())
            if decision != "admit":
                counts.refuse(decision)
                status = 504 if decision == "late" else 503
                retry_after = str(self.admission.retry_after(ROUTE))
                return web.Response(status=status, text=decision,
                                    headers={"Retry-After": retry_after})  # fmt: skip
        now = time.monotonic()
        job = _Job(name, now, now + deadlines.remaining())
        self.queue.put_nowait(job)
        try:
            status = await job.done
            response = web.Response(status=status, text="done" if status == 200 else "shed")
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
                "queued": self.queue.qsize(),
                "work_cpu_s": round(self.work_cpu, 4),
                "cpu_s": round(time.process_time(), 4),
            }
        )


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

        service = Service(
            args.iterations or calibrate(args.service_ms / 1000.0),
            deadlines.Admission(rejection_budget=args.rejection_budget) if args.admission else None,
            deadlines.CoDel(target=args.codel_target, interval=args.codel_interval)
            if args.codel
            else None,
        )
        app = web.Application(middlewares=[DeadlineMiddleware(default=60.0, maximum=60.0)])
        app.router.add_get(ROUTE, service.work)
        app.router.add_get("/_stats", service.stats)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096, shutdown_timeout=0.2)
        await site.start()
        port = runner.addresses[0][1]
        worker = asyncio.create_task(service.worker())

        async def cleanup() -> None:
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
            await runner.cleanup()

        return {"port": port, "iterations": service.iterations}, cleanup

    serve(setup)


if __name__ == "__main__":
    main()
