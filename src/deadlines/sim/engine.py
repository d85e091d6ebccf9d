"""The simulation: clients → load balancer → servers → dependencies, on a `Loop`.

Each request is a small state machine driven by timers; nothing blocks. The rules:

* A server runs a request on a worker (a slot held for the whole handler, like a
  thread); with no free worker it waits in a FIFO queue.
* A handler runs its steps in order: `Work` holds it for a while; `Calls` sends calls
  in parallel and continues when all have answered. A failed call fails the handler,
  unless the call has a fallback.
* A call holds a connection from its caller's pool (FIFO acquire, wait cap), then
  connects, then sends. Its timeout covers the pool wait. When the call gives up it
  releases the connection at once; the callee notices only if it watches for its
  caller leaving (`cancel_on_caller_left`); otherwise it works on, for nobody.
* A server with `loop` costs is one event loop on one core: its work steps take the
  core in turn (the work blocks the loop), a request is read, and its deadline starts,
  only after `passes` turns of the loop (a job may run in each), and each arrival and
  each caller that leaves costs the core a little time.
* A service with a `DeadlinePolicy` derives a deadline from the caller's remaining
  time, drops queued requests that expired, and stops handlers (and their calls) when
  the deadline passes.

Completions always come from a timer, never from inside a start, so no callback ever
runs half-way through another one's bookkeeping. This module has the requests, the
clients and the run; the servers, their pools and balancers are in `servers`, a call
to another service in `calls`. Randomness comes from one stream per
purpose, seeded from the run's seed, so a run is reproducible to the event.
"""

from __future__ import annotations

import gc
import math
import time
from collections.abc import Callable

from .calls import Call
from .loop import Lane, Loop, Timer
from .model import (
    Calls,
    Fault,
    LoadSpec,
    Model,
    Route,
    Work,
)
from .servers import DONE, NEW, QUEUED, RUNNING, Server, Service, stream
from .stats import CallStats, LoadStats, TraceRecord

#: A run with a progress callback goes in this many slices of simulated time.
_SLICES = 100
_STATUS = {"rejected": 503, "refused": 503, "shed": 503, "budget_exhausted": 504}


def status_of(cause: str | None) -> int:
    """The HTTP-like status a handler that ended with `cause` answers with."""
    return 200 if cause is None else _STATUS.get(cause, 504)


