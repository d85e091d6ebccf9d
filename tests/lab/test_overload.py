"""Experiment `overload` (issue 33, point 3): its parts, and the shape of a quick run.

The figures of a run depend on the machine; the quick-run tests check what cannot be
otherwise on a loaded 2-core machine: the structure, that an unprotected service never
refuses and stays collapsed after an 8 × C spike, that the protected one refuses and
answers more in time than timeouts alone, and that every figure is within its range.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from deadlines.lab import cli, overload
from deadlines.lab.load import LoadRun, Shot, schedule

from .helpers import QuickAll

LEVEL_KEYS = {
    "level", "load", "offered_per_s", "goodput_per_s", "goodput_pct_of_c", "in_time_pct",
    "wasted_pct", "p50_ms", "p99_ms", "sent", "attempts", "served", "unused", "refused",
    "refused_why",
}  # fmt: skip
PROTECTED = "deadlines+retries+budget+admission+codel"


def test_variants_are_switches_joined_by_plus() -> None:
    """Each default variant parses; a mix that cannot run is refused with the reason."""
    assert overload.switches("timeouts+retries") == {"timeouts", "retries"}
    assert all(overload.switches(v) for v in overload.VARIANTS)
    for bad, words in (
        ("timeouts+fast", "switches are"),
        ("retries", "exactly one of timeouts, deadlines"),
        ("timeouts+deadlines", "exactly one"),
        ("deadlines+budget", "add retries"),
        ("timeouts+retries+budget", "need deadlines"),
    ):
        with pytest.raises(ValueError, match=words):
            overload.switches(bad)


def test_params_refuse_what_cannot_run() -> None:
    """Duplicate or non-numeric loads, a CoDel target above its interval, no variant."""
    for changes, words in (
        ({"loads": ("1", "1")}, "distinct"),
        ({"loads": ("x",)}, "numbers"),
        ({"loads": ("200",)}, "between 0 and 100"),
        ({"codel_target": 0.5, "codel_interval": 0.1}, "shorter than"),
        ({"variants": ()}, "--variants"),
        ({"retries": 0}, "--retries"),
    ):
        with pytest.raises(ValueError, match=words):
            overload.Params(**changes)  # type: ignore[arg-type]


def test_quick_is_under_a_minute_and_the_default_a_few() -> None:
    """The quick run is planned under 60 s (for tests); the default under five minutes."""
    assert overload.expected_seconds(overload.quick()) <= 60.0
    assert overload.expected_seconds(overload.Params()) <= 300.0


def test_flags_reach_the_params() -> None:
    """`deadlines lab overload --loads 1,4 --level-for 2s --variants ...` sets the Params."""
    from deadlines.__main__ import build_parser

    args = build_parser("lab").parse_args(
        ["lab", "overload", "--loads", "1,4", "--level-for", "2s", "--service-ms", "30",
         "--variants", "timeouts,deadlines+admission"]
    )  # fmt: skip
    p = cli.params_for("overload", args)
    assert p.levels() == [1.0, 4.0] and p.level_for == 2.0 and p.service_ms == 30.0
    assert p.variants == ("timeouts", "deadlines+admission")


def test_a_stepped_schedule_keeps_each_stream_in_its_span() -> None:
    """`schedule` with spans: each stream starts at its span's start, none past its end."""
    plan = schedule({"a": 10.0, "b": 20.0}, 3.0, {"a": (0.0, 1.0), "b": (1.0, 2.0)})
    a = [t for t, kind, _ in plan if kind == "a"]
    b = [t for t, kind, _ in plan if kind == "b"]
    assert len(a) == 10 and len(b) == 20
    assert a[0] == 0.0 and max(a) < 1.0 and b[0] == 1.0 and max(b) < 2.0


def _run(p: overload.Params, answered: list[bool]) -> LoadRun:
    """A run whose 'after' stream is answered in time (or not) per request, 4 per second."""
    start = len(p.levels()) * p.level_for
    run = LoadRun({overload.AFTER: 4.0}, p.run_for())
    for i, ok in enumerate(answered):
        planned = start + i * 0.25
        shot = Shot(overload.AFTER, i, planned, started=planned)
        shot.ended = planned + (0.1 if ok else 2.0)
        shot.status = 200
        run.shots.append(shot)
    return run


