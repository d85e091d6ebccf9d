"""`LatencyEstimate`: a service time learned live from the last samples, in bounded memory."""

from __future__ import annotations

import threading
from datetime import timedelta

from . import _validate


class LatencyEstimate:
    """Quantiles of the last `size` latencies seen (seconds), in a fixed ring.

    Memory is bounded by `size` whatever the traffic; old samples are overwritten, so
    the estimate follows the service as it speeds up or slows down. Quantiles are
    None until `min_samples` have been seen. Safe to share between threads.

        estimate = deadlines.LatencyEstimate()
        estimate.add(0.120)
        estimate.quantile(0.95)    # None until 20 samples
    """

    __slots__ = ("_lock", "_next", "_ring", "_sorted", "min_samples", "size")

    def __init__(self, size: int = 256, *, min_samples: int = 20) -> None:
        self.size = _validate.count(size, "size", high=100_000)
        self.min_samples = _validate.count(min_samples, "min_samples", high=size)
        self._ring: list[float] = []
        self._next = 0
        self._sorted: list[float] | None = None
        self._lock = threading.Lock()

    def add(self, seconds: float | timedelta) -> None:
        """Record one latency."""
        value = _validate.seconds(seconds, "seconds")
        with self._lock:
            if len(self._ring) < self.size:
                self._ring.append(value)
            else:
                self._ring[self._next] = value
                self._next = (self._next + 1) % self.size
            self._sorted = None

    @property
    def count(self) -> int:
        """How many samples are held (at most `size`)."""
        return len(self._ring)

    def quantile(self, q: float) -> float | None:
        """The `q` quantile (0.5: the median) of the samples held; None when too few."""
        q = _validate.fraction(q, "q")
        with self._lock:
            if len(self._ring) < self.min_samples:
                return None
            ordered = self._sorted
            if ordered is None:
                ordered = self._sorted = sorted(self._ring)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    def __repr__(self) -> str:
        return f"LatencyEstimate(size={self.size}, count={self.count})"