class Request:
    """One request being handled by one server."""

    __slots__ = (
        "arrived",
        "caller",
        "calls",
        "deadline",
        "deadline_timer",
        "orphan",
        "pending",
        "reading",
        "route",
        "server",
        "service",
        "sim",
        "state",
        "stats",
        "step",
        "told",
        "trace",
        "work_timer",
        "worker",
    )

    def __init__(
        self,
        sim: Simulation,
        server: Server,
        route: Route,
        caller: Call | Client,
        told: float | None,
        traced: bool,
    ) -> None:
        now = sim.loop.now
        service = server.service
        self.sim = sim
        self.server = server
        self.service = service
        self.route = route
        self.caller = caller
        self.arrived = now
        self.state = NEW
        self.step = 0
        self.pending = 0
        self.calls: list[Call] = []
        self.deadline_timer: Timer | None = None
        self.work_timer: Timer | None = None
        self.worker = False
        self.orphan = False
        self.stats = service.stats[route.name]
        self.told = told
        self.reading = 0  # loop passes still needed before the handler runs
        self.deadline = math.inf
        budget = self.budget()
        self.trace = sim.trace_record(service.spec.name, now, budget) if traced else None
        if service.spec.loop is None:
            self.start_clock(budget)

    def budget(self) -> float | None:
        """The time this service gives the request (None: no deadline)."""
        policy = self.service.policy
        if policy is None:
            return None
        told = self.told
        budget = told if (policy.honor_inbound and told is not None) else policy.default
        if budget is not None and policy.max is not None and budget > policy.max:
            budget = policy.max
        return budget

    def start_clock(self, budget: float | None) -> None:
        """The request is read now: its deadline starts."""
        policy = self.service.policy
        if policy is None or budget is None:
            return
        loop = self.sim.loop
        self.deadline = loop.now + budget - policy.reserve
        if policy.enforce:
            self.deadline_timer = loop.at_in(
                self.service.deadline_lane, self.deadline, Request.expire, self
            )

    def read(self) -> None:
        """A loop server's core got to this request: its clock starts, it is admitted."""
        if self.state == DONE:
            return  # its caller left before it was read, and the server noticed
        loop = self.sim.loop
        server = self.server
        if self.reading:
            # Another turn of the loop: a job ready now runs first (an idle loop: no wait).
            self.reading -= 1
            loop.at(max(loop.now, server.cpu_free), Request.read, self)
            return
        self.arrived = loop.now
        self.start_clock(self.budget())
        self.admit()

    # Admission and the steps.

    def admit(self) -> None:
        """Start on a free worker, wait in the queue, or be turned away."""
        server = self.server
        spec = self.service.spec
        loop = self.sim.loop
        if self.should_shed(loop.now):
            loop.at(loop.now, Request.finish_with, (self, "shed"))
        elif spec.workers is None or server.busy < spec.workers:
            self.start()
        elif spec.queue_limit is not None and server.queued >= spec.queue_limit:
            loop.at(loop.now, Request.finish_with, (self, "rejected"))
        else:
            self.state = QUEUED
            server.queue.append(self)
            server.queued += 1
            if server.queued > server.queue_max:
                server.queue_max = server.queued

    def should_shed(self, now: float) -> bool:
        """True when its server sheds work and this request's deadline passed (or is
        too close for its work, with `shed_short`)."""
        policy = self.service.policy
        if policy is None or not policy.shed:
            return False
        if policy.shed_short:
            return self.deadline - now < self.route.work * self.server.slowdown
        return now >= self.deadline

    def start(self) -> None:
        """Take a worker and begin the first step."""
        self.state = RUNNING
        self.worker = True
        self.server.busy += 1
        stats = self.stats
        stats.queue_wait_sum += self.sim.loop.now - self.arrived
        stats.queue_wait_count += 1
        self.run_step()

    def run_step(self) -> None:
        """Begin the current step, or finish when none is left."""
        steps = self.route.steps
        index = self.step
        if index >= len(steps):
            self.finish(None)
            return
        step = steps[index]
        if isinstance(step, Work):
            server = self.server
            if server.hung and (None in server.hung or self.route.name in server.hung):
                return  # this work never ends; only a deadline or the caller can stop it
            loop = self.sim.loop
            on_core = self.service.spec.loop is not None
            if on_core and server.cpu_free > loop.now:
                # The core is busy (another job, or reading requests): begin when it is free.
                self.work_timer = loop.at(server.cpu_free, Request.resume, self)
                return
            duration = self.service.samplers[self.route.name][index]() * server.slowdown
            if on_core:  # CPU work blocks the loop until it ends
                self.work_timer = loop.at(server.spend(loop.now, duration), Request.step_done, self)
            else:
                self.work_timer = loop.after(duration, Request.step_done, self)
            return
        assert isinstance(step, Calls)
        specs = self.service.spec.calls
        self.calls = [Call(self.sim, self, specs[name]) for name in step.names]
        self.pending = len(self.calls)
        for call in self.calls:
            call.attempt()

    def resume(self) -> None:
        """A loop server's core is free for this request's work step: shed or begin it."""
        self.work_timer = None
        if self.step == 0 and self.should_shed(self.sim.loop.now):
            self.finish("shed")  # the worker's check when it takes the job, as in the lab
            return
        self.run_step()

    def step_done(self) -> None:
        """The current step's work completed: go on."""
        self.work_timer = None
        self.step += 1
        self.run_step()

    def call_done(self, call: Call, cause: str | None) -> None:
        """One of the current step's calls ended (`cause` None: it succeeded)."""
        if self.state != RUNNING:
            return
        call.active = False
        if cause is not None:
            if self.trace is not None and self.trace.gave_up is None:
                self.trace.gave_up = self.sim.loop.now
            if not call.spec.fallback:
                self.finish(cause)
                return
        self.pending -= 1
        if self.pending == 0:
            self.calls = []
            self.step += 1
            self.run_step()

    # The ways a request ends.

    def expire(self) -> None:
        """The deadline passed: stop everything under this request."""
        self.deadline_timer = None
        self.finish("deadline", stopped=True)

    def caller_left(self) -> None:
        """The caller stopped waiting; stop too if this service notices."""
        loop = self.sim.loop
        now = loop.now
        if not self.orphan and self.state != DONE:
            self.service.open.add(now, -1)
        self.orphan = True
        policy = self.service.policy
        if self.state == DONE or policy is None or not policy.cancel_on_caller_left:
            if self.service.spec.loop is not None:
                self.server.spend(now, self.service.spec.loop.left)
            return
        if self.service.spec.loop is None:
            self.finish("caller_left", stopped=True)
        else:  # a busy loop notices the disconnect when it gets to it
            loop.at(self.server.spend(now, self.service.spec.loop.left), Request.stop, self)

    def stop(self) -> None:
        """A loop server noticed that the caller left: stop."""
        self.finish("caller_left", stopped=True)

    @staticmethod
    def finish_with(arg: tuple[Request, str]) -> None:
        """Timer callback: finish a request with a cause."""
        arg[0].finish(arg[1])

    def finish(self, cause: str | None, *, stopped: bool = False) -> None:
        """End the request: free what it holds, record it, answer the caller.

        `stopped` says the handler's own deadline or its caller's leaving ended it.
        """
        if self.state == DONE:
            return
        sim = self.sim
        loop = sim.loop
        now = loop.now
        server = self.server
        if self.state == QUEUED:
            server.queued -= 1  # it stays in the deque; release_worker skips it
        self.state = DONE
        loop.cancel(self.deadline_timer)
        loop.cancel(self.work_timer)
        self.deadline_timer = self.work_timer = None
        if self.calls:
            for call in self.calls:
                if call.active:
                    call.cancel()
            self.calls = []
        if self.worker:
            self.worker = False
            server.release_worker(sim)
        server.outstanding -= 1
        if cause is None:
            if self.orphan:
                server.wasted += 1
            else:
                server.served += 1
        elif stopped or cause == "shed":
            server.dropped += 1
        stats = self.stats
        stats.end(cause)
        stats.latency_sum += now - self.arrived
        stats.in_flight.add(now, -1)
        self.service.in_flight.add(now, -1)
        if self.trace is not None:
            self._trace_end(now, cause, stopped)
        if not self.orphan:
            self.service.open.add(now, -1)
            self.caller.on_response(self, cause)

    def _trace_end(self, now: float, cause: str | None, stopped: bool) -> None:
        trace = self.trace
        assert trace is not None
        if cause is None:
            trace.finished = now
            trace.committed = self.route.commit
        if stopped:
            trace.stopped = now
        if cause != "caller_left":
            trace.answered = now
            trace.status = status_of(cause)


