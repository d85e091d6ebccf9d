"""What the exporters share: bounded label values, histogram buckets, the vocabularies."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import timedelta
from itertools import pairwise
from typing import Final

from . import _validate

#: The label value that stands for every value beyond the limit.
OVERFLOW_LABEL: Final = "other"

#: Histogram buckets in seconds: from a 1 ms pool wait up to the default 30 s total cap.
DEFAULT_BUCKETS: Final[tuple[float, ...]] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)

PHASES: Final = frozenset({"pool", "connect", "headers", "body"})
REQUEST_OUTCOMES: Final = frozenset(
    {"ok", "deadline", "caller_left", "budget_exhausted", "error", "late", "shed"}
)

_log = logging.getLogger("deadlines")


def bucket_bounds(values: Sequence[float | timedelta]) -> tuple[float, ...]:
    """Validated, strictly increasing bucket bounds in seconds."""
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise TypeError(f"buckets must be a sequence of seconds, not {values!r}")
    bounds = tuple(_validate.seconds(v, "each bucket", allow_zero=False) for v in values)
    if not bounds:
        raise ValueError("buckets must not be empty")
    if any(b >= c for b, c in pairwise(bounds)):
        raise ValueError(f"buckets must be strictly increasing, got {bounds}")
    return bounds


class LabelGuard:
    """Admits at most `limit` distinct values of one label; later ones become "other".

    Warns once when it starts folding, since that means a URL or a raw path is being
    used where a name or a route template belongs.
    """

    def __init__(self, kind: str, limit: int) -> None:
        self._kind = kind
        self._limit = limit
        self._seen: set[str] = set()
        self._warned = False

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        if len(self._seen) < self._limit:
            self._seen.add(value)
            return value
        if not self._warned:
            self._warned = True
            _log.warning(
                "deadlines metrics: more than %d distinct %s label values; folding %r and"
                " later ones into %r (use a name or route template, not a URL or path)",
                self._limit,
                self._kind,
                value,
                OVERFLOW_LABEL,
            )
        return OVERFLOW_LABEL
