"""The percentile every tool reports: nearest rank, a value that was observed."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(ordered: Sequence[float], q: float) -> float | None:
    """The nearest-rank `q`-quantile (0 < q <= 1) of an ascending sequence; None if empty."""
    if not ordered:
        return None
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]
