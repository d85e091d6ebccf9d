"""`harness.turns`: the rotation every side-by-side benchmark runs in (`alternate` too)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from harness import alternate, turns


def test_every_side_runs_once_a_round_and_each_goes_first_in_turn() -> None:
    order = list(turns(6, 3))
    rounds = [order[i : i + 3] for i in range(0, len(order), 3)]
    assert all(sorted(r) == [0, 1, 2] for r in rounds)
    assert [r[0] for r in rounds] == [0, 1, 2, 0, 1, 2]
    assert Counter(order) == {0: 6, 1: 6, 2: 6}


def test_two_sides_alternate_who_goes_first() -> None:
    assert list(turns(3, 2)) == [0, 1, 1, 0, 0, 1]


def test_alternate_runs_the_sides_in_that_rotation() -> None:
    """Each side's samples, in the order `turns` gives, kept apart."""
    calls: list[str] = []

    def side(name: str) -> list[float]:
        calls.append(name)
        return [float(len(calls))]

    a, b = alternate(3, lambda: side("a"), lambda: side("b"))
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert a == [1.0, 4.0, 5.0]
    assert b == [2.0, 3.0, 6.0]
