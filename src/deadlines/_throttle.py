"""`Throttle`: client-side adaptive throttling, after Google's SRE book ("Handling Overload")."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from datetime import timedelta

from . import _validate
from ._window import Window

_REQUESTS, _ACCEPTS = 0, 1

#: Response statuses that say "overloaded": not an accept, a sign to back off.
OVERLOAD_STATUSES: frozenset[int] = frozenset({429, 503})


class Throttle:
    """Refuses calls locally, with the probability the dependency is refusing them anyway.

    Over the last `window` seconds the client counts *requests* (attempts, including
    those it refused itself) and *accepts* (attempts the dependency answered with
    something other than an overload status, `OVERLOAD_STATUSES`; a timeout or a
    connection failure is not an accept). A new call is refused at once, with
    probability ``max(0, (requests - k * accepts) / (requests + 1))``, raising
    `deadlines.CallRefused`. With ``k = 2`` the client sends up to twice what the
    dependency accepts: a healthy dependency sees no refusals; an overloaded one sees
    about twice what it can take instead of everything every client has.

    It holds state: give each dependency its own. Safe to share between threads.
    `rand` draws the uniform number each decision compares with (tests fix it).
    """

    __slots__ = ("_lock", "_rand", "_window", "k", "window")

    def __init__(
        self,
        *,
        k: float = 2.0,
        window: float | timedelta = 120.0,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if isinstance(k, bool) or not isinstance(k, int | float):
            raise TypeError(f"k must be a number, not {k!r}")
        if not 1.0 <= k <= 100.0:  # NaN fails too
            raise ValueError(f"k must be between 1 and 100, got {k}")
        self.k = float(k)
        self.window = _validate.seconds(window, "window", allow_zero=False)
        self._window = Window(self.window, 2)
        self._rand = rand
        self._lock = threading.Lock()

    def probability(self) -> float:
        """The chance that the next call is refused, from the counts in the window."""
        with self._lock:
            requests, accepts = self._window.totals()
        return max(0.0, (requests - self.k * accepts) / (requests + 1))

    def admit(self) -> bool:
        """Whether the next call may go out; a refusal counts as a request."""
        refused = self._rand() < self.probability()
        if refused:
            with self._lock:
                self._window.add(_REQUESTS)
        return not refused

    def record(self, accepted: bool) -> None:
        """Count an attempt that ended: answered (`accepted`) or refused or failed."""
        with self._lock:
            self._window.add(_REQUESTS)
            if accepted:
                self._window.add(_ACCEPTS)

    def __repr__(self) -> str:
        return f"Throttle(k={self.k}, window={self.window})"
