"""`Hedge`: one backup request for a slow idempotent call, after "The Tail at Scale"."""

from __future__ import annotations

from datetime import timedelta

from . import _validate
from ._latency import LatencyEstimate
from ._retry_budget import RetryBudget


class Hedge:
    """When to send a backup of an idempotent call that is slower than usual.

    A call still unanswered after the `quantile` (p95 by default) of the dependency's
    observed latency gets one backup, sent alongside it; the first answer wins and the
    other call is cancelled. A backup is sent only:

    * once `latency` holds enough samples (see `LatencyEstimate.min_samples`);
    * inside the deadline: when, at the moment it would go out, the time left exceeds
      the dependency's median latency;
    * within the cap: backups at most `percent` of the calls over `window` seconds, so
      that a dependency slow for everybody does not get twice the load, plus
      ``min_per_second * window`` so that a quiet dependency can still hedge (at 5 %
      alone, one called less than twice a second over 10 s never could).

    Used by the async clients of `deadlines.httpx` and `deadlines.aiohttp`, for
    idempotent methods or requests with an ``Idempotency-Key``, whose body can be sent
    twice. It holds state (the latency it learns): give each dependency its own.
    """

    __slots__ = ("_cap", "latency", "min_per_second", "percent", "quantile")

    def __init__(
        self,
        *,
        quantile: float = 0.95,
        percent: float = 0.05,
        min_per_second: float = 1.0,
        window: float | timedelta = 10.0,
        samples: int = 256,
        min_samples: int = 20,
    ) -> None:
        self.quantile = _validate.fraction(quantile, "quantile", allow_zero=False)
        self.percent = _validate.fraction(percent, "percent")
        #: The latencies to the response head of the calls that succeeded.
        self.latency = LatencyEstimate(samples, min_samples=min_samples)
        self._cap = RetryBudget(percent=self.percent, min_per_second=min_per_second, window=window)
        self.min_per_second = self._cap.min_per_second

    def delay(self, remaining: float) -> float | None:
        """Seconds to wait before a backup of a call starting now; None: no backup.

        Counts the call toward the cap. `remaining` is the time left before the
        deadline (inf without one).
        """
        self._cap.deposit()
        after = self.latency.quantile(self.quantile)
        median = self.latency.quantile(0.5)
        if after is None or median is None or after + median >= remaining:
            return None
        return after

    def allow(self) -> bool:
        """Take one backup from the cap, as it is about to be sent: False when spent."""
        return self._cap.withdraw()

    def __repr__(self) -> str:
        return (
            f"Hedge(quantile={self.quantile}, percent={self.percent},"
            f" min_per_second={self.min_per_second})"
        )
