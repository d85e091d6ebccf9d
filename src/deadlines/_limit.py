"""`AdaptiveLimit`: a concurrency limit that follows the dependency's latency (a gradient).

After Envoy's adaptive concurrency and Netflix's concurrency-limits (Gradient): the
limit grows while latency stays near the dependency's unloaded latency and shrinks, in
proportion, as latency rises above it (queueing somewhere downstream), or when calls
fail.
"""

from __future__ import annotations

import math
import threading

from . import _validate


class AdaptiveLimit:
    """How many calls to a dependency may be in flight, learned from their latency.

    Each call that ends brings a sample: its latency to the response head, or none
    when it timed out, failed or was refused for overload. From the samples:

    * the unloaded latency: the smallest of the last `baseline_window` to
      2 × `baseline_window` samples (so that it follows a dependency that got slower);
    * gradient = ``clamp(tolerance * unloaded / sample, 0.5, 1)``: 1 while the sample
      stays within `tolerance` times the unloaded latency, less as it rises above;
    * new limit = ``limit * gradient + sqrt(limit)`` (room to grow), smoothed by
      `smoothing`, within [`min_limit`, `max_limit`]; a call that failed cuts the
      limit by 10 %. While fewer than half the places are used, the limit stays put:
      the latency says nothing about a limit that is not reached.

    A call over the limit is refused at once (`deadlines.CallRefused`, reason
    ``"limit"``) rather than queued: a queue in front of an overloaded dependency adds
    only waiting. The dependency's ``pool_size`` stays the hard ceiling.

    It holds state: give each dependency its own. Safe to share between threads.
    """

    __slots__ = (
        "_count",
        "_limit",
        "_lock",
        "_lowest",
        "_lowest_before",
        "baseline_window",
        "in_flight",
        "max_limit",
        "min_limit",
        "smoothing",
        "tolerance",
    )

    def __init__(
        self,
        *,
        initial: int = 20,
        min_limit: int = 1,
        max_limit: int = 1000,
        tolerance: float = 1.5,
        smoothing: float = 0.2,
        baseline_window: int = 500,
    ) -> None:
        self.min_limit = _validate.count(min_limit, "min_limit", high=100_000)
        self.max_limit = _validate.count(max_limit, "max_limit", low=min_limit, high=100_000)
        initial = _validate.count(initial, "initial", high=100_000)
        if not min_limit <= initial <= max_limit:
            raise ValueError(
                f"initial must be between min_limit ({min_limit}) and max_limit"
                f" ({max_limit}), got {initial}"
            )
        if isinstance(tolerance, bool) or not isinstance(tolerance, int | float):
            raise TypeError(f"tolerance must be a number, not {tolerance!r}")
        if not 1.0 <= tolerance <= 100.0:  # NaN fails too
            raise ValueError(f"tolerance must be between 1 and 100, got {tolerance}")
        self.tolerance = float(tolerance)
        self.smoothing = _validate.fraction(smoothing, "smoothing", allow_zero=False)
        self.baseline_window = _validate.count(baseline_window, "baseline_window")
        self._limit = float(initial)
        self._lowest = self._lowest_before = math.inf  # this window's and the last one's
        self._count = 0
        #: Calls holding a place now.
        self.in_flight = 0
        self._lock = threading.Lock()

    @property
    def limit(self) -> int:
        """Calls allowed in flight now."""
        return int(self._limit)

    def acquire(self) -> bool:
        """Take a place for a call: False (nothing taken) when the limit is reached."""
        with self._lock:
            if self.in_flight >= int(self._limit):
                return False
            self.in_flight += 1
            return True

    def release(self, latency: float | None, *, failed: bool = False) -> int | None:
        """Give a place back with the call's `latency`; the new limit if it changed.

        `failed`: the call timed out, failed or was refused for overload (the limit is
        cut). Neither a latency nor `failed` (a call cancelled by its caller, or by a
        hedge that won): the limit is left as it is.
        """
        with self._lock:
            in_flight = self.in_flight
            self.in_flight -= 1
            before = int(self._limit)
            if failed:
                self._limit = max(float(self.min_limit), self._limit * 0.9)
            elif latency is not None:
                self._sample(max(latency, 1e-6), in_flight)
            after = int(self._limit)
        return after if after != before else None

    def _sample(self, latency: float, in_flight: int) -> None:
        self._lowest = min(self._lowest, latency)
        self._count += 1
        unloaded = min(self._lowest, self._lowest_before)
        if self._count >= self.baseline_window:
            self._lowest_before, self._lowest, self._count = self._lowest, math.inf, 0
        limit = self._limit
        if in_flight < limit / 2:
            return
        gradient = max(0.5, min(1.0, self.tolerance * unloaded / latency))
        wanted = limit * gradient + math.sqrt(limit)
        limit = limit * (1.0 - self.smoothing) + wanted * self.smoothing
        self._limit = min(float(self.max_limit), max(float(self.min_limit), limit))

    def __repr__(self) -> str:
        return f"AdaptiveLimit(limit={self.limit}, in_flight={self.in_flight})"