class Client:
    """One request from outside: sends, then waits up to the load's timeout."""

    __slots__ = ("child", "done", "lane", "load", "sent", "sim", "stats", "timer")

    def __init__(self, sim: Simulation, load: LoadSpec, stats: LoadStats, lane: Lane) -> None:
        self.sim = sim
        self.lane = lane
        self.load = load
        self.stats = stats
        self.sent = sim.loop.now
        self.done = False
        self.child: Request | None = None
        self.timer: Timer | None = None

    def send(self, traced: bool) -> None:
        """Send through the service's load balancer and start the client's clock."""
        sim = self.sim
        load = self.load
        if load.timeout is not None:
            when = sim.loop.now + load.timeout
            self.timer = sim.loop.at_in(self.lane, when, Client.give_up, self)
        server = sim.services[load.service].pick()
        if server.down:
            sim.loop.at(sim.loop.now, Client.refused, self)
            return
        told = load.timeout if load.send_deadline else None
        self.child = sim.arrive(server, load.route, self, told, traced=traced)

    def on_response(self, child: Request, cause: str | None) -> None:
        """The service answered."""
        if self.done:
            return
        self.done = True
        self.child = None
        self.sim.loop.cancel(self.timer)
        self.timer = None
        now = self.sim.loop.now
        self.stats.record(now, now - self.sent, cause)

    def refused(self) -> None:
        """Every server was down."""
        self.child = None
        if not self.done:
            self.done = True
            self.sim.loop.cancel(self.timer)
            self.stats.record(self.sim.loop.now, 0.0, "refused")

    def give_up(self) -> None:
        """The client's own timeout fired: it stops waiting (and closes the connection)."""
        if self.done:
            return
        self.done = True
        self.timer = None
        now = self.sim.loop.now
        self.stats.record(now, now - self.sent, "client_timeout")
        child, self.child = self.child, None
        if child is not None:
            child.caller_left()


