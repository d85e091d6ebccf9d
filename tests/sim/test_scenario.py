"""Scenario files: durations, variants merged over the base, and errors naming key and line."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from deadlines.sim import (
    Calls,
    Distribution,
    ScenarioError,
    Work,
    load_scenario,
    parse_scenario,
    run_scenario,
    with_overrides,
)

BASE = """\
name = "t"
duration = "2s"

[services.api]
servers = 2

[services.api.routes.r]
steps = [{ work = "20ms" }, { call = ["a", "b"] }]

[services.api.calls.a]
to = "db/q"
timeout = "300ms"

[services.api.calls.b]
to = "db/q"

[services.db.routes.q]
work = { dist = "lognormal", median = "40ms", p99 = "180ms" }

[[load]]
to = "api/r"
rate = 5
"""


def test_durations_steps_and_distributions_parse() -> None:
    """Times take units; steps keep their order; calls in one step run in parallel."""
    scenario = parse_scenario(BASE)
    model = scenario.variants["base"]
    assert model.duration == 2.0
    route = model.services["api"].routes["r"]
    assert route.steps == (Work(Distribution("constant", 0.02)), Calls(("a", "b")))
    assert model.services["api"].calls["a"].timeout == pytest.approx(0.3)
    assert model.services["api"].calls["b"].timeout is None  # no limit unless given
    dist = model.services["db"].routes["q"].steps[0]
    assert isinstance(dist, Work)
    assert dist.duration == Distribution("lognormal", 0.04, 0.18)
    sigma = math.log(0.18 / 0.04) / 2.3263  # the normal's 99th percentile
    assert dist.duration.mean == pytest.approx(0.04 * math.exp(sigma**2 / 2), rel=1e-4)


def test_variants_merge_over_the_base_and_none_removes_a_limit() -> None:
    """A variant overrides only what it names; "none" lifts a limit."""
    text = (
        BASE
        + """
[variants.plain]
[variants.loose.services.api.calls.a]
timeout = "none"
[variants.fast]
duration = 1
services.db.routes.q.work = "1ms"
"""
    )
    variants = parse_scenario(text).variants
    assert list(variants) == ["plain", "loose", "fast"]
    assert variants["plain"].services["api"].calls["a"].timeout == pytest.approx(0.3)
    assert variants["loose"].services["api"].calls["a"].timeout is None
    assert variants["loose"].services["api"].calls["a"].service == "db"  # kept from the base
    assert variants["fast"].duration == 1.0
    assert variants["fast"].services["api"].servers == 2


@pytest.mark.parametrize(
    ("edit", "key", "line", "message"),
    [
        (
            ('timeout = "300ms"', 'timeout = "3 seconds"'),
            "services.api.calls.a.timeout",
            12,
            "expected a duration",
        ),
        (("servers = 2", "servres = 2"), "services.api.servres", 5, "did you mean 'servers'"),
        (
            ("servers = 2", "zzz = 2"),
            "services.api.zzz",
            5,
            "expected one of: calls, connect_time, deadline, lb, loop, pools, queue_limit,",
        ),
        (
            ('to = "db/q"\ntimeout', 'to = "db/x"\ntimeout'),
            "services.api.calls.a.to",
            11,
            "no route 'x' in db",
        ),
        (("rate = 5", "rate = -5"), "load[0].rate", 22, "requests per second"),
        (
            ('{ call = ["a", "b"] }', '{ call = ["a", "c"] }'),
            "services.api.routes.r.steps[1]",
            8,
            "no call 'c'",
        ),
    ],
    ids=["duration", "unknown-key", "unknown-key-no-match", "bad-target", "rate", "unknown-call"],
)
def test_errors_name_the_key_and_line(
    edit: tuple[str, str], key: str, line: int, message: str
) -> None:
    """A bad value is reported with its dotted key, its line and what was expected."""
    text = BASE.replace(*edit)
    assert text != BASE
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, source="x.toml")
    assert info.value.key == key
    assert info.value.line == line
    assert message in str(info.value)
    assert str(info.value).startswith(f"x.toml, line {line}, {key}: ")


def test_error_in_a_variant_names_the_variant() -> None:
    """A bad override is reported under the variant that made it."""
    text = BASE + '\n[variants.v.services.api.calls.a]\npool = "nope"\n'
    with pytest.raises(ScenarioError, match=r"variants\.v\.services\.api\.calls\.a\.pool"):
        parse_scenario(text)


def test_invalid_toml_and_missing_file_are_scenario_errors(tmp_path: Path) -> None:
    """Syntax errors keep tomllib's line; an unreadable file says so."""
    with pytest.raises(ScenarioError, match="line 2"):
        parse_scenario('name = "t"\nduration = = 1\n')
    with pytest.raises(ScenarioError, match="cannot read"):
        load_scenario(tmp_path / "missing.toml")


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ('kind = "slow"\nservice = "db"\nfactor = 0', "factor > 0"),
        ('kind = "down"\nservice = "db"\nserver = 3', "index 0..0"),
        ('kind = "melt"\nservice = "db"', "slow, hang, down or blackhole"),
        ('kind = "hang"\nservice = "dbb"', "did you mean 'db'"),
    ],
)
def test_fault_checks(fault: str, message: str) -> None:
    """Faults must name a real service, server and kind."""
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(BASE + "\n[[faults]]\n" + fault + "\n")


def test_loop_costs_parse() -> None:
    """`loop = { arrival, left, passes }`: each may be left out (0 s, 0 s, 1 pass)."""
    text = BASE.replace("servers = 2", 'servers = 2\nloop = { arrival = "350us" }')
    model = parse_scenario(text).variants["base"]
    loop = model.services["api"].loop
    assert loop is not None
    assert (loop.arrival, loop.left, loop.passes) == (0.00035, 0.0, 1)
    assert model.services["db"].loop is None


@pytest.mark.parametrize(
    ("loop", "key", "message"),
    [
        ("loop = { arrival = -0.001 }", "services.api.loop.arrival", "finite duration >= 0"),
        ('loop = { left = "2s" }', "services.api.loop.left", "at most 1s, got 2s"),
        ('loop = { arival = "1ms" }', "services.api.loop.arival", "did you mean 'arrival'"),
        ('loop = "1ms"', "services.api.loop", "table"),
        ("loop = { passes = 0 }", "services.api.loop.passes", "integer from 1 to 100, got 0"),
    ],
    ids=["negative", "too-long", "typo", "not-a-table", "passes"],
)
def test_loop_checks(loop: str, key: str, message: str) -> None:
    """Bad loop costs are reported with their key and line."""
    with pytest.raises(ScenarioError, match=message) as info:
        parse_scenario(BASE.replace("servers = 2", "servers = 2\n" + loop), source="x.toml")
    assert info.value.key == key
    assert info.value.line == 6


def test_overrides_shorten_every_variant_and_reject_nonsense() -> None:
    """`with_overrides` (the CLI's --duration) replaces duration and drain everywhere."""
    scenario = parse_scenario(BASE + "\n[variants.a]\n[variants.b]\n")
    short = with_overrides(scenario, duration=0.5, drain=0.1)
    assert {m.duration for m in short.variants.values()} == {0.5}
    assert {m.drain for m in short.variants.values()} == {0.1}
    with pytest.raises(ValueError, match="positive"):
        with_overrides(scenario, duration=0)
    with pytest.raises(ScenarioError, match="no variant 'c'"):
        run_scenario(scenario, variants=["c"])
