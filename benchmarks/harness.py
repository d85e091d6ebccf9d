"""Side-by-side measurement: alternate A and B in one run, report medians, spread, ratio."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass
class Summary:
    """A distribution in the unit of its samples."""

    n: int
    min: float
    p50: float
    p99: float
    max: float
    iqr: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        """Summarise `values`."""
        return cls(
            n=len(values),
            min=min(values),
            p50=statistics.median(values),
            p99=quantile(values, 0.99),
            max=max(values),
            iqr=quantile(values, 0.75) - quantile(values, 0.25),
        )


@dataclass
class Comparison:
    """One row of the report: B measured against A, side by side."""

    name: str
    metric: str  # what the samples are, with unit, e.g. "latency ms"
    a_label: str
    b_label: str
    a: Summary
    b: Summary
    goal: str = ""
    notes: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """B's median over A's (for throughput rows, higher is better)."""
        return self.b.p50 / self.a.p50 if self.a.p50 else float("nan")

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict, ratio included."""
        data = asdict(self)
        data["ratio"] = self.ratio
        return data


def alternate(
    rounds: int, run_a: Callable[[], list[float]], run_b: Callable[[], list[float]]
) -> tuple[list[float], list[float]]:
    """Run A then B, B then A, ... `rounds` times, so drift hits both sides equally."""
    a: list[float] = []
    b: list[float] = []
    for i in range(rounds):
        first, second = (run_a, run_b) if i % 2 == 0 else (run_b, run_a)
        one, two = first(), second()
        if i % 2 == 0:
            a += one
            b += two
        else:
            b += one
            a += two
    return a, b


def table(rows: Sequence[Comparison]) -> str:
    """The report as a fixed-width text table."""
    head = (
        f"{'comparison':<34} {'metric':<18} {'A p50':>9} {'B p50':>9} {'ratio':>6}"
        f" {'A p99':>9} {'B p99':>9} {'A iqr':>8} {'B iqr':>8}  goal"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.name:<34} {r.metric:<18} {r.a.p50:>9.3f} {r.b.p50:>9.3f} {r.ratio:>6.3f}"
            f" {r.a.p99:>9.3f} {r.b.p99:>9.3f} {r.a.iqr:>8.3f} {r.b.iqr:>8.3f}  {r.goal}"
        )
        lines.append(f"{'':<34} A = {r.a_label}; B = {r.b_label}")
    return "\n".join(lines)
