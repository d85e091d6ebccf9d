"""The simulator against the lab's real processes (issue 10, point 3): same parameters, within 10%.

Each test takes the figures of the session's quick `deadlines lab` run (real processes on
loopback) and simulates the shipped scenario (`examples/sim/cascade.toml`,
`examples/sim/chain.toml`) or the slow-server twin, fed that run's own parameters from
its JSON `params`. A figure matches when ``|sim - lab| <= max(10% of |lab|, floor)``.
The floors only matter near zero, and are stated beside each figure: 1 request for
counts and in-flight levels, 1 request/s for growth, none for times. Run with ``-rP`` to
see the comparison tables.
"""

from __future__ import annotations

import inspect
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import deadlines
from deadlines._tools import durations
from deadlines.sim import lab_slow_server, run_scenario, scenario_from_dict

from .helpers import QuickAll

pytestmark = [pytest.mark.slow, pytest.mark.realtime, pytest.mark.timeout(300)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "sim"
REL = 0.10
COUNT_FLOOR = 1.0  # requests: a checkout sent at the instant the pool fills can go either way
RATE_FLOOR = 1.0  # requests per second of growth
TIME_FLOOR = 0.0  # ms: every compared time is about 2 s or more


@dataclass
class Row:
    """One compared figure."""

    figure: str
    lab: Any
    sim: Any
    floor: float | None  # None: must be equal

    @property
    def ok(self) -> bool:
        """Within 10% (or the floor), or equal for non-numbers."""
        if self.floor is None or self.lab is None or self.sim is None:
            return bool(self.lab == self.sim)
        return abs(self.sim - self.lab) <= max(REL * abs(self.lab), self.floor)


def _report(title: str, rows: list[Row]) -> str:
    lines = [f"{title}: lab (real processes) vs sim (same parameters)"]
    for r in rows:
        lab = f"{r.lab:.1f}" if isinstance(r.lab, float) else str(r.lab)
        sim = f"{r.sim:.1f}" if isinstance(r.sim, float) else str(r.sim)
        diff = ""
        if r.floor is not None and isinstance(r.lab, int | float) and r.lab and r.sim is not None:
            diff = f"{100.0 * (r.sim - r.lab) / abs(r.lab):+.1f}%"
        mark = "ok" if r.ok else "MISMATCH"
        lines.append(f"  {r.figure:<52} lab {lab:>8}  sim {sim:>8}  {diff:>7}  {mark}")
    text = "\n".join(lines)
    print(text)
    return text


def _check(title: str, rows: list[Row]) -> None:
    text = _report(title, rows)
    assert all(r.ok for r in rows), text


def _slope(series: list[list[float]], start: float, end: float) -> float:
    """Least-squares growth per second of the ``[t, n]`` points with start <= t <= end."""
    points = [(t, n) for t, n in series if start - 1e-9 <= t <= end + 1e-9]
    mean_t = sum(t for t, _ in points) / len(points)
    mean_n = sum(n for _, n in points) / len(points)
    num = sum((t - mean_t) * (n - mean_n) for t, n in points)
    return num / sum((t - mean_t) ** 2 for t, _ in points)


def _level(series: list[list[float]], start: float, end: float) -> float:
    """The mean of the ``[t, n]`` points with start <= t <= end."""
    values = [n for t, n in series if start - 1e-9 <= t <= end + 1e-9]
    return sum(values) / len(values)


# The shipped scenarios, fed the lab run's parameters.


def cascade_twin(p: dict[str, Any]) -> Any:
    """`examples/sim/cascade.toml` with the lab's rates, pool, limits and sampling.

    What the lab's processes do is modelled as they do it: the downstream ignores
    budgets but ends a hung handler when its caller closes the connection; the
    `deadlines` variant uses the library's own defaults (`Dependency` pool wait and
    total, `DeadlineMiddleware` reserve) with the lab's route deadline and fallback.
    """
    from deadlines.aiohttp_web import DeadlineMiddleware

    data = tomllib.loads((EXAMPLES / "cascade.toml").read_text(encoding="utf-8"))
    data.update(duration=p["duration"], drain=p["checkout_timeout"] + 1.0)
    data["sample"] = p["sample_every"]
    api, down = data["services"]["api"], data["services"]["downstream"]
    api["pools"]["shared"]["size"] = p["pool_size"]
    down["routes"]["price"]["work"] = p["price_ms"] / 1000.0
    down["deadline"] = {"honor_inbound": False, "enforce": False, "shed": False,
                        "cancel_on_caller_left": True}  # fmt: skip
    for load in data["load"]:
        load["rate"] = p[f"{load['name']}_rate"]
        if load["name"] == "checkout":
            load["timeout"] = p["checkout_timeout"]
    variants = data["variants"]
    variants["timeout"]["services"]["api"]["calls"]["recs"]["timeout"] = p["recs_timeout"]
    variants["bulkhead"]["services"]["api"]["pools"]["recs"]["size"] = p["pool_size"]
    dep = deadlines.Dependency("twin", pool_size=p["pool_size"])
    reserve = inspect.signature(DeadlineMiddleware).parameters["reserve"].default
    pool = {"size": dep.pool_size, "wait": dep.pool_wait}
    variants["deadlines"] = {
        "services": {
            "api": {
                "deadline": {"default": p["home_deadline"], "max": p["checkout_timeout"],
                             "reserve": reserve},
                "pools": {"recs": pool, "price": pool},
                "calls": {
                    "recs": {"pool": "recs", "timeout": p["recs_timeout"], "fallback": True},
                    "price": {"pool": "price", "timeout": dep.total},
                },
            }
        }
    }  # fmt: skip
    data["variants"] = {name: variants[name] for name in p["variants"]}
    return scenario_from_dict(data, source="cascade twin")


def chain_twin(p: dict[str, Any]) -> Any:
    """`examples/sim/chain.toml` with the lab's work per hop, user wait, limits, reserve."""
    data = tomllib.loads((EXAMPLES / "chain.toml").read_text(encoding="utf-8"))
    services = data["services"]
    for hop in ("a", "b", "c"):
        services[hop]["routes"]["work"]["steps"][0]["work"] = p[f"{hop}_work"]
    data["load"][0]["timeout"] = p["user_wait"]
    data["drain"] = p["a_work"] + p["b_work"] + p["c_work"] + 1.0
    variants = data["variants"]
    variants["fixed"]["services"]["a"]["calls"]["b"]["timeout"] = p["ab_timeout"]
    variants["fixed"]["services"]["b"]["calls"]["c"]["timeout"] = p["bc_timeout"]
    for hop in ("a", "b", "c"):
        # chain.hop's DeadlineMiddleware: header budget (default 10 s, at most 60 s) - reserve
        policy = {"default": 10.0, "max": 60.0, "reserve": p["reserve"]}
        variants["propagated"]["services"][hop]["deadline"] = policy
    data["variants"] = {name: variants[name] for name in p["variants"]}
    return scenario_from_dict(data, source="chain twin")


def overload_twin(p: dict[str, Any], capacity: dict[str, Any]) -> Any:
    """`examples/sim/overload.toml` with the lab's steps, deadline and measured capacity.

    The scenario's loop costs are CPU time measured on an idle core (its `passes` are
    turns of the loop, kept as they are); the lab's service took 1 / C of wall time for
    what takes 1 / ideal there, so they are scaled by that ratio. A served request costs
    its arrival and its work: work = 1 / C - arrival, so that C stays the capacity the
    lab measured. Only the lab's `timeouts` variant has
    a twin in the quick run (the model has no retries at the load and no CoDel).
    """
    data = tomllib.loads((EXAMPLES / "overload.toml").read_text(encoding="utf-8"))
    c = capacity["capacity_per_s"]
    scale = capacity["ideal_per_s"] / c
    service = data["services"]["service"]
    loop = service["loop"]
    for name in ("arrival", "left"):
        loop[name] = durations.parse(loop[name]) * scale
    service["routes"]["work"]["work"] = 1.0 / c - loop["arrival"]
    steps = [(float(x), p["level_for"]) for x in p["loads"]]
    loads, start = [], 0.0
    for i, (load, seconds) in enumerate([*steps, (p["after_load"], p["recover_for"])]):
        name = "after" if i == len(steps) else f"x{load:g}".replace(".", "_")
        count = math.floor(load * c * seconds + 1e-9)
        loads.append({"name": name, "to": "service/work", "rate": load * c,
                      "start": start, "count": count, "timeout": p["deadline"]})  # fmt: skip
        start += seconds
    data.update(load=loads, duration=start, drain=p["deadline"] + 0.5)
    data["variants"] = {"timeouts": data["variants"]["timeouts"]}
    return scenario_from_dict(data, source="overload twin")


# The comparisons.


def test_cascade_matches_the_lab(quick_all: QuickAll) -> None:
    """Cascade: growth per second, flat levels and checkout outcomes within 10% of the lab's."""
    lab = quick_all.data["cascade"]
    p = lab["params"]
    assert set(lab["variants"]) == {"no_timeout", "timeout", "bulkhead", "deadlines"}
    sim = run_scenario(cascade_twin(p), seed=1).to_dict()["variants"]
    end = p["duration"]
    settled = 2 * p["recs_timeout"]  # the first requests have met their limit by then
    rows = []
    for name in ("no_timeout", "bulkhead"):
        measured = lab["variants"][name]["home_in_flight_series"]
        simulated = sim[name]["home_in_flight_series"]
        figure = f"{name}: /home in flight growth, /s (t >= 0.5 s)"
        rows.append(
            Row(figure, _slope(measured, 0.5, end), _slope(simulated, 0.5, end), RATE_FLOOR)
        )
    for name in ("timeout", "deadlines"):
        measured = lab["variants"][name]["home_in_flight_series"]
        simulated = sim[name]["home_in_flight_series"]
        figure = f"{name}: /home in flight level (t >= {settled:g} s)"
        level = (_level(measured, settled, end), _level(simulated, settled, end))
        rows.append(Row(figure, *level, COUNT_FLOOR))
    for name in lab["variants"]:
        for key in ("checkout_ok", "checkout_failed"):
            figure = f"{name}: {key}"
            rows.append(Row(figure, lab["variants"][name][key], sim[name][key], COUNT_FLOOR))
    _check("cascade", rows)


def test_chain_matches_the_lab(quick_all: QuickAll) -> None:
    """Chain: who gives up when, and whether C commits, within 10% of the lab's timeline."""
    lab = quick_all.data["chain"]
    assert set(lab["variants"]) == {"fixed", "propagated"}
    sim = run_scenario(chain_twin(lab["params"]), seed=1).to_dict()["variants"]
    compared = {
        "fixed": ("a_answered_ms", "b_gave_up_ms", "c_finished_ms"),
        "propagated": ("a_answered_ms", "b_gave_up_ms", "c_budget_ms", "c_stopped_ms"),
    }
    rows = []
    for name, keys in compared.items():
        measured, simulated = lab["variants"][name], sim[name]
        for key in keys:
            assert measured[key] is not None, (name, key)
            rows.append(Row(f"{name}: {key}", measured[key], simulated[key], TIME_FLOOR))
        for key in ("a_status", "c_committed"):
            rows.append(Row(f"{name}: {key}", measured[key], simulated[key], None))
    _check("chain", rows)


def test_slow_server_twin_matches_the_lab(quick_all: QuickAll) -> None:
    """`deadlines lab slow-server --sim`'s figures: the lab's keys, and its counts within 10%."""
    lab = quick_all.data["slow-server"]
    sim = lab_slow_server(**lab["params"])
    assert sim["params"].items() >= lab["params"].items()
    assert sim["slow_server"] == lab["slow_server"]
    slow = lab["slow_server"]
    rows = []
    for name, measured in lab["policies"].items():
        simulated = sim["policies"][name]
        assert simulated.keys() == measured.keys(), name
        assert simulated["load"].keys() == measured["load"].keys(), name
        assert simulated["load"]["req"].keys() == measured["load"]["req"].keys(), name
        rows.append(Row(f"{name}: failed", measured["failed"], simulated["failed"], COUNT_FLOOR))
        if name == "least_outstanding":
            continue  # its queues depend on the wire time the model leaves out (docs/sim.md)
        for key in ("queue_max", "served", "dropped"):
            figure = f"{name}: {key} on the slow backend"
            rows.append(Row(figure, measured[key][slow], simulated[key][slow], COUNT_FLOOR))
    _check("slow-server", rows)


def test_overload_twin_matches_the_lab_off_the_knee(quick_all: QuickAll) -> None:
    """Overload, timeouts alone: the share of C answered in time per level, within 10%.

    At 2 and 4 × C (the knee: the queue grows and reaches the deadline within the
    level) the lab's figure follows the machine's load: the capacity while the level
    lasts is not the C measured at the start (2 × C read 23-84 % of C in five full runs
    on the shared machine against the twin's 46-48, and 155 and 182 in two quick ones
    against 182-187; in one quick run beside the whole suite 4 × C read 15 % against
    0). The twin's loop (docs/sim.md) does not change that. Those levels are printed
    only.
    """
    lab = quick_all.data["overload"]
    measured = lab["variants"]["timeouts"]["levels"]
    sim = run_scenario(overload_twin(lab["params"], lab["capacity"]), seed=1)
    simulated = sim.to_dict()["variants"]["timeouts"]
    rows, knee = [], []
    for level in measured:
        name = level["level"].replace(".", "_")
        in_time = 100.0 * simulated[f"{name}_ok"] / max(1, simulated[f"{name}_requests"])
        row = Row(f"timeouts: {level['level']} % of C in time",
                  level["in_time_pct"] * level["load"], in_time * level["load"], 1.0)  # fmt: skip
        (knee if level["load"] in (2.0, 4.0) else rows).append(row)
    _report("overload (2 and 4 × C, printed only)", knee)
    _check("overload", rows)
