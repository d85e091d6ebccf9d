"""The servers' side of the simulation: services, their servers, pools and load balancers.

A service has servers behind a load balancer; a server has workers, a FIFO queue and
its connection pools. The requests and calls that use them are in `engine`.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from .loop import Lane
from .model import DeadlinePolicy, Distribution, Route, ServiceSpec, Work
from .stats import InFlight, RouteStats

if TYPE_CHECKING:
    from .calls import Call
    from .engine import Request, Simulation

# Request states: arrived (not queued, no worker), queued, running on a worker, done.
NEW, QUEUED, RUNNING, DONE = 0, 1, 2, 3


def sampler(dist: Distribution, rng: random.Random) -> Callable[[], float]:
    """A function drawing durations from `dist` with `rng`."""
    kind, a, b = dist.kind, dist.a, dist.b
    if kind == "constant":
        return lambda: a
    if kind == "exp":
        rate = 1.0 / a
        return lambda: rng.expovariate(rate)
    if kind == "uniform":
        return lambda: rng.uniform(a, b)
    if kind == "lognormal":
        mu, sigma = math.log(a), math.log(b / a) / 2.3263478740408408
        return lambda: rng.lognormvariate(mu, sigma)
    return lambda: math.inf


class Pool:
    """A bounded pool of connections with a FIFO queue of waiting calls."""

    __slots__ = ("in_use", "in_use_max", "size", "waiters")

    def __init__(self, size: int) -> None:
        self.size = size
        self.in_use = 0
        self.in_use_max = 0
        self.waiters: deque[Call] = deque()

    def acquire(self, call: Call) -> bool:
        """Take a connection now (True) or queue `call` for one (False)."""
        if self.in_use < self.size:
            self.in_use += 1
            if self.in_use > self.in_use_max:
                self.in_use_max = self.in_use
            return True
        call.pool_waiting = True
        self.waiters.append(call)
        return False

    def release(self) -> None:
        """Return a connection: hand it to the first call still waiting, if any."""
        waiters = self.waiters
        while waiters:
            call = waiters.popleft()
            if call.pool_waiting:  # withdrawn calls are skipped here, not searched for
                call.pool_waiting = False
                call.granted()
                return
        self.in_use -= 1


class Server:
    """One server of a service: workers, its queue, its pools and its fault state."""

    __slots__ = (
        "blackhole",
        "busy",
        "cpu_free",
        "down",
        "dropped",
        "hung",
        "index",
        "outstanding",
        "pools",
        "queue",
        "queue_max",
        "queued",
        "requests",
        "served",
        "service",
        "slowdown",
        "wasted",
    )

    def __init__(self, service: Service, index: int) -> None:
        self.service = service
        self.index = index
        self.busy = 0
        self.queue: deque[Request] = deque()
        self.queued = 0
        self.queue_max = 0
        self.outstanding = 0
        self.requests = 0
        self.served = 0  # completed for a caller still waiting
        self.wasted = 0  # completed after the caller had left
        self.dropped = 0  # shed, or stopped by a deadline or the caller leaving
        self.slowdown = 1.0
        self.down = False
        self.blackhole = False
        self.hung: set[str | None] = set()
        self.cpu_free = 0.0  # when a loop server's core has done what it was given
        self.pools = {name: Pool(p.size) for name, p in service.spec.pools.items()}

    def spend(self, now: float, seconds: float) -> float:
        """A loop server's core takes `seconds` of work after what it has: when it ends."""
        self.cpu_free = max(now, self.cpu_free) + seconds
        return self.cpu_free

    def release_worker(self, sim: Simulation) -> None:
        """A worker is free: start the next queued request, dropping expired ones."""
        self.busy -= 1
        expired: list[Request] = []
        queue = self.queue
        while queue:
            request = queue.popleft()
            if request.state != QUEUED:
                continue
            self.queued -= 1
            if request.should_shed(sim.loop.now):
                expired.append(request)
                continue
            request.start()
            break
        for request in expired:  # after the worker is taken, so nobody jumps the queue
            request.finish("shed")


class Service:
    """A service's servers, its load balancer and its per-route statistics."""

    __slots__ = (
        "call_lanes",
        "deadline_lane",
        "in_flight",
        "lb",
        "open",
        "pick",
        "policy",
        "routes",
        "samplers",
        "servers",
        "spec",
        "stats",
    )

    def __init__(self, spec: ServiceSpec, seed: int) -> None:
        self.spec = spec
        self.policy: DeadlinePolicy | None = spec.deadline
        self.servers = [Server(self, i) for i in range(spec.servers)]
        self.stats = {name: RouteStats() for name in spec.routes}
        self.routes: dict[str, Route] = spec.routes
        self.in_flight = InFlight()  # handlers running or queued, orphans included
        self.open = InFlight()  # requests whose caller is still connected
        # Limits with one delay per source fire in time order: they wait in lanes.
        self.deadline_lane = Lane()
        self.call_lanes = {name: (Lane(), Lane()) for name in spec.calls}  # total, pool
        self.lb = _Balancer(self.servers, stream(seed, "lb", spec.name))
        self.pick: Callable[[], Server] = getattr(self.lb, spec.lb)
        # One random stream per step: variants of a scenario then see the same draws.
        self.samplers: dict[str, list[Callable[[], float]]] = {
            name: [
                sampler(step.duration, stream(seed, "work", spec.name, name, str(i)))
                if isinstance(step, Work)
                else _never
                for i, step in enumerate(route.steps)
            ]
            for name, route in spec.routes.items()
        }


def stream(seed: int, *purpose: str) -> random.Random:
    """An independent, reproducible random stream for one purpose."""
    return random.Random(":".join((str(seed), *purpose)))


def _never() -> float:
    return math.inf


class _Balancer:
    """The load-balancing policies; each method picks a server for one request."""

    __slots__ = ("_next", "_rng", "_servers")

    def __init__(self, servers: list[Server], rng: random.Random) -> None:
        self._servers = servers
        self._rng = rng
        self._next = 0

    def _healthy(self, server: Server) -> Server:
        # A down server fails health checks; skip it while any other is up.
        if not server.down:
            return server
        for other in self._servers:
            if not other.down:
                return other
        return server

    def round_robin(self) -> Server:
        """Each server in turn."""
        servers = self._servers
        server = servers[self._next % len(servers)]
        self._next += 1
        return self._healthy(server)

    def least_outstanding(self) -> Server:
        """The server with the fewest requests in progress (ties: rotate)."""
        servers = self._servers
        n = len(servers)
        start = self._next % n
        self._next += 1
        best = servers[start]
        for k in range(1, n):
            candidate = servers[(start + k) % n]
            if candidate.outstanding < best.outstanding:
                best = candidate
        return self._healthy(best)

    def p2c(self) -> Server:
        """Power of two choices: the less busy of two servers drawn at random."""
        servers = self._servers
        n = len(servers)
        if n == 1:
            return self._healthy(servers[0])
        draw = self._rng.random
        first = int(draw() * n)
        second = int(draw() * (n - 1))
        if second >= first:
            second += 1
        a, b = servers[first], servers[second]
        return self._healthy(a if a.outstanding <= b.outstanding else b)
