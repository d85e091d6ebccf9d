"""One structured log record per timeout, with the standard library's `logging`.

    import logging
    from deadlines import logs

    logs.install()                  # logger "deadlines", level WARNING

Every outbound call that ends in a timeout (a dependency's own cap, or the request's
deadline) logs one record, with the details as record attributes (``extra``) that a
JSON formatter emits as fields:

| attribute | meaning |
|---|---|
| `dependency` | `Dependency.name` |
| `outcome` | ``"timeout"`` (the dependency's cap) or ``"deadline"`` (the request's) |
| `phase` | ``pool``, ``connect``, ``headers``, ``body`` (None if unknown) |
| `limit` | the limit that fired, seconds (None if unknown) |
| `elapsed` | seconds the call took |
| `pool_wait` | seconds spent waiting for a pooled connection (None if not measured) |
| `request_sent` | False: safe to retry; True: the outcome is unknown |

The message says the same for people::

    pricing: headers timeout after 2003 ms (limit 2000 ms, pool wait 0 ms);
    request sent, outcome unknown
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import TracebackType

from . import _events

__all__ = ["TimeoutLog", "install"]


def _ms(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds * 1000:.0f} ms"


class TimeoutLog:
    """Logs each timeout to `logger` at `level` until `uninstall`."""

    def __init__(self, logger: logging.Logger, level: int) -> None:
        self.logger = logger
        self.level = level
        self._unsubscribe: Callable[[], None] | None = None

    def _observe(self, event: _events.Event) -> None:
        if not isinstance(event, _events.CallFinished):
            return
        outcome = event.outcome
        if outcome not in ("timeout", "deadline") or not self.logger.isEnabledFor(self.level):
            return
        what = "deadline exceeded" if outcome == "deadline" else "timeout"
        phase = event.phase or "unknown phase"
        pool = "" if event.pool_wait is None else f", pool wait {_ms(event.pool_wait)}"
        request_sent = event.request_sent
        if request_sent is None:
            sent = "unknown whether the request was sent"
        elif request_sent:
            sent = "request sent, outcome unknown"
        else:
            sent = "request not sent, safe to retry"
        self.logger.log(
            self.level,
            "%s: %s %s after %s (limit %s%s); %s",
            event.dependency,
            phase,
            what,
            _ms(event.duration),
            _ms(event.limit),
            pool,
            sent,
            extra={
                "dependency": event.dependency,
                "outcome": outcome,
                "phase": event.phase,
                "limit": event.limit,
                "elapsed": event.duration,
                "pool_wait": event.pool_wait,
                "request_sent": request_sent,
            },
        )

    def uninstall(self) -> None:
        """Stop logging timeouts (idempotent)."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None

    def __enter__(self) -> TimeoutLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.uninstall()


def install(logger: logging.Logger | None = None, level: int = logging.WARNING) -> TimeoutLog:
    """Log one record per outbound timeout to `logger` (``"deadlines"`` by default).

    Returns the `TimeoutLog` handle; `uninstall()` it (or use it in a ``with``) to stop.
    """
    if isinstance(level, bool) or not isinstance(level, int):
        raise TypeError(f"level must be a logging level int, not {level!r}")
    handle = TimeoutLog(logging.getLogger("deadlines") if logger is None else logger, level)
    handle._unsubscribe = _events.observe(handle._observe)
    return handle
