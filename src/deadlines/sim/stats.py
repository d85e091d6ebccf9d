"""Recorders the engine updates as it runs: counts, latencies, in-flight integrals.

Kept apart from the engine so that what is measured can be read in one place.
Everything here is mutable and cheap to update; `result.py` turns it into the
immutable figures a user sees, with the percentile every tool uses
(`deadlines._tools.stats`).
"""

from __future__ import annotations

from array import array


class InFlight:
    """A count over time: its current value, maximum and time integral (for the mean)."""

    __slots__ = ("_area", "_last", "_since", "max", "value")

    def __init__(self, since: float = 0.0) -> None:
        self.value = 0
        self.max = 0
        self._area = 0.0
        self._last = since
        self._since = since

    def add(self, now: float, delta: int) -> None:
        """Change the count by `delta` at simulated time `now`."""
        self._area += self.value * (now - self._last)
        self._last = now
        self.value += delta
        if self.value > self.max:
            self.max = self.value

    def mean(self, now: float) -> float:
        """The time-weighted mean count from the start until `now`."""
        span = now - self._since
        if span <= 0:
            return float(self.value)
        return (self._area + self.value * (now - self._last)) / span


class Outcomes:
    """How requests ended: successes and failures by cause."""

    __slots__ = ("causes", "ok", "requests")

    def __init__(self) -> None:
        self.requests = 0
        self.ok = 0
        self.causes: dict[str, int] = {}

    def end(self, cause: str | None) -> None:
        """Count one request that ended with `cause` (None: success)."""
        if cause is None:
            self.ok += 1
        else:
            self.causes[cause] = self.causes.get(cause, 0) + 1

    @property
    def failed(self) -> int:
        """Requests that ended in a failure."""
        return sum(self.causes.values())


class LoadStats(Outcomes):
    """What the clients of one load saw: outcomes and the time each one waited."""

    __slots__ = ("latencies", "oks", "sent", "window", "windows")

    def __init__(self, window: float) -> None:
        super().__init__()
        self.latencies = array("d")
        self.sent = array("d")  # when each request in `latencies` was sent
        self.oks = bytearray()  # and whether it succeeded (1) or not (0)
        self.window = window
        #: window index (send time // window) -> latencies of the requests sent in it
        self.windows: dict[int, list[float]] = {}

    def record(self, now: float, latency: float, cause: str | None) -> None:
        """One client got an answer (or gave up) after `latency` seconds."""
        self.end(cause)
        self.latencies.append(latency)
        sent = now - latency
        self.sent.append(sent)
        self.oks.append(cause is None)
        index = int(sent / self.window)
        bucket = self.windows.get(index)
        if bucket is None:
            self.windows[index] = [latency]
        else:
            bucket.append(latency)


class RouteStats(Outcomes):
    """One route on one service, seen from the servers: in flight, latency, queue wait."""

    __slots__ = ("in_flight", "latency_sum", "queue_wait_count", "queue_wait_sum")

    def __init__(self) -> None:
        super().__init__()
        self.in_flight = InFlight()
        self.latency_sum = 0.0
        self.queue_wait_sum = 0.0
        self.queue_wait_count = 0


class CallStats(Outcomes):
    """One dependency as its callers saw it: attempts, retries, fallbacks, pool waits."""

    __slots__ = (
        "attempts",
        "fallbacks",
        "pool_wait_count",
        "pool_wait_max",
        "pool_wait_sum",
        "retries",
    )

    def __init__(self) -> None:
        super().__init__()
        self.attempts = 0
        self.fallbacks = 0
        self.retries = 0
        self.pool_wait_sum = 0.0
        self.pool_wait_count = 0
        self.pool_wait_max = 0.0

    def pool_waited(self, seconds: float) -> None:
        """A connection was granted after `seconds` in the pool's queue."""
        self.pool_wait_sum += seconds
        self.pool_wait_count += 1
        if seconds > self.pool_wait_max:
            self.pool_wait_max = seconds


class TraceRecord:
    """What one service did for the first (traced) client request; times in seconds."""

    __slots__ = (
        "answered",
        "budget",
        "committed",
        "finished",
        "gave_up",
        "started",
        "status",
        "stopped",
    )

    def __init__(self, started: float, budget: float | None) -> None:
        self.started = started
        self.budget = budget
        self.answered: float | None = None
        self.status: int | None = None
        self.gave_up: float | None = None
        self.stopped: float | None = None
        self.finished: float | None = None
        self.committed = False
