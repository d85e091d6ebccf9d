"""A call from one service's handler to another service: pool, connect, send, wait.

Each attempt takes a connection from the caller's pool (FIFO, a wait cap), connects and
sends; its timeout covers the pool wait. Failures before sending are safe to retry; a
call that gives up releases its connection at once. The handler that makes the call is
a `engine.Request`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .loop import Timer
from .model import CallSpec
from .servers import Pool, Server

if TYPE_CHECKING:
    from .engine import Request, Simulation

#: Failures that happened before the request reached a server: safe to retry.
UNSENT_CAUSES = frozenset({"pool_timeout", "connect_timeout", "refused", "rejected", "shed"})


class Call:
    """One outbound call from a handler: pool, connect, send, wait; retries; fallback."""

    __slots__ = (
        "active",
        "asked_at",
        "attempts",
        "cause",
        "child",
        "holding",
        "lanes",
        "owner",
        "phase_timer",
        "pool",
        "pool_wait",
        "pool_waiting",
        "server",
        "sim",
        "spec",
        "stats",
        "timer",
    )

    def __init__(self, sim: Simulation, owner: Request, spec: CallSpec) -> None:
        self.sim = sim
        self.owner = owner
        self.spec = spec
        self.stats = sim.call_stats[owner.service.spec.name][spec.name]
        self.stats.requests += 1
        self.lanes = owner.service.call_lanes[spec.name]
        self.active = True
        self.attempts = 0
        self.asked_at = 0.0
        self.cause: str | None = None
        self.child: Request | None = None
        self.server: Server | None = None
        self.timer: Timer | None = None  # the attempt's total limit, or the retry sleep
        self.phase_timer: Timer | None = None  # pool wait, connect, or an immediate failure
        self.holding = False
        self.pool_waiting = False
        self.pool: Pool | None = None
        self.pool_wait: float | None = None
        if spec.pool is not None:
            self.pool = owner.server.pools[spec.pool]
            self.pool_wait = owner.service.spec.pools[spec.pool].wait
            if spec.pool_wait is not None:
                self.pool_wait = spec.pool_wait

    def attempt(self) -> None:
        """Start one attempt: fail fast when too little time is left, else take a connection."""
        loop = self.sim.loop
        now = loop.now
        remaining = self.owner.deadline - now
        if remaining <= 0 or remaining < self.spec.min_useful:
            self._fail_soon("budget_exhausted")
            return
        self.attempts += 1
        self.stats.attempts += 1
        if self.spec.timeout is not None:
            when = now + self.spec.timeout
            self.timer = loop.at_in(self.lanes[0], when, Call.on_timeout, self)
        pool = self.pool
        if pool is None:
            self.connect()
        elif pool.acquire(self):
            self.holding = True
            self.stats.pool_waited(0.0)
            self.connect()
        else:
            self.asked_at = now
            if self.pool_wait is not None:
                when = now + self.pool_wait
                self.phase_timer = loop.at_in(self.lanes[1], when, Call.on_pool_timeout, self)

    def granted(self) -> None:
        """The pool handed this waiting call a connection."""
        self.holding = True
        self.sim.loop.cancel(self.phase_timer)
        self.phase_timer = None
        self.stats.pool_waited(self.sim.loop.now - self.asked_at)
        self.connect()

    def connect(self) -> None:
        """Pick a server and connect to it (instantly unless the service says otherwise)."""
        target = self.sim.services[self.spec.service]
        server = target.pick()
        if server.down:
            self._fail_soon("refused")
            return
        delay = math.inf if server.blackhole else target.spec.connect_time
        cap = self.spec.connect
        loop = self.sim.loop
        if cap is not None and cap < delay:
            self.phase_timer = loop.after(cap, Call.on_connect_timeout, self)
        elif delay == 0.0:
            self.send(server)
        elif delay < math.inf:
            self.server = server
            self.phase_timer = loop.after(delay, Call.connected, self)

    def connected(self) -> None:
        """The connect phase ended: send."""
        self.phase_timer = None
        server, self.server = self.server, None
        assert server is not None
        self.send(server)

    def send(self, server: Server) -> None:
        """Send the request, with the caller's remaining time when it propagates."""
        owner = self.owner
        told = None
        if self.spec.propagate and owner.deadline < math.inf:
            told = owner.deadline - self.sim.loop.now
        self.child = self.sim.arrive(
            server, self.spec.route, self, told, traced=owner.trace is not None
        )

    # How an attempt ends.

    def on_response(self, child: Request, cause: str | None) -> None:
        """The callee answered."""
        if child is self.child:
            self.child = None
            self.end_attempt(cause)

    def on_timeout(self) -> None:
        """The attempt's total limit fired."""
        self.timer = None
        self.end_attempt("timeout")

    def on_pool_timeout(self) -> None:
        """Waited too long for a connection."""
        self.phase_timer = None
        self.end_attempt("pool_timeout")

    def on_connect_timeout(self) -> None:
        """The connect did not complete in time."""
        self.phase_timer = None
        self.end_attempt("connect_timeout")

    def _fail_soon(self, cause: str) -> None:
        self.cause = cause
        self.phase_timer = self.sim.loop.at(self.sim.loop.now, Call._failed, self)

    def _failed(self) -> None:
        self.phase_timer = None
        self.end_attempt(self.cause)

    def _stop_waiting(self) -> None:
        """Stop every wait of the current attempt; the callee is told its caller left."""
        loop = self.sim.loop
        loop.cancel(self.timer)
        loop.cancel(self.phase_timer)
        self.timer = self.phase_timer = None
        self.pool_waiting = False  # the pool skips a withdrawn waiter
        self.server = None
        child = self.child
        if child is not None:
            self.child = None
            child.caller_left()
        if self.holding:  # closing the connection frees it at once
            self.holding = False
            assert self.pool is not None
            self.pool.release()

    def end_attempt(self, cause: str | None) -> None:
        """Settle an attempt: success, a retry after a backoff, or a final failure."""
        self._stop_waiting()
        if cause is not None:
            backoff = self._retry_backoff(cause)
            if backoff is not None:
                self.stats.retries += 1
                self.timer = self.sim.loop.after(backoff, Call.retry, self)
                return
            if self.spec.fallback:
                self.stats.fallbacks += 1
        self.stats.end(cause)
        self.owner.call_done(self, cause)

    def retry(self) -> None:
        """The backoff sleep ended: try again."""
        self.timer = None
        self.attempt()

    def _retry_backoff(self, cause: str) -> float | None:
        """The sleep before another attempt, or None when the rules allow none."""
        retry = self.spec.retry
        if retry is None or self.attempts >= retry.attempts:
            return None
        if cause in ("deadline", "budget_exhausted"):
            return None  # the shared budget is spent: another attempt cannot help
        if cause not in UNSENT_CAUSES and not self.spec.idempotent:
            return None  # the request was sent: its outcome is unknown
        backoff = retry.backoff_for(self.attempts, self.sim.retry_rng.random())
        if self.owner.deadline - self.sim.loop.now <= retry.expected + backoff:
            return None
        return backoff

    def cancel(self) -> None:
        """The handler is finishing: abandon the call."""
        self.active = False
        self._stop_waiting()
