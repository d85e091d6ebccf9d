"""One reading of durations, one TOML line locator and one percentile for plan, sim and lab."""

from __future__ import annotations

import textwrap

import pytest

from deadlines._tools import durations
from deadlines._tools.stats import percentile
from deadlines._tools.toml_lines import Locator, path_of
from deadlines.plan import PlanError
from deadlines.plan import parse as parse_plan
from deadlines.sim import ScenarioError, parse_scenario

READINGS = [
    ("40ms", 0.04),
    ("2s", 2.0),
    ("1.5 s", 1.5),
    ("250us", 250e-6),
    ("250µs", 250e-6),
    ("1m", 60.0),
    ("2min", 120.0),
    ("300MS", 0.3),
    ("1e-1s", 0.1),
    ("2", 2.0),
    (".5s", 0.5),
    (3, 3.0),
    (0.25, 0.25),
]
REFUSED = ["2h", "fast", "", "-1s", "1.5.2s", "inf", True, None, [1]]


def toml(value: object) -> str:
    """`value` written as a TOML scalar."""
    if isinstance(value, bool):
        return str(value).lower()
    return f'"{value}"' if isinstance(value, str) else repr(value)


def plan_text(deadline: object) -> str:
    """A minimal plan whose route deadline is `deadline` (a TOML scalar)."""
    value = toml(deadline)
    return textwrap.dedent(f"""\
        [route]
        name = "r"
        deadline = {value}

        [[route.calls]]
        name = "db"
        latency = {{ p50 = "4ms", p99 = "18ms" }}
        """)


def sim_text(duration: object) -> str:
    """A minimal scenario whose duration is `duration` (a TOML scalar)."""
    value = toml(duration)
    return textwrap.dedent(f"""\
        duration = {value}

        [services.s.routes.r]
        work = "10ms"

        [[load]]
        to = "s/r"
        rate = 1
        """)


@pytest.mark.parametrize(("text", "seconds"), READINGS)
def test_plan_sim_and_flags_read_a_duration_alike(text: object, seconds: float) -> None:
    """The same string means the same seconds to plan, sim and a lab or sim flag."""
    assert durations.parse(text) == pytest.approx(seconds)
    assert parse_plan(plan_text(text)).deadline == pytest.approx(seconds)
    if seconds > 0:
        model = parse_scenario(sim_text(text)).variants
        assert next(iter(model.values())).duration == pytest.approx(seconds)
    if isinstance(text, str):
        assert durations.flag(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", REFUSED, ids=repr)
def test_plan_and_sim_refuse_the_same_strings(text: object) -> None:
    """What one tool refuses, the other refuses, with the same words."""
    with pytest.raises(ValueError, match="expected") as direct:
        durations.parse(text)
    if text is None or isinstance(text, list):
        return  # not a TOML scalar
    with pytest.raises(PlanError) as plan_error:
        parse_plan(plan_text(text))
    with pytest.raises(ScenarioError) as sim_error:
        parse_scenario(sim_text(text))
    assert str(direct.value) in str(plan_error.value)
    assert str(direct.value) in str(sim_error.value)


def test_a_duration_past_a_year_is_refused() -> None:
    """More than a year is a unit mistake, not a timeout."""
    with pytest.raises(ValueError, match="at most a year"):
        durations.parse(f"{366 * 24 * 61}m")


def test_a_unitless_string_over_a_minute_is_doubted() -> None:
    """ "2000" and 2000 are both read as seconds, and both warned about."""
    assert durations.implausible_bare("2000") == durations.implausible_bare(2000)
    assert durations.implausible_bare("2000") is not None
    assert durations.implausible_bare("2000ms") is None
    assert durations.implausible_bare("30") is None


def test_locator_finds_keys_tables_and_array_entries() -> None:
    """Lines of plain keys, nested tables, the nth array-of-tables entry and dotted keys."""
    text = textwrap.dedent("""\
        duration = "2s"

        [services.api.routes.home]
        work = "10ms"

        [[load]]
        to = "api/home"

        [[load]]
        to = "api/home"
        rate = 5
        """)
    locate = Locator(text)
    assert locate.line(("duration",)) == 1
    assert locate.line(("services", "api", "routes", "home", "work")) == 4
    assert locate.line(path_of("load[1].rate")) == 11
    assert locate.line(path_of("load[1].missing")) == 9  # its table, the nearest line
    assert locate.line(("nowhere",)) is None
    assert path_of("variants.fast.load[0].rate") == ("variants", "fast", "load", 0, "rate")


def test_percentile_is_nearest_rank() -> None:
    """A percentile is a value that was observed: nearest rank, None without samples."""
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == 3.0
    assert percentile([float(v) for v in range(1, 101)], 0.99) == 99.0
    assert percentile([float(v) for v in range(1, 1001)], 0.999) == 999.0
    assert percentile([7.0], 0.01) == 7.0
    assert percentile([], 0.99) is None
