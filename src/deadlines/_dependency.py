"""`Dependency`: the timeout policy for one downstream, which integrations turn into clients."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

from . import _validate
from ._hedge import Hedge
from ._limit import AdaptiveLimit
from ._retry_budget import RetryBudget
from ._throttle import Throttle

#: Methods that may be retried after the request was sent (RFC 9110 idempotent methods).
IDEMPOTENT_METHODS: frozenset[str] = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})


@dataclass(frozen=True, slots=True)
class Retry:
    """When and how often a call to a dependency may be tried again, inside the deadline.

    A retry happens only when the remaining budget exceeds `expected` (the time one
    attempt usually takes) plus the backoff sleep. Failures before the request was sent
    (pool, connect) are retried for every method; failures after it was sent only for
    idempotent methods or requests carrying an ``Idempotency-Key`` header.
    """

    attempts: int = 3
    backoff: float = 0.05
    max_backoff: float = 1.0
    multiplier: float = 2.0
    jitter: bool = True
    expected: float = 0.0
    statuses: frozenset[int] = frozenset({502, 503, 504})

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise TypeError(f"attempts must be an int, not {self.attempts!r}")
        if not 1 <= self.attempts <= 100:
            raise ValueError(f"attempts must be between 1 and 100, got {self.attempts}")
        for name in ("backoff", "max_backoff", "expected"):
            object.__setattr__(self, name, _validate.seconds(getattr(self, name), name))
        if not (math.isfinite(self.multiplier) and self.multiplier >= 1.0):
            raise ValueError(f"multiplier must be >= 1, got {self.multiplier}")
        object.__setattr__(self, "statuses", frozenset(self.statuses))

    def backoff_for(self, retry_number: int, rand: float = 1.0) -> float:
        """Sleep before retry number `retry_number` (1 for the first retry).

        With `jitter`, `rand` in [0, 1] scales it ("full jitter").
        """
        base = min(self.max_backoff, self.backoff * self.multiplier ** (retry_number - 1))
        return base * rand if self.jitter else base


@dataclass(frozen=True, slots=True, init=False)
class Dependency:
    """Per-phase limits and pool size for one downstream service. Times in seconds.

    Each effective limit is the smaller of the cap here and the time left before the
    request's deadline. Defaults are bounded: nothing waits forever.

    Args:
        name: Label for errors and metrics (low cardinality: a service, not a URL).
        connect: DNS + TCP connect + TLS handshake.
        headers: Time to the first byte of the response after sending the request.
        idle: Longest silence between two chunks of the body.
        total: The whole call, pool wait and body included.
        pool_size: Connections kept for this dependency alone (a bulkhead).
        pool_wait: Longest wait for a free pooled connection.
        min_useful: Below this much remaining budget, fail fast (`BudgetExhausted`)
            instead of sending work that cannot finish. Use the callee's p50.
        retry: A `Retry` policy, or None for a single attempt.
        retry_budget: A `RetryBudget`: retries at most a share of the calls (per
            dependency, whatever each call's `Retry` allows). None: no cap.
        throttle: A `Throttle`: refuse calls locally as the dependency refuses them
            (adaptive throttling). None: never.
        limit: An `AdaptiveLimit`: calls in flight at most a limit learned from the
            latency, refused at once above it. None: ``pool_size`` alone bounds them.
        hedge: A `Hedge`: a backup for a slow idempotent call (async clients). None:
            never.

    `retry_budget`, `throttle`, `limit` and `hedge` hold what they learn: give each
    dependency its own. Each is opt-in and reports what it does as events
    (`AttemptRefused`, `LimitChanged`, `HedgeSent`).
    """

    name: str
    connect: float
    headers: float
    idle: float
    total: float
    pool_size: int
    pool_wait: float
    min_useful: float
    retry: Retry | None
    retry_budget: RetryBudget | None
    throttle: Throttle | None
    limit: AdaptiveLimit | None
    hedge: Hedge | None

    def __init__(
        self,
        name: str,
        *,
        connect: float | timedelta = 2.0,
        headers: float | timedelta = 10.0,
        idle: float | timedelta = 10.0,
        total: float | timedelta = 30.0,
        pool_size: int = 20,
        pool_wait: float | timedelta = 1.0,
        min_useful: float | timedelta = 0.0,
        retry: Retry | None = None,
        retry_budget: RetryBudget | None = None,
        throttle: Throttle | None = None,
        limit: AdaptiveLimit | None = None,
        hedge: Hedge | None = None,
    ) -> None:
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"name must be a non-empty string, got {name!r}")
        if isinstance(pool_size, bool) or not isinstance(pool_size, int):
            raise TypeError(f"pool_size must be an int, not {pool_size!r}")
        if not 1 <= pool_size <= 100_000:
            raise ValueError(f"pool_size must be between 1 and 100000, got {pool_size}")
        if retry is not None and not isinstance(retry, Retry):
            raise TypeError(f"retry must be a deadlines.Retry or None, not {retry!r}")
        for option, kind in (
            (retry_budget, RetryBudget),
            (throttle, Throttle),
            (limit, AdaptiveLimit),
            (hedge, Hedge),
        ):
            if option is not None and not isinstance(option, kind):
                raise TypeError(
                    f"{_OPTION_NAMES[kind]} must be a deadlines.{kind.__name__} or None,"
                    f" not {option!r}"
                )
        values = {
            "name": name,
            "connect": _validate.seconds(connect, "connect", allow_zero=False),
            "headers": _validate.seconds(headers, "headers", allow_zero=False),
            "idle": _validate.seconds(idle, "idle", allow_zero=False),
            "total": _validate.seconds(total, "total", allow_zero=False),
            "pool_size": pool_size,
            "pool_wait": _validate.seconds(pool_wait, "pool_wait"),
            "min_useful": _validate.seconds(min_useful, "min_useful"),
            "retry": retry,
            "retry_budget": retry_budget,
            "throttle": throttle,
            "limit": limit,
            "hedge": hedge,
        }
        if values["min_useful"] > values["total"]:  # type: ignore[operator]
            raise ValueError(
                f"min_useful ({values['min_useful']} s) is longer than total"
                f" ({values['total']} s): no call could ever be made"
            )
        for key, value in values.items():
            object.__setattr__(self, key, value)


_OPTION_NAMES: dict[type, str] = {
    RetryBudget: "retry_budget",
    Throttle: "throttle",
    AdaptiveLimit: "limit",
    Hedge: "hedge",
}
