"""`run_scenario`: run every variant of a scenario with one seed and collect the figures."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from .engine import simulate
from .model import Model, Scenario
from .result import Result, summarize
from .scenario import ScenarioError, load_scenario, scenario_from_dict, with_overrides

#: Client requests simulated per second of wall time, for estimates: the README's
#: figure (1.2 M requests in about 30 s); the examples run 1.5-3.5 times faster.
SPEED = 40_000.0


class RunTooLong(ScenarioError):
    """The run's estimated time is over the limit given (`max_seconds`); nothing ran."""

    def __init__(self, message: str, *, source: str, requests: float, seconds: float) -> None:
        super().__init__(message, source=source)
        self.requests = requests
        self.seconds = seconds


def requests_in(model: Model) -> float:
    """How many requests the model's clients send (before retries)."""
    total = 0.0
    for load in model.loads:
        sent = load.rate * max(0.0, model.duration - load.start)
        total += sent if load.count is None else min(sent, load.count)
    return total


def _work_in(model: Model) -> float:
    """Requests plus series samples: each costs about as much to simulate."""
    return requests_in(model) + (model.duration + model.drain) / model.sample


def human_seconds(seconds: float) -> str:
    """``40 s``, ``12 min``, ``5.2 hours``, ``83 days``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} hours"
    return f"{seconds / 86400:,.0f} days"


def run_scenario(
    scenario: Scenario | Mapping[str, Any] | str | Path,
    *,
    seed: int | None = None,
    variants: Iterable[str] | None = None,
    duration: float | timedelta | None = None,
    drain: float | timedelta | None = None,
    max_seconds: float | None = None,
    progress: Callable[[str, float], object] | None = None,
) -> Result:
    """Simulate `scenario` (a `Scenario`, a TOML path, or its parsed dictionary).

    Args:
        seed: Overrides the scenario's seed; the same seed gives the same figures.
        variants: Run only these variants (default: all, in file order).
        duration: Send load for this long instead (seconds), e.g. a short test run.
        drain: Keep running this long after the load instead.
        max_seconds: Raise `RunTooLong` (a `ScenarioError`), before running anything,
            when the run is estimated to take longer: its requests and series samples
            at `SPEED` per second.
        progress: Called as ``progress(variant, done)`` while it runs, `done` being the
            share of the whole run finished (0 to 1), each variant weighted by its work.
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
    weights = {name: _work_in(scenario.variants[name]) for name in names}
    total = sum(weights.values())
    seconds = total / SPEED
    if max_seconds is not None and seconds > max_seconds:
        requests = sum(requests_in(scenario.variants[name]) for name in names)
        raise RunTooLong(
            f"would simulate about {requests:.2g} requests, about {human_seconds(seconds)}"
            f" at ~{SPEED:,.0f} requests/s; lower the rate or the duration",
            source=scenario.name,
            requests=requests,
            seconds=seconds,
        )
    run_seed = scenario.seed if seed is None else seed
    results = {}
    done = 0.0
    for name in names:
        on_slice = None
        if progress is not None:

            def on_slice(fraction: float, name: str = name, before: float = done) -> None:
                progress(name, (before + fraction * weights[name]) / total)

        sim = simulate(scenario.variants[name], run_seed, progress=on_slice)
        results[name] = summarize(name, sim)
        done += weights[name]
    return Result(scenario.name, scenario.description, run_seed, results)


def _seconds(value: float | timedelta | None) -> float | None:
    if isinstance(value, timedelta):
        return value.total_seconds()
    return value
