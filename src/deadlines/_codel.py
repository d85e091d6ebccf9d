"""`CoDel`: shed requests that waited too long in a queue, after CoDel (Nichols, Jacobson).

In the form Facebook uses on request queues. `deadlines.Gate` (the inbound middlewares'
``gate=``) measures each request's queue delay (from its arrival to its handler's
start) and asks it whether to serve the request.
"""

from __future__ import annotations

import threading
from datetime import timedelta

from . import _clock, _validate


class CoDel:
    """Decides, from a request's queue delay, whether to serve it or shed it.

    Each `interval`, it looks at the smallest queue delay seen in the interval. If even
    that exceeded `target`, a standing queue has formed (the service is overloaded)
    and, for the next interval, requests that waited longer than `target` are shed;
    otherwise only those that waited longer than `interval` are. A whole interval
    without any request ends an overload (no queue stood then). A burst that drains
    on its own sheds nothing; a standing queue is cut back to `target`.

    `overloaded` says whether a standing queue was seen in the last interval: the time
    to serve newest first (LIFO), so that the requests served are those whose callers
    are still waiting. Safe to share between threads.

        codel = deadlines.CoDel(target=0.005, interval=0.1)
        if codel.shed(started - arrived):
            ...  # answer 503 at once
    """

    __slots__ = ("_lock", "_lowest", "_until", "interval", "overloaded", "target")

    def __init__(
        self, *, target: float | timedelta = 0.005, interval: float | timedelta = 0.1
    ) -> None:
        self.target = _validate.seconds(target, "target", allow_zero=False)
        self.interval = _validate.seconds(interval, "interval", allow_zero=False)
        if self.target >= self.interval:
            raise ValueError(
                f"target ({self.target} s) must be shorter than interval ({self.interval} s)"
            )
        self._lock = threading.Lock()
        self._lowest = float("inf")
        self._until = _clock.now() + self.interval
        #: A standing queue (above `target` for a whole interval) was seen.
        self.overloaded = False

    def shed(self, queue_delay: float) -> bool:
        """Whether to shed a request that waited `queue_delay` seconds before its start."""
        with self._lock:
            now = _clock.now()
            if now >= self._until:
                # An interval with no request at all had no queue either, and neither
                # has a whole interval gone by since the last one: the busy interval's
                # minimum is stale after an idle period.
                lowest = self._lowest if now < self._until + self.interval else float("inf")
                self.overloaded = self.target < lowest < float("inf")
                self._lowest = float("inf")
                self._until = now + self.interval
            self._lowest = min(self._lowest, queue_delay)
            return queue_delay > (self.target if self.overloaded else self.interval)