class Simulation:
    """One run of one `Model`: builds the world, runs the loop, keeps the recorders."""

    def __init__(self, model: Model, seed: int) -> None:
        self.model = model
        self.seed = seed
        self.loop = Loop()
        self.services = {name: Service(spec, seed) for name, spec in model.services.items()}
        self.call_stats: dict[str, dict[str, CallStats]] = {
            name: {call: CallStats() for call in spec.calls}
            for name, spec in model.services.items()
        }
        self.load_stats = {load.name: LoadStats(model.window) for load in model.loads}
        self.retry_rng = stream(seed, "retry")
        self.trace: dict[str, TraceRecord] = {}
        self.in_flight_end: dict[str, int] = {}
        self.series_t: list[float] = []
        self.series_in_flight: dict[str, list[int]] = {load.name: [] for load in model.loads}
        self.series_queue: dict[str, list[list[int]]] = {name: [] for name in self.services}
        self.series_outstanding: dict[str, list[list[int]]] = {name: [] for name in self.services}
        self.wall_s = 0.0

    @property
    def end(self) -> float:
        """When the run stops: the load's duration plus the drain."""
        return self.model.duration + self.model.drain

    def run(self, progress: Callable[[float], object] | None = None) -> Simulation:
        """Schedule faults, load and sampling, then run to the end.

        `progress`, when given, is called with the share of simulated time done (0 to 1)
        after each hundredth of the run; the events and their order are the same.
        """
        loop = self.loop
        for fault in self.model.faults:
            loop.at(fault.at, _apply_fault, (self, fault, True))
            if fault.until is not None:
                loop.at(fault.until, _apply_fault, (self, fault, False))
        loop.at(self.model.duration, Simulation._mark_end, self)
        for index, load in enumerate(self.model.loads):
            _LoadRunner(self, load, first=index == 0).schedule()
        loop.at(0.0, Simulation._sample, self)
        started = time.perf_counter()
        # Finished requests are freed by reference counting (no cycles are left behind),
        # so the cyclic collector would only rescan millions of live objects: pause it.
        collecting = gc.isenabled()
        gc.disable()
        try:
            if progress is None:
                loop.run(self.end)
            else:
                for step in range(1, _SLICES + 1):
                    loop.run(self.end * step / _SLICES)
                    progress(step / _SLICES)
        finally:
            if collecting:
                gc.enable()
        self.wall_s = time.perf_counter() - started
        return self

    def arrive(
        self, server: Server, route: str, caller: Call | Client, told: float | None, traced: bool
    ) -> Request:
        """A request reaches `server`: count it and admit it."""
        service = server.service
        request = Request(self, server, service.routes[route], caller, told, traced)
        now = self.loop.now
        server.outstanding += 1
        server.requests += 1
        request.stats.requests += 1
        request.stats.in_flight.add(now, 1)
        service.in_flight.add(now, 1)
        service.open.add(now, 1)
        costs = service.spec.loop
        if costs is None:
            request.admit()
        else:
            request.reading = costs.passes - 1
            self.loop.at(server.spend(now, costs.arrival), Request.read, request)
        return request

    def trace_record(self, service: str, now: float, budget: float | None) -> TraceRecord | None:
        """The trace record for the first traced request a service sees, else None."""
        if service in self.trace:
            return None
        record = TraceRecord(now, budget)
        self.trace[service] = record
        return record

    def _mark_end(self) -> None:
        for load in self.model.loads:
            stats = self.services[load.service].stats[load.route]
            self.in_flight_end[load.name] = stats.in_flight.value

    def _sample(self) -> None:
        now = self.loop.now
        self.series_t.append(now)
        for load in self.model.loads:
            stats = self.services[load.service].stats[load.route]
            self.series_in_flight[load.name].append(stats.in_flight.value)
        for name, service in self.services.items():
            self.series_queue[name].append([s.queued for s in service.servers])
            self.series_outstanding[name].append([s.outstanding for s in service.servers])
        if now + self.model.sample <= self.end + 1e-9:
            self.loop.after(self.model.sample, Simulation._sample, self)


def _apply_fault(arg: tuple[Simulation, Fault, bool]) -> None:
    sim, fault, on = arg
    servers = sim.services[fault.service].servers
    if fault.server is not None:
        servers = [servers[fault.server]]
    for server in servers:
        if fault.kind == "slow":
            server.slowdown = fault.factor if on else 1.0
        elif fault.kind == "down":
            server.down = on
        elif fault.kind == "blackhole":
            server.blackhole = on
        elif on:
            server.hung.add(fault.route)
        else:
            server.hung.discard(fault.route)


class _LoadRunner:
    """Sends one load's requests: evenly spaced or Poisson, until its end or count."""

    __slots__ = ("count", "first", "lane", "load", "next_at", "rng", "sim", "stats")

    def __init__(self, sim: Simulation, load: LoadSpec, *, first: bool) -> None:
        self.sim = sim
        self.load = load
        self.stats = sim.load_stats[load.name]
        self.rng = stream(sim.seed, "load", load.name)
        self.first = first
        self.lane = Lane()  # the clients' timeouts
        self.count = 0
        self.next_at = load.start

    def schedule(self) -> None:
        """Schedule the next request, if the load still runs."""
        load = self.load
        if load.count is not None and self.count >= load.count:
            return
        if self.next_at >= self.sim.model.duration:
            return
        self.sim.loop.at(self.next_at, _LoadRunner.fire, self)

    def fire(self) -> None:
        """Send one request and schedule the next."""
        load = self.load
        traced = self.first and self.count == 0
        self.count += 1
        self.stats.requests += 1
        Client(self.sim, load, self.stats, self.lane).send(traced)
        if load.arrival == "poisson":
            self.next_at += self.rng.expovariate(load.rate)
        else:
            self.next_at = load.start + self.count / load.rate
        self.schedule()


def simulate(
    model: Model, seed: int, *, progress: Callable[[float], object] | None = None
) -> Simulation:
    """Run `model` once with `seed` and return the finished simulation.

    `progress` is called with the share of simulated time done (see `Simulation.run`).
    """
    return Simulation(model, seed).run(progress)
