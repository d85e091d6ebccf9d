"""A callee's latency as the caller measured it: quantiles, and how often a limit cuts it.

Three sources: quantiles written in the plan, raw samples in a CSV file, or a
Prometheus histogram in the text exposition format. Files name their problems by
line: ``recs.csv:17: expected a number of milliseconds, got 'n/a'``.
"""

from __future__ import annotations

import bisect
import csv
import io
import itertools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from .._tools.stats import percentile
from ._errors import PlanError

#: p99.9 from fewer observations than this is mostly noise: the planner does not use it.
MIN_FOR_P999 = 1000
#: Fewer observations than this cannot give a p99 at all.
MIN_FOR_P99 = 100

_UNIT_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


@dataclass(frozen=True, slots=True)
class Latency:
    """Quantiles of one callee's latency in seconds, and where they came from.

    `p999` is None when it is unknown or was estimated from too few observations.
    """

    p50: float
    p99: float
    p999: float | None
    source: str
    count: int | None = None
    notes: tuple[str, ...] = ()
    cdf: Callable[[float], float] | None = field(default=None, compare=False, repr=False)

    def fraction_over(self, limit: float) -> tuple[float, bool]:
        """Share of healthy calls slower than `limit`, and whether it is only an upper bound.

        Measured samples or buckets give an estimate; bare quantiles give a bound
        (a limit above p99.9 cuts at most 0.1% of calls).
        """
        if self.cdf is not None:
            return max(0.0, 1.0 - self.cdf(limit)), False
        for quantile, value in ((0.999, self.p999), (0.99, self.p99), (0.5, self.p50)):
            if value is not None and limit > value:
                return 1.0 - quantile, True
        return 1.0, True


def check_quantiles(p50: float, p99: float, p999: float | None) -> None:
    """Raise `ValueError` unless 0 < p50 <= p99 <= p99.9."""
    if p99 <= 0:
        raise ValueError(f"expected p99 > 0, got {p99 * 1000:g} ms")
    if p50 > p99:
        raise ValueError(f"expected p50 <= p99, got p50 {p50 * 1000:g} ms > p99 {p99 * 1000:g} ms")
    if p999 is not None and p99 > p999:
        raise ValueError(
            f"expected p99 <= p99.9, got p99 {p99 * 1000:g} ms > p99.9 {p999 * 1000:g} ms"
        )


# Raw samples.


def from_samples(samples: Sequence[float], source: str) -> Latency:
    """Quantiles of raw samples in seconds; p99.9 only from enough of them."""
    if len(samples) < MIN_FOR_P99:
        raise ValueError(f"expected at least {MIN_FOR_P99} samples for a p99, got {len(samples)}")
    ordered = sorted(samples)
    p50, p99, p999 = (percentile(ordered, q) for q in (0.5, 0.99, 0.999))
    # Never None: there are at least MIN_FOR_P99 samples.
    assert p50 is not None
    assert p99 is not None
    assert p999 is not None
    notes: tuple[str, ...] = ()
    if len(ordered) < MIN_FOR_P999:
        notes = (f"p99.9 not used: {len(ordered)} samples (needs {MIN_FOR_P999})",)
    n = len(ordered)

    def cdf(limit: float) -> float:
        return bisect.bisect_right(ordered, limit) / n

    return Latency(
        p50=p50,
        p99=p99,
        p999=p999 if n >= MIN_FOR_P999 else None,
        source=f"{source} ({n} samples)",
        count=n,
        notes=notes,
        cdf=cdf,
    )


