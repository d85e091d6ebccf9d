"""The simulator's model: what a scenario describes, validated and immutable.

A `Model` is one runnable configuration: services (each a group of identical servers
behind a load balancer), the routes they serve, the calls those routes make, the
clients that send load and the faults that strike. A `Scenario` is a named set of
such models, one per variant. `deadlines.sim.scenario` builds these from TOML; nothing
here parses or runs anything. Times are seconds; `None` means "no limit".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from deadlines import Retry

Policy = Literal["round_robin", "least_outstanding", "p2c"]
Arrival = Literal["uniform", "poisson"]
FaultKind = Literal["slow", "hang", "down", "blackhole"]

#: Every policy name a scenario may use for `lb`.
POLICIES: tuple[Policy, ...] = ("round_robin", "least_outstanding", "p2c")


@dataclass(frozen=True, slots=True)
class Distribution:
    """How long one piece of work takes: `kind` with its parameters in seconds.

    Kinds: ``constant`` (`a`), ``exp`` (mean `a`), ``uniform`` (`a` to `b`),
    ``lognormal`` (median `a`, 99th percentile `b`), ``forever`` (never finishes).
    """

    kind: Literal["constant", "exp", "uniform", "lognormal", "forever"]
    a: float = 0.0
    b: float = 0.0

    @property
    def mean(self) -> float:
        """The expected value in seconds (infinite for ``forever``)."""
        if self.kind == "constant":
            return self.a
        if self.kind == "exp":
            return self.a
        if self.kind == "uniform":
            return (self.a + self.b) / 2
        if self.kind == "lognormal":
            sigma = math.log(self.b / self.a) / _Z99
            return self.a * math.exp(sigma * sigma / 2)
        return math.inf


_Z99 = 2.3263478740408408  # the standard normal's 99th percentile


@dataclass(frozen=True, slots=True)
class Work:
    """A step that keeps the handler busy for a while (scaled by the server's slowdown)."""

    duration: Distribution


@dataclass(frozen=True, slots=True)
class Calls:
    """A step that makes one or more calls in parallel and waits for all of them."""

    names: tuple[str, ...]


Step = Work | Calls


@dataclass(frozen=True, slots=True)
class Route:
    """A handler: its steps in order; `commit` marks work that persists when it completes."""

    name: str
    steps: tuple[Step, ...]
    commit: bool = False

    @property
    def work(self) -> float:
        """The mean time its own work steps take (calls not included)."""
        return sum(step.duration.mean for step in self.steps if isinstance(step, Work))


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """A bounded connection pool, FIFO on acquire; `wait` caps the acquire (None: forever)."""

    name: str
    size: int
    wait: float | None = None


@dataclass(frozen=True, slots=True)
class CallSpec:
    """One outbound dependency of a service, with its per-phase limits.

    Args:
        name: How routes refer to it.
        service: Target service.
        route: Target route on that service.
        pool: Name of the caller's pool the call holds a connection from (None: unpooled).
        pool_wait: Cap on waiting for that pool (overrides the pool's own `wait`).
        connect: Cap on the connect phase.
        timeout: Cap on one attempt, pool wait included (the "total").
        min_useful: Below this much of the caller's deadline left, fail fast.
        propagate: Send the caller's remaining time onward.
        fallback: A final failure is replaced by a fallback (the step still succeeds).
        idempotent: Retries after the request was sent are allowed.
        retry: Retry policy (None: one attempt).
    """

    name: str
    service: str
    route: str
    pool: str | None = None
    pool_wait: float | None = None
    connect: float | None = None
    timeout: float | None = None
    min_useful: float = 0.0
    propagate: bool = True
    fallback: bool = False
    idempotent: bool = False
    retry: Retry | None = None


@dataclass(frozen=True, slots=True)
class DeadlinePolicy:
    """How a service treats deadlines (present only where the service uses them).

    Args:
        default: The budget when the caller sends none (None: no deadline then).
        max: The most a caller's header may grant.
        reserve: Taken off the budget on arrival, for the reply's trip back.
        honor_inbound: Use the caller's remaining time (propagation).
        enforce: Stop the handler and its calls when the deadline passes.
        shed: Drop a queued request whose deadline passed instead of starting it.
        shed_short: Also drop one whose remaining time is shorter than the work it
            needs (the route's mean work time times the server's slowdown).
        cancel_on_caller_left: Stop the handler when its caller stops waiting.
    """

    default: float | None = None
    max: float | None = None
    reserve: float = 0.0
    honor_inbound: bool = True
    enforce: bool = True
    shed: bool = True
    shed_short: bool = False
    cancel_on_caller_left: bool = True


@dataclass(frozen=True, slots=True)
class LoopCosts:
    """A server that is one event loop on one core, and what its loop spends per request.

    Its work steps then block the loop: they run one at a time, and a request that
    arrives meanwhile is read (its deadline starts) only when the loop is free, after
    `passes` turns of it.

    Args:
        arrival: The loop's time per request that reaches the server: the connection,
            reading it, the middleware, its answer (served or refused).
        left: The loop's time when a caller gives up on a request: the disconnect
            and the cancelled handler (and the new connection its next request needs).
        passes: The turns of the loop a request needs before its handler runs (for
            a new connection: accept it, set it up, read the data, start the
            handler's task); a busy loop runs a job between two.
    """

    arrival: float = 0.0
    left: float = 0.0
    passes: int = 1


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """A group of identical servers behind one load balancer.

    Args:
        name: The service's name.
        servers: How many servers.
        workers: Requests one server handles at once (None: unbounded, like async code).
        queue_limit: Requests that may wait for a worker (None: unbounded); beyond it,
            a request is rejected at once.
        lb: How the load balancer picks a server.
        connect_time: How long a connect to one of its servers takes.
        routes: Handlers by name.
        pools: The pools each server keeps for its outbound calls, by name.
        calls: Outbound dependencies by name.
        deadline: Deadline handling, or None for a service that ignores deadlines.
        loop: Each server is one event loop on one core with these costs (None: its
            work steps run in parallel, up to `workers`, and requests cost nothing
            beyond them).
    """

    name: str
    servers: int = 1
    workers: int | None = None
    queue_limit: int | None = None
    lb: Policy = "round_robin"
    connect_time: float = 0.0
    routes: dict[str, Route] = field(default_factory=dict)
    pools: dict[str, PoolSpec] = field(default_factory=dict)
    calls: dict[str, CallSpec] = field(default_factory=dict)
    deadline: DeadlinePolicy | None = None
    loop: LoopCosts | None = None


@dataclass(frozen=True, slots=True)
class Fault:
    """Something that goes wrong from `at` until `until` (None: to the end).

    Kinds: ``slow`` (work takes `factor` times longer), ``hang`` (work started meanwhile
    never finishes), ``down`` (connections refused at once), ``blackhole`` (connects
    never complete). `server` picks one server by index (None: all); `route` limits
    ``hang`` to one route (None: all).
    """

    kind: FaultKind
    service: str
    at: float = 0.0
    until: float | None = None
    server: int | None = None
    route: str | None = None
    factor: float = 1.0


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """Clients sending requests to one route, open loop.

    Args:
        name: Label in results (the route's name by default).
        service: Target service.
        route: Target route.
        rate: Requests per second.
        arrival: ``uniform`` (evenly spaced, like the lab's load generator) or ``poisson``.
        start: When the first request may be sent.
        count: Stop after this many requests (None: until the load's end).
        timeout: How long a client waits before giving up (None: forever).
        send_deadline: Send the client's timeout as the request's budget.
    """

    name: str
    service: str
    route: str
    rate: float
    arrival: Arrival = "uniform"
    start: float = 0.0
    count: int | None = None
    timeout: float | None = None
    send_deadline: bool = True


@dataclass(frozen=True, slots=True)
class Model:
    """One runnable configuration: services, load and faults, and how long to run.

    Load is sent for `duration`; the simulation then runs `drain` longer so that
    pending requests can finish or time out. Series are sampled every `sample`
    seconds; latency percentiles over time use windows of `window` seconds.
    """

    services: dict[str, ServiceSpec]
    loads: tuple[LoadSpec, ...]
    faults: tuple[Fault, ...] = ()
    duration: float = 10.0
    drain: float = 0.0
    sample: float = 0.1
    window: float = 1.0


@dataclass(frozen=True, slots=True)
class Scenario:
    """A named experiment: one `Model` per variant, run with the same seed."""

    name: str
    variants: dict[str, Model]
    description: str = ""
    seed: int = 1
