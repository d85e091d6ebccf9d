"""`run_scenario`: run every variant of a scenario with one seed and collect the figures."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from .engine import simulate
from .model import Scenario
from .result import Result, summarize
from .scenario import ScenarioError, load_scenario, scenario_from_dict, with_overrides


def run_scenario(
    scenario: Scenario | Mapping[str, Any] | str | Path,
    *,
    seed: int | None = None,
    variants: Iterable[str] | None = None,
    duration: float | timedelta | None = None,
    drain: float | timedelta | None = None,
) -> Result:
    """Simulate `scenario` (a `Scenario`, a TOML path, or its parsed dictionary).

    Args:
        seed: Overrides the scenario's seed; the same seed gives the same figures.
        variants: Run only these variants (default: all, in file order).
        duration: Send load for this long instead (seconds), e.g. a short test run.
        drain: Keep running this long after the load instead.
    """
    if isinstance(scenario, str | Path):
        scenario = load_scenario(scenario)
    elif not isinstance(scenario, Scenario):
        scenario = scenario_from_dict(scenario)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    scenario = with_overrides(scenario, duration=_seconds(duration), drain=_seconds(drain))
    names = list(scenario.variants) if variants is None else list(variants)
    for name in names:
        if name not in scenario.variants:
            known = ", ".join(scenario.variants)
            raise ScenarioError(f"no variant {name!r} (variants: {known})", source=scenario.name)
    run_seed = scenario.seed if seed is None else seed
    results = {name: summarize(name, simulate(scenario.variants[name], run_seed)) for name in names}
    return Result(scenario.name, scenario.description, run_seed, results)


def _seconds(value: float | timedelta | None) -> float | None:
    if isinstance(value, timedelta):
        return value.total_seconds()
    return value