def _unit_from_name(name: str) -> str | None:
    lowered = name.strip().lower()
    if lowered.endswith(("_ms", " ms", "(ms)", "millis", "milliseconds")):
        return "ms"
    if lowered.endswith(("_us", "micros", "microseconds")):
        return "us"
    if lowered.endswith(("_s", " s", "(s)", "_sec", "seconds", "secs")):
        return "s"
    return None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def read_csv(
    text: str, *, file: str, column: str | int | None = None, unit: str | None = None
) -> Latency:
    """Latency samples from one column of a CSV file (a header row is optional).

    `column` is a header name or a 1-based column number (default: the one column
    whose header names a unit, else the first).
    `unit` is ``"ms"``, ``"s"`` or ``"us"``; without it the header must name the unit
    (``latency_ms``, ``duration_seconds``), so a 1000× mistake cannot pass unnoticed.
    """
    rows = [
        (number, row)
        for number, row in enumerate(csv.reader(io.StringIO(text)), start=1)
        if row and any(cell.strip() for cell in row) and not row[0].lstrip().startswith("#")
    ]
    if not rows:
        raise PlanError("expected latency samples, the file has none", file=file)
    index = 0
    header_unit: str | None = None
    first_number, first = rows[0]
    has_header = not all(_is_number(cell) for cell in first if cell.strip())
    if column is None and has_header:
        # Default to the one column whose header names a time unit (`latency_ms`).
        timed = [i for i, cell in enumerate(first) if _unit_from_name(cell) is not None]
        if len(timed) == 1:
            index = timed[0]
    if isinstance(column, int):
        if column < 1:
            raise PlanError(f"expected a column number >= 1, got {column}", file=file)
        index = column - 1
    elif column is not None:
        names = [cell.strip() for cell in first]
        if not has_header or column not in names:
            raise PlanError(
                f"expected a header row with a column named {column!r}, got {first!r}",
                file=file,
                line=first_number,
            )
        index = names.index(column)
    if has_header:
        if index >= len(first):
            raise PlanError(
                f"expected at least {index + 1} columns in the header, got {len(first)}",
                file=file,
                line=first_number,
            )
        header_unit = _unit_from_name(first[index])
        rows = rows[1:]
    chosen = unit or header_unit
    if chosen is None:
        raise PlanError(
            'expected unit = "ms" or "s" in the plan: the file has no header naming the unit'
            " (such as latency_ms)",
            file=file,
        )
    if unit is not None and header_unit is not None and unit != header_unit:
        raise PlanError(
            f"the plan says unit = {unit!r} but the header {first[index]!r} says {header_unit!r}",
            file=file,
            line=first_number,
        )
    scale = _UNIT_SECONDS[chosen]
    unit_word = {"ms": "milliseconds", "s": "seconds", "us": "microseconds"}[chosen]
    samples: list[float] = []
    for number, row in rows:
        cell = row[index].strip() if index < len(row) else ""
        try:
            value = float(cell)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < 0:
            raise PlanError(
                f"expected a number of {unit_word} >= 0 in column {index + 1}, got {cell!r}",
                file=file,
                line=number,
            )
        samples.append(value * scale)
    try:
        return from_samples(samples, file)
    except ValueError as exc:
        raise PlanError(str(exc), file=file) from exc


# Prometheus histograms.

_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)"
    r"(?:\{(?P<labels>[^}]*)\})?"
    r"\s+(?P<value>\S+)(?:\s+(?P<ts>-?[0-9]+))?\s*(?:#.*)?$"
)
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(?:,|$)')


def _parse_labels(text: str) -> dict[str, str] | None:
    labels: dict[str, str] = {}
    position = 0
    text = text.strip()
    while position < len(text):
        match = _LABEL.match(text, position)
        if match is None:
            return None
        value = match.group(2).replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")
        labels[match.group(1)] = value
        position = match.end()
    return labels


def _parse_float(text: str) -> float:
    lowered = text.lower()
    if lowered in ("+inf", "inf"):
        return math.inf
    if lowered == "-inf":
        return -math.inf
    return float(text)


@dataclass(slots=True)
class _Series:
    labels: dict[str, str]
    buckets: dict[float, tuple[float, int]]  # le -> (cumulative count, line)


def _histograms(text: str, file: str) -> dict[str, list[_Series]]:
    """Every histogram's ``_bucket`` series, by metric name without the suffix."""
    found: dict[str, dict[tuple[tuple[str, str], ...], _Series]] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise PlanError(
                f"expected a sample `name{{labels}} value`, got {line[:60]!r}",
                file=file,
                line=number,
            )
        name = match.group("name")
        if not name.endswith("_bucket"):
            continue
        labels = _parse_labels(match.group("labels") or "")
        if labels is None or "le" not in labels:
            raise PlanError(
                f'expected labels like {{le="0.25"}} on a _bucket sample, got {line[:60]!r}',
                file=file,
                line=number,
            )
        try:
            le = _parse_float(labels.pop("le"))
            count = _parse_float(match.group("value"))
        except ValueError:
            raise PlanError(
                f"expected numbers for le and the count, got {line[:60]!r}", file=file, line=number
            ) from None
        if math.isnan(le) or not (math.isfinite(count) and count >= 0):
            raise PlanError(
                f"expected le a number and the count >= 0, got {line[:60]!r}",
                file=file,
                line=number,
            )
        key = tuple(sorted(labels.items()))
        series = found.setdefault(name[: -len("_bucket")], {}).setdefault(key, _Series(labels, {}))
        series.buckets[le] = (count, number)
    return {name: list(by_labels.values()) for name, by_labels in found.items()}


def histogram_quantile(q: float, bounds: Sequence[float], counts: Sequence[float]) -> float:
    """Prometheus's ``histogram_quantile``: linear inside the bucket holding rank q × total.

    `bounds` are the ascending upper bounds ending in +Inf, `counts` cumulative. A
    quantile in the +Inf bucket returns the highest finite bound (a lower bound).
    """
    total = counts[-1]
    rank = q * total
    index = bisect.bisect_left(counts, rank)
    index = min(index, len(bounds) - 1)
    if math.isinf(bounds[index]):
        return bounds[-2] if len(bounds) > 1 else 0.0
    start = 0.0 if index == 0 else bounds[index - 1]
    below = 0.0 if index == 0 else counts[index - 1]
    inside = counts[index] - below
    if inside <= 0:
        return bounds[index]
    return start + (bounds[index] - start) * (rank - below) / inside


