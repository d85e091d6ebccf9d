"""Helpers for the outbound tests: counting file descriptors, timing tolerances."""

from __future__ import annotations

import os
import time

#: Firing tolerance: early by at most 10 ms, late by at most 500 ms (a loaded 2-core box).
EARLY = 0.01
LATE = 0.5


def open_fds() -> int:
    """File descriptors open in this process (servers and clients alike)."""
    return len(os.listdir("/proc/self/fd"))


def fds_settle(baseline: int, timeout: float = 2.0) -> int:
    """Wait until the fd count is back to `baseline` (or `timeout`); return the count."""
    end = time.monotonic() + timeout
    while (count := open_fds()) != baseline and time.monotonic() < end:
        time.sleep(0.01)
    return count


def fired_at(elapsed: float, limit: float) -> bool:
    """Whether a limit of `limit` seconds fired on time, within the tolerance."""
    return limit - EARLY <= elapsed <= limit + LATE
