"""`RetryBudget`: retries at most a share of calls plus a small floor, as Finagle and Envoy do."""

from __future__ import annotations

import threading
from datetime import timedelta

from . import _validate
from ._window import Window

_CALLS, _RETRIES = 0, 1


class RetryBudget:
    """Allows retries up to `percent` of the calls, plus `min_per_second`, over `window`.

    Per-call retry limits (``Retry.attempts``) do not stop a retry storm: when a
    dependency fails for everybody, every caller retries, and the load it sees is
    multiplied by the attempts. A budget caps retries for the dependency as a whole:
    over the last `window` seconds, the retries may be at most ``percent`` of the calls
    plus ``min_per_second * window`` (so that a quiet client can still retry).

        dependency = deadlines.Dependency(
            "pricing", retry=deadlines.Retry(), retry_budget=deadlines.RetryBudget(percent=0.1)
        )

    It holds state: give each dependency its own (a budget shared by several
    dependencies is one budget for all of them). Safe to share between threads.
    """

    __slots__ = ("_lock", "_window", "min_per_second", "percent", "window")

    def __init__(
        self,
        *,
        percent: float = 0.2,
        min_per_second: float = 10.0,
        window: float | timedelta = 10.0,
    ) -> None:
        self.percent = _validate.fraction(percent, "percent")
        if isinstance(min_per_second, bool) or not isinstance(min_per_second, int | float):
            raise TypeError(f"min_per_second must be a number, not {min_per_second!r}")
        if not 0.0 <= min_per_second <= 1e6:  # NaN fails too
            raise ValueError(f"min_per_second must be between 0 and 1e6, got {min_per_second}")
        self.min_per_second = float(min_per_second)
        self.window = _validate.seconds(window, "window", allow_zero=False)
        self._window = Window(self.window, 2)
        self._lock = threading.Lock()

    def deposit(self) -> None:
        """Count one call (its first attempt)."""
        with self._lock:
            self._window.add(_CALLS)

    def withdraw(self) -> bool:
        """Take one retry from the budget: False (and nothing taken) when it is spent."""
        with self._lock:
            calls, retries = self._window.totals()
            if retries + 1 > self.percent * calls + self.min_per_second * self.window:
                return False
            self._window.add(_RETRIES)
            return True

    def __repr__(self) -> str:
        return (
            f"RetryBudget(percent={self.percent}, min_per_second={self.min_per_second},"
            f" window={self.window})"
        )