def _bucket_cdf(bounds: Sequence[float], counts: Sequence[float]) -> Callable[[float], float]:
    total = counts[-1]

    def cdf(limit: float) -> float:
        index = bisect.bisect_left(bounds, limit)
        if index >= len(bounds) or math.isinf(bounds[index]):
            return counts[-2] / total if len(counts) > 1 else 0.0
        start = 0.0 if index == 0 else bounds[index - 1]
        below = 0.0 if index == 0 else counts[index - 1]
        width = bounds[index] - start
        share = 1.0 if width <= 0 else (limit - start) / width
        return (below + (counts[index] - below) * share) / total

    return cdf


def read_prometheus(
    text: str,
    *,
    file: str,
    metric: str | None = None,
    labels: dict[str, str] | None = None,
    unit: str | None = None,
) -> Latency:
    """Quantiles from a histogram in Prometheus's text exposition (``_bucket{le=...}`` lines).

    Series matching `labels` are summed bucket by bucket (instances of one service,
    say). The unit comes from `unit` or the metric's name (``_seconds``, ``_milliseconds``).
    """
    histograms = _histograms(text, file)
    if metric is not None:
        metric = metric.removesuffix("_bucket")
        if metric not in histograms:
            known = ", ".join(sorted(histograms)) or "none"
            raise PlanError(
                f"expected a histogram named {metric!r} (with _bucket lines); found: {known}",
                file=file,
            )
    elif len(histograms) == 1:
        metric = next(iter(histograms))
    else:
        known = ", ".join(sorted(histograms)) or "none"
        raise PlanError(
            f"expected metric = NAME in the plan to choose a histogram; found: {known}", file=file
        )
    wanted = labels or {}
    series = [s for s in histograms[metric] if all(s.labels.get(k) == v for k, v in wanted.items())]
    if not series:
        raise PlanError(f"expected a {metric} series with labels {wanted}, found none", file=file)
    bounds = sorted(series[0].buckets)
    for other in series[1:]:
        if sorted(other.buckets) != bounds:
            raise PlanError(
                f"expected the same buckets in every matching {metric} series to add them up;"
                f" {other.labels} differs from {series[0].labels}",
                file=file,
            )
    if not bounds or not math.isinf(bounds[-1]):
        raise PlanError(f'expected a {metric}_bucket{{le="+Inf"}} sample', file=file)
    counts: list[float] = []
    for le in bounds:
        total = 0.0
        for s in series:
            count, number = s.buckets[le]
            previous = counts[-1] if counts else 0.0
            total += count
            if len(series) == 1 and count < previous:
                raise PlanError(
                    f"expected cumulative bucket counts (never decreasing as le grows),"
                    f" got {count:g} after {previous:g}",
                    file=file,
                    line=number,
                )
        counts.append(total)
    if any(b < a for a, b in itertools.pairwise(counts)):
        raise PlanError(f"expected cumulative bucket counts in {metric}", file=file)
    if counts[-1] <= 0:
        raise PlanError(f"expected observations in {metric}, every bucket is 0", file=file)
    chosen = unit or _unit_from_metric(metric)
    if chosen is None:
        raise PlanError(
            f'expected unit = "s" or "ms" in the plan: {metric!r} does not name its unit',
            file=file,
        )
    scale = _UNIT_SECONDS[chosen]
    scaled = [b * scale for b in bounds]
    observations = int(counts[-1])
    notes: list[str] = []
    values = {q: histogram_quantile(q, scaled, counts) for q in (0.5, 0.99, 0.999)}
    for q, name in ((0.99, "p99"), (0.999, "p99.9")):
        if q * counts[-1] > (counts[-2] if len(counts) > 1 else 0.0):
            notes.append(f"{name} is above the highest bucket: {values[q] * 1000:g} ms is a floor")
    p999: float | None = values[0.999]
    if observations < MIN_FOR_P999:
        notes.append(f"p99.9 not used: {observations} observations (needs {MIN_FOR_P999})")
        p999 = None
    if observations < MIN_FOR_P99:
        raise PlanError(
            f"expected at least {MIN_FOR_P99} observations for a p99, got {observations}",
            file=file,
        )
    return Latency(
        p50=values[0.5],
        p99=values[0.99],
        p999=p999,
        source=f"{file} ({metric}, {observations} observations)",
        count=observations,
        notes=tuple(notes),
        cdf=_bucket_cdf(scaled, counts),
    )


def _unit_from_metric(metric: str) -> str | None:
    if metric.endswith(("_seconds", "_seconds_total")):
        return "s"
    if metric.endswith(("_milliseconds", "_ms")):
        return "ms"
    if metric.endswith(("_microseconds", "_us")):
        return "us"
    return None
