"""The monotonic clock every `Deadline` reads, swappable for tests.

Production code reads `time.monotonic`; `deadlines.testing.FakeClock` installs itself
here so that deadlines and scopes can be tested exactly, without sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# Seconds on the current monotonic clock. Rebound by `install`, not wrapped: it is read
# several times per request and per call, and a Python frame around it would cost more
# than the clock itself. Callers write ``_clock.now()`` so that they see the rebinding.
now: Callable[[], float] = time.monotonic


def install(source: Callable[[], float]) -> Callable[[], float]:
    """Make `source` the clock and return the one it replaced."""
    global now
    previous, now = now, source
    return previous
