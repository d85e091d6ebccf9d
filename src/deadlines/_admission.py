"""`Admission`: refuse at arrival the requests that cannot be answered in time.

`deadlines.Gate` (the inbound middlewares' ``gate=``) asks it when a request arrives
and when its work starts, and tells it each request's service time when it ends.
"""

from __future__ import annotations

import math
import threading
from datetime import timedelta
from typing import Literal

from . import _validate
from ._latency import LatencyEstimate
from ._retry_budget import RetryBudget

#: ``"admit"``; ``"late"``: the deadline had passed on arrival (answer 504);
#: ``"shed"``: too little time left for the route's usual service time (answer 503).
Decision = Literal["admit", "late", "shed"]


class Admission:
    """Per route, whether a request arriving with some time left is worth starting.

    Each route's service time is learned live (a `LatencyEstimate` per route, bounded
    memory; at most `max_routes` routes are learned, others are always admitted). A
    request is refused when its remaining budget is already spent (``"late"``), or less
    than the route's `quantile` of service time (``"shed"``). Refusals are kept within
    a rejection budget, as Finagle's ``DeadlineFilter`` does: at most
    `rejection_budget` of the requests over `window` seconds; past that, requests are
    admitted and run into their deadline as they would without admission.

        admission = deadlines.Admission()
        decision = admission.decide("/quote", deadlines.remaining())  # on arrival
        ...
        decision = admission.recheck("/quote", deadlines.remaining())  # after a wait
        ...
        admission.observe("/quote", service_time)
    """

    __slots__ = (
        "_estimates",
        "_lock",
        "_rejections",
        "max_routes",
        "min_samples",
        "quantile",
        "samples",
    )

    def __init__(
        self,
        *,
        quantile: float = 0.5,
        rejection_budget: float = 0.2,
        window: float | timedelta = 10.0,
        samples: int = 256,
        min_samples: int = 20,
        max_routes: int = 1000,
    ) -> None:
        self.quantile = _validate.fraction(quantile, "quantile", allow_zero=False)
        self.samples = _validate.count(samples, "samples", high=100_000)
        self.min_samples = _validate.count(min_samples, "min_samples", high=samples)
        self.max_routes = _validate.count(max_routes, "max_routes")
        self._rejections = RetryBudget(
            percent=_validate.fraction(rejection_budget, "rejection_budget"),
            min_per_second=0.0,
            window=window,
        )
        self._estimates: dict[str, LatencyEstimate] = {}
        self._lock = threading.Lock()

    def expected(self, route: str) -> float | None:
        """The service time expected on `route`; None until it has been learned."""
        estimate = self._estimates.get(route)
        return None if estimate is None else estimate.quantile(self.quantile)

    def decide(self, route: str, remaining: float) -> Decision:
        """Whether to start a request on `route` with `remaining` seconds to answer.

        Call it once per request, on arrival: it counts the request in the rejection
        budget's base."""
        self._rejections.deposit()
        return self.recheck(route, remaining)

    def recheck(self, route: str, remaining: float) -> Decision:
        """`decide` again for a request already counted (its work is about to start
        after a wait): a refusal draws on the same rejection budget, and the request is
        not counted a second time."""
        if remaining <= 0.0:
            decision: Decision = "late"
        else:
            expected = self.expected(route)
            if expected is None or remaining >= expected:
                return "admit"
            decision = "shed"
        return decision if self._rejections.withdraw() else "admit"

    def observe(self, route: str, service_time: float | timedelta) -> None:
        """Learn that a request on `route` took `service_time` to serve."""
        estimate = self._estimates.get(route)
        if estimate is None:
            with self._lock:
                if len(self._estimates) >= self.max_routes:
                    return
                estimate = self._estimates.setdefault(
                    route, LatencyEstimate(self.samples, min_samples=self.min_samples)
                )
        estimate.add(service_time)

    def retry_after(self, route: str) -> int:
        """Seconds for a ``Retry-After`` header on a refusal: the service time, at least 1."""
        expected = self.expected(route)
        return max(1, math.ceil(expected or 0.0))