def test_goodput_over_c_warns_that_c_was_measured_low() -> None:
    """A level answered at 150 % of C says C was measured low; 100 % says nothing."""

    def result(pct: float) -> dict[str, Any]:
        level = {"load": 4.0, "level": "4x", "goodput_pct_of_c": pct, "wasted_pct": 0.0,
                 "p50_ms": 10.0, "refused": 0}  # fmt: skip
        variant = {"levels": [level], "recovery_s": 0.5}
        return {"variants": {"deadlines+admission": variant}, "params": {"recover_for": 6}}

    assert "measured low" not in overload.goals(result(100.0)).note
    warned = overload.goals(result(150.0)).note
    assert "150% of C" in warned and "measured low" in warned


def test_recovery_is_the_time_until_every_later_window_is_answered_in_time() -> None:
    """Recovered from the first window after which every window is >= 90 % in time."""
    p = overload.Params(loads=("1",), level_for=1.0, recover_for=2.0, window=0.5)
    # 2 s at 4/s = 8 requests, 2 per window: late, late | ok, late | ok, ok | ok, ok
    run = _run(p, [False, False, True, False, True, True, True, True])
    assert overload._recovery(p, run) == 1.0
    assert overload._recovery(p, _run(p, [True] * 8)) == 0.0
    assert overload._recovery(p, _run(p, [True] * 7 + [False])) is None


@pytest.mark.slow
@pytest.mark.realtime
@pytest.mark.timeout(300)
class TestQuickRun:
    """The overload part of the session's quick `deadlines lab` run."""

    def test_structure(self, quick_all: QuickAll) -> None:
        """Every variant, one row per level plus 'after', each figure in its range."""
        result = quick_all.data["overload"]
        p = overload.Params(**{
            k: tuple(v) if isinstance(v, list) else v for k, v in result["params"].items()
        })  # fmt: skip
        cap = result["capacity"]["capacity_per_s"]
        assert cap > 1.0 and result["capacity"]["iterations"] > 0
        assert set(result["variants"]) == set(overload.VARIANTS)
        for name, v in result["variants"].items():
            levels = v["levels"]
            assert [lv["level"] for lv in levels] == [
                *(f"x{x:g}" for x in p.levels()),
                overload.AFTER,
            ], name
            for lv in levels:
                assert set(lv) == LEVEL_KEYS, name
                assert 0.0 <= lv["in_time_pct"] <= 100.0
                assert lv["wasted_pct"] is None or 0.0 <= lv["wasted_pct"] <= 100.0
                # By answer time, goodput is what the service could do: far below 3 × C.
                assert 0.0 <= lv["goodput_per_s"] <= 3.0 * cap, (name, lv)
                assert lv["served"] + lv["refused"] <= lv["attempts"]
                assert lv["unused"] <= lv["served"]
                assert lv["p50_ms"] is None or lv["p50_ms"] <= lv["p99_ms"]
            assert v["recovery_s"] is None or 0.0 <= v["recovery_s"] <= p.recover_for
            assert all(not math.isnan(pt[2]) for pt in v["series"])

    def test_timeouts_alone_never_refuse_and_stay_collapsed(self, quick_all: QuickAll) -> None:
        """Without protection nothing is refused; after 8 × C the queue outlasts the run."""
        v = quick_all.data["overload"]["variants"]["timeouts"]
        assert all(lv["refused"] == 0 for lv in v["levels"])
        at8 = next(lv for lv in v["levels"] if lv["level"] == "x8")
        assert at8["in_time_pct"] <= 50.0
        assert v["recovery_s"] is None and v["queued_at_end"] > 0

    def test_protected_sheds_and_answers_more_in_time(self, quick_all: QuickAll) -> None:
        """Admission and CoDel refuse at 8 × C; more answers come in time than without."""
        variants = quick_all.data["overload"]["variants"]
        ours = next(lv for lv in variants[PROTECTED]["levels"] if lv["level"] == "x8")
        theirs = next(lv for lv in variants["timeouts"]["levels"] if lv["level"] == "x8")
        assert ours["refused"] > 0
        assert ours["in_time_pct"] > theirs["in_time_pct"]
        assert variants[PROTECTED]["queued_at_end"] == 0

    def test_tables_fit_and_name_the_goals(self, quick_all: QuickAll) -> None:
        """The tables print within 100 columns; the goals table says met or missed."""
        tables = overload.tables(quick_all.data["overload"])
        goals = tables[-1]
        assert goals.title == "overload: the goals"
        assert {row[3] for row in goals.rows} <= {"met", "missed", "shown"}
        for table in tables:
            assert all(len(line) <= 100 for line in table.text().splitlines()), table.title
        assert "overload: the goals" in quick_all.run.stdout
