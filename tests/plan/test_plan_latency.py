"""Latency input: raw CSV samples and Prometheus histograms, and their malformed forms."""

from __future__ import annotations

import pytest

from deadlines.plan import PlanError, histogram_quantile, read_csv, read_prometheus


def _csv(values: list[float], header: str | None = "latency_ms") -> str:
    lines = [header] if header else []
    return "\n".join([*lines, *(f"{v}" for v in values)]) + "\n"


def test_csv_quantiles_in_milliseconds() -> None:
    """Samples 1..1000 ms give p50 500 ms and p99 990 ms (nearest rank), in seconds."""
    latency = read_csv(_csv(list(range(1, 1001))), file="a.csv")
    assert latency.p50 == pytest.approx(0.5)
    assert latency.p99 == pytest.approx(0.99001, rel=1e-3)
    assert latency.p999 == pytest.approx(0.999, rel=1e-3)
    assert latency.count == 1000
    assert latency.fraction_over(0.9) == (pytest.approx(0.1), False)


def test_csv_picks_the_column_that_names_a_unit() -> None:
    """With a header, the one column named with a unit is used and its unit applied."""
    text = "ts,duration_seconds\n" + "".join(f"{i},{i / 1000}\n" for i in range(1, 201))
    latency = read_csv(text, file="b.csv")
    assert latency.p50 == pytest.approx(0.1)  # nearest rank: the 100th of 200
    assert latency.p999 is None  # 200 samples are too few for p99.9
    assert any("p99.9 not used" in note for note in latency.notes)


def test_csv_bad_value_names_the_line() -> None:
    """A non-number names the file, the line and what was expected."""
    values = [str(v) for v in range(1, 150)]
    values[16] = "n/a"
    text = "latency_ms\n" + "\n".join(values) + "\n"
    with pytest.raises(PlanError) as info:
        read_csv(text, file="c.csv")
    assert info.value.line == 18
    assert str(info.value).startswith("c.csv:18: expected a number of milliseconds")
    assert "'n/a'" in str(info.value)


def test_csv_needs_a_unit() -> None:
    """Without a header naming the unit and without `unit`, nothing is guessed."""
    with pytest.raises(PlanError, match='expected unit = "ms" or "s"'):
        read_csv(_csv([1.0] * 200, header=None), file="d.csv")
    assert read_csv(_csv([2.0] * 200, header=None), file="d.csv", unit="s").p50 == 2.0


def test_csv_unit_conflict_and_too_few_samples() -> None:
    """A unit that contradicts the header, or too few samples, is an error."""
    with pytest.raises(PlanError, match="header 'latency_ms' says 'ms'"):
        read_csv(_csv([1.0] * 200), file="e.csv", unit="s")
    with pytest.raises(PlanError, match="at least 100 samples"):
        read_csv(_csv([1.0] * 20), file="e.csv")
    with pytest.raises(PlanError, match="column named 'latency'"):
        read_csv(_csv([1.0] * 200), file="e.csv", column="latency")


def _histogram(counts: list[int], labels: str = "") -> str:
    bounds = ["0.01", "0.05", "0.1", "0.25", "0.5", "1", "+Inf"]
    prefix = f"{labels}," if labels else ""
    lines = ["# TYPE rpc_duration_seconds histogram"]
    for le, count in zip(bounds, counts, strict=True):
        lines.append(f'rpc_duration_seconds_bucket{{{prefix}le="{le}"}} {count}')
    lines.append(f"rpc_duration_seconds_count{{{labels}}} {counts[-1]}")
    return "\n".join(lines) + "\n"


def test_histogram_quantile_interpolates_inside_the_bucket() -> None:
    """Linear interpolation inside a bucket, as Prometheus's histogram_quantile does."""
    bounds = [0.1, 0.2, float("inf")]
    assert histogram_quantile(0.5, bounds, [50, 100, 100]) == pytest.approx(0.1)
    assert histogram_quantile(0.75, bounds, [50, 100, 100]) == pytest.approx(0.15)
    assert histogram_quantile(0.99, bounds, [50, 90, 100]) == pytest.approx(0.2)


def test_prometheus_histogram_quantiles_and_label_filter() -> None:
    """Bucket lines give quantiles; label filters pick the series; others are ignored."""
    text = _histogram([100, 5000, 9000, 9950, 9995, 10000, 10000], 'route="a"')
    text += _histogram([0, 0, 0, 0, 0, 10, 10], 'route="b"')
    latency = read_prometheus(text, file="h.prom", labels={"route": "a"})
    assert latency.p50 == pytest.approx(0.01 + 0.04 * 4900 / 4900)
    assert 0.1 < latency.p99 < 0.25
    assert latency.p999 is not None
    assert 0.25 < latency.p999 < 0.5
    over, bound = latency.fraction_over(0.5)
    assert over == pytest.approx(0.0005)
    assert not bound


def test_prometheus_sums_matching_series() -> None:
    """Series matching the labels (two instances) are added bucket by bucket."""
    one = _histogram([0, 600, 1000, 1000, 1000, 1000, 1000], 'instance="1"')
    two = _histogram([0, 0, 0, 1000, 1000, 1000, 1000], 'instance="2"')
    latency = read_prometheus(one + two, file="h.prom")
    assert latency.count == 2000
    assert 0.1 < latency.p99 <= 0.25


def test_prometheus_decreasing_buckets_name_the_line() -> None:
    """Cumulative counts that go down name the offending line."""
    text = _histogram([100, 5000, 4000, 9950, 9995, 10000, 10000])
    with pytest.raises(PlanError) as info:
        read_prometheus(text, file="bad.prom")
    assert info.value.line == 4
    assert "never decreasing" in str(info.value)


def test_prometheus_malformed_line() -> None:
    """A line that is not `name{labels} value` is reported with its number."""
    text = '# TYPE x histogram\nx_bucket{le="0.1"} 5\nthis is not a sample\n'
    with pytest.raises(PlanError, match=r"bad.prom:3: expected a sample"):
        read_prometheus(text, file="bad.prom")


def test_prometheus_needs_inf_bucket_and_a_unit() -> None:
    """No +Inf bucket, or no unit in the name or the plan, is an error."""
    text = 'lat_seconds_bucket{le="0.1"} 100\n'
    with pytest.raises(PlanError, match=r'le="\+Inf"'):
        read_prometheus(text, file="x.prom")
    text = 'lat_bucket{le="0.1"} 100\nlat_bucket{le="+Inf"} 200\n'
    with pytest.raises(PlanError, match='expected unit = "s" or "ms"'):
        read_prometheus(text, file="x.prom")
    assert read_prometheus(text, file="x.prom", unit="ms").p50 == pytest.approx(0.0001)


def test_prometheus_chooses_metric() -> None:
    """Two histograms need `metric`; an unknown one lists what exists."""
    text = _histogram([1, 2, 3, 4, 5, 200, 200]) + _histogram([1, 2, 3, 4, 5, 200, 200]).replace(
        "rpc_", "db_"
    )
    with pytest.raises(PlanError, match="db_duration_seconds, rpc_duration_seconds"):
        read_prometheus(text, file="x.prom")
    with pytest.raises(PlanError, match="named 'nope'"):
        read_prometheus(text, file="x.prom", metric="nope")
    assert read_prometheus(text, file="x.prom", metric="db_duration_seconds").count == 200
