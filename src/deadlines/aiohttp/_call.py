"""`Call`: one attempt's budget, the limit in force, and the timer that bounds it to the head."""

from __future__ import annotations

import asyncio
import contextvars

from .. import _alarms, _clock
from .._budget import CallBudget, Limit
from .._dependency import Dependency
from .._errors import Phase, also
from ..wire import HEADER
from ._lib import aiohttp

#: aiohttp's own timeout for the phase a limit cut (aiohttp counts the pool as connecting).
TIMEOUTS: dict[str, type[aiohttp.ServerTimeoutError]] = {
    "pool": aiohttp.ConnectionTimeoutError,
    "connect": aiohttp.ConnectionTimeoutError,
    "headers": aiohttp.SocketTimeoutError,
    "body": aiohttp.SocketTimeoutError,
}


class Call(CallBudget):
    """One attempt: its budget, the limit in force, and the guard bounding it to the head.

    A `CallBudget` itself (one object per call, not two). The guard is one timer, moved
    along as each phase begins (`arm`).
    """

    __slots__ = ("guard", "in_force", "loop", "queued_at")

    def __init__(self, dependency: Dependency, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(dependency)  # BudgetExhausted here: nothing was sent
        self.loop = loop
        self.in_force: Limit = "total"
        self.queued_at: float | None = None
        self.guard: _alarms.Timeout | None = None

    def at(self, seconds: float) -> float:
        """Loop time `seconds` from now (the budget may run on another monotonic clock)."""
        return self.loop.time() + seconds

    def arm(self, limit: Limit) -> None:
        """Enter the phase bounded by `limit`: start the guard, or move it, to its end."""
        self.in_force = limit
        when = self.at(self.limit(limit))
        if self.guard is None:
            self.guard = _alarms.Timeout(when)
            self.guard.enter(self.loop)  # left by the middleware once the head is in
        else:
            self.guard.reschedule(when)

    def connection_ready(self, request: aiohttp.ClientRequest) -> None:
        """A connection is ours: the request goes out now, with the time left in it."""
        if self.pool_wait is None:
            self.pool_wait = 0.0
        request.headers[HEADER] = self.header_ms()
        self.request_sent = True  # conservatively: from here on it may reach the server
        self.arm("headers")

    def error(self) -> TimeoutError:
        """The error for the limit in force: ours, and aiohttp's own too."""
        if self.pool_wait is None and self.queued_at is not None:
            self.pool_wait = _clock.now() - self.queued_at  # still queued
        # The whole head awaited at once (a connector of the user's): the phase is headers.
        unseen: Phase | None = (
            "headers" if self.in_force == "total" and self.phase is None else None
        )
        error = self.timeout(self.in_force, request_sent=self.request_sent, phase=unseen)
        return also(error, TIMEOUTS[error.phase or "body"])


def translate(call: Call, timer: _alarms.Timeout | None, exc: TimeoutError) -> TimeoutError:
    """The error for `exc` if one of our limits fired, else `exc` itself.

    The one boundary: a timer of ours that fired, or the body's idle timer (aiohttp's
    own ``sock_read``, armed by us), becomes ours.
    """
    if timer is not None and timer.expired():
        return call.error()
    if isinstance(exc, aiohttp.SocketTimeoutError):
        call.in_force = "idle"
        return call.error()
    return exc


current: contextvars.ContextVar[Call | None] = contextvars.ContextVar(
    "deadlines.aiohttp.call", default=None
)
