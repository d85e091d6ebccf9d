"""The cascade and the chain reproduce the chapter's measured shapes, in the lab's JSON keys.

The chapter's figures are written below in the shape `deadlines lab` reports them
(issue 5), so this is also the comparison a lab run will get: same keys, within 10%.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from deadlines.sim import run_scenario

# The lab's JSON keys for each experiment (issue 5).
CASCADE_KEYS = {
    "home_in_flight_end",
    "home_in_flight_series",
    "checkout_ok",
    "checkout_failed",
    "checkout_p99_ms",
    "downstream_open_max",
}
CHAIN_KEYS = {
    "a_answered_ms",
    "a_status",
    "b_gave_up_ms",
    "c_budget_ms",
    "c_stopped_ms",
    "c_finished_ms",
    "c_committed",
}

# The chapter's measured run (Node), in those keys.
CHAPTER_CHAIN = {
    "fixed": {"a_answered_ms": 2004, "a_status": 504, "b_gave_up_ms": 2509,
              "c_stopped_ms": None, "c_finished_ms": 3510, "c_committed": True},
    "propagated": {"a_answered_ms": 1966, "a_status": 504, "b_gave_up_ms": 1963,
                   "c_budget_ms": 1448, "c_stopped_ms": 1966, "c_finished_ms": None,
                   "c_committed": False},
}  # fmt: skip


def _within(simulated: Any, measured: Any, rel: float = 0.10) -> bool:
    if measured is None or isinstance(measured, bool) or simulated is None:
        return bool(simulated == measured)
    return bool(simulated == pytest.approx(measured, rel=rel))


def _slope(series: list[list[float]], start: float, end: float) -> float:
    """Least-squares growth per second of [t, n] points with start <= t <= end."""
    points = [(t, n) for t, n in series if start <= t <= end]
    mean_t = sum(t for t, _ in points) / len(points)
    mean_n = sum(n for _, n in points) / len(points)
    num = sum((t - mean_t) * (n - mean_n) for t, n in points)
    return num / sum((t - mean_t) ** 2 for t, _ in points)


@pytest.fixture(scope="module")
def cascade() -> dict[str, Any]:
    """The cascade example's JSON, all four variants."""
    path = Path(__file__).resolve().parents[2] / "examples" / "sim" / "cascade.toml"
    return run_scenario(path, seed=1).to_dict()["variants"]  # type: ignore[no-any-return]


def test_cascade_json_has_the_lab_keys(cascade: dict[str, Any]) -> None:
    """Every variant carries the lab's cascade keys, so a lab run compares key by key."""
    assert set(cascade) == {"no_timeout", "timeout", "bulkhead", "deadlines"}
    for variant in cascade.values():
        assert variant.keys() >= CASCADE_KEYS


def test_cascade_no_timeout_grows_and_starves_checkout(cascade: dict[str, Any]) -> None:
    """No timeout: /home grows ~48/s to ~479, the pool holds 20, checkout 4 ok / 95 failed."""
    v = cascade["no_timeout"]
    assert _slope(v["home_in_flight_series"], 1.0, 9.9) == pytest.approx(48, rel=0.10)
    assert _within(v["home_in_flight_end"], 479)
    assert v["checkout_ok"] == 4  # those sent in the first 0.4 s, before the pool filled
    assert _within(v["checkout_failed"], 95)
    assert v["loads"]["checkout"]["causes"] == {"client_timeout": 96}
    assert v["downstream_open_max"] == 20  # the downstream is not overloaded: 20 open


def test_cascade_timeout_keeps_in_flight_flat(cascade: dict[str, Any]) -> None:
    """A 300 ms limit with a fallback: ~15 in flight, flat, and every checkout succeeds."""
    v = cascade["timeout"]
    assert _within(v["home_in_flight_end"], 15)
    assert abs(_slope(v["home_in_flight_series"], 1.0, 9.9)) < 0.5
    assert v["checkout_ok"] == v["checkout_requests"] == 100
    assert v["checkout_failed"] == 0
    assert v["checkout_p99_ms"] < 50


def test_cascade_bulkhead_saves_checkout_but_home_still_grows(cascade: dict[str, Any]) -> None:
    """A separate pool: checkout 100% healthy, yet /home keeps growing (~480 after 10 s)."""
    v = cascade["bulkhead"]
    assert _within(v["home_in_flight_end"], 480)
    assert v["checkout_ok"] == 100 and v["checkout_failed"] == 0
    assert v["checkout_p99_ms"] < 50


def test_cascade_deadlines_bound_everything(cascade: dict[str, Any]) -> None:
    """The library's defaults: flat in flight, healthy checkout, no orphans downstream."""
    v = cascade["deadlines"]
    assert _within(v["home_in_flight_end"], 15)
    assert v["checkout_ok"] == 100 and v["checkout_failed"] == 0
    assert v["home_ok"] == 500  # every page renders, without recommendations
    assert v["downstream_in_flight_max"] <= 20  # abandoned calls stop downstream too
    assert cascade["timeout"]["downstream_in_flight_max"] > 400  # ... unlike a bare timeout


@pytest.fixture(scope="module")
def chain() -> dict[str, Any]:
    """The chain example's JSON, both variants."""
    path = Path(__file__).resolve().parents[2] / "examples" / "sim" / "chain.toml"
    return run_scenario(path, seed=1).to_dict()["variants"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("variant", ["fixed", "propagated"])
def test_chain_matches_the_chapter(chain: dict[str, Any], variant: str) -> None:
    """Who gives up when, within 10% of the chapter's measurements, in the lab's keys."""
    simulated = chain[variant]
    assert simulated.keys() >= CHAIN_KEYS
    for key, measured in CHAPTER_CHAIN[variant].items():
        assert _within(simulated[key], measured), (key, simulated[key], measured)


def test_chain_fixed_commits_for_nobody(chain: dict[str, Any]) -> None:
    """Fixed limits: C commits at ~3.5 s, long after the user was told it failed."""
    fixed = chain["fixed"]
    assert fixed["c_committed"] is True
    assert fixed["c_finished_ms"] > fixed["a_answered_ms"] + 1000
    assert fixed["c_budget_ms"] is None  # nobody told C anything


def test_chain_propagated_stops_c_before_the_user_gives_up(chain: dict[str, Any]) -> None:
    """Propagated budget: C stops at ~1.97 s, no commit, and A answers before 2 s."""
    propagated = chain["propagated"]
    assert propagated["c_committed"] is False
    assert 1900 <= propagated["c_stopped_ms"] < 2000
    assert propagated["a_answered_ms"] < 2000
    assert propagated["user_failed"] == 1
    assert propagated["loads"]["user"]["causes"] == {"deadline": 1}  # a 504, not a hang
