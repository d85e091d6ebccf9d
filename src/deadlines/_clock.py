"""The monotonic clock every `Deadline` reads, swappable for tests.

Production code reads `time.monotonic`; `deadlines.testing.FakeClock` installs itself
here so that deadlines and scopes can be tested exactly, without sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable

_now: Callable[[], float] = time.monotonic


def now() -> float:
    """Seconds on the current monotonic clock."""
    return _now()


def install(source: Callable[[], float]) -> Callable[[], float]:
    """Make `source` the clock and return the one it replaced."""
    global _now
    previous, _now = _now, source
    return previous
