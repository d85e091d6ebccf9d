"""The planner on whole call trees: proposed limits, violations, table and code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import deadlines
from deadlines.__main__ import main
from deadlines.plan import as_json, code, load, parse, plan, table

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "plan"


def _rules(text: str) -> list[str]:
    return [f.rule for f in plan(parse(text, file="p.toml")).violations]


ROUTE = '[route]\nname = "r"\ndeadline = "{deadline}"\n'


def _call(
    name: str, extra: str = "", q: str = 'p50 = "40ms", p99 = "180ms", p999 = "310ms"'
) -> str:
    return f'\n[[route.calls]]\nname = "{name}"\nlatency = {{ {q} }}\n{extra}'


def test_checkout_example_pricing_500_ms_three_attempts() -> None:
    """In the chapter's checkout tree pricing gets 500 ms and three attempts; no violations."""
    result = plan(load(EXAMPLES / "checkout.toml"))
    pricing = result.call("pricing")
    assert pricing.timeout == pytest.approx(0.5)
    assert pricing.attempts == 3
    assert pricing.connect == pytest.approx(0.5)
    assert result.violations == []
    recs = result.call("recs")
    assert not recs.call.critical
    assert recs.timeout <= 0.3
    assert recs.dependency.retry is None
    db = result.call("orders-db")
    assert db.timeout == pytest.approx(0.8)  # the chapter's 800 ms DB statement


def test_single_critical_call_in_two_seconds_fits_three_attempts() -> None:
    """A 2 s route with a 500 ms critical call: three attempts fit, a fourth would not."""
    result = plan(parse(ROUTE.format(deadline="2s") + _call("pricing", "attempts = 4\n")))
    pricing = result.call("pricing")
    assert pricing.timeout == pytest.approx(0.5)
    assert pricing.attempts_fit == 3
    assert pricing.attempts == 3
    assert [f.rule for f in result.violations] == ["retries-fit"]
    assert "at most 3 fit" in result.violations[0].message


def test_fanout_example_tail() -> None:
    """Five parallel calls: the plan reports 1 - 0.99^5, about 4.9% slow requests."""
    result = plan(load(EXAMPLES / "fanout.toml"))
    notes = [f for f in result.findings if f.rule == "fan-out"]
    assert len(notes) == 1
    assert "4.9%" in notes[0].message


def test_search_example_break_two() -> None:
    """Two sequential calls x 3 attempts x 2 s: 12 s worst case, and each rule named."""
    result = plan(load(EXAMPLES / "search.toml"))
    rules = sorted({f.rule for f in result.violations})
    assert rules == ["inner-shorter", "retries-fit"]
    route_level = [f for f in result.violations if f.where == "route"]
    assert "12.3 s" in route_level[0].message
    assert any(f.rule == "connect-syn" for f in result.findings)


def test_timeout_at_p99_fails_healthy_calls() -> None:
    """A configured timeout at or below p99 is a violation that says why."""
    result = plan(parse(ROUTE.format(deadline="2s") + _call("pricing", 'timeout = "180ms"\n')))
    [violation] = result.violations
    assert violation.rule == "above-p99"
    assert "fails at least 1% of healthy calls" in violation.message
    assert violation.line == 5


def test_budget_too_small_caps_below_p99() -> None:
    """A deadline that leaves less than p99 for the call is reported as above-p99."""
    rules = _rules(ROUTE.format(deadline="150ms") + _call("pricing"))
    assert rules == ["above-p99"]


def test_sequential_siblings_shrink_the_share() -> None:
    """A call's share is the budget minus its sequential siblings' p99."""
    text = ROUTE.format(deadline="1s") + _call("a") + _call("b", q='p50 = "0.1s", p99 = "0.6s"')
    result = plan(parse(text))
    assert result.call("a").share == pytest.approx(0.4)
    assert result.call("a").timeout == pytest.approx(0.4)
    assert any(f.rule == "capped" for f in result.findings)


def test_layers_must_shrink_inward() -> None:
    """Browser > edge > route: an edge shorter than the route deadline is a violation."""
    text = (
        ROUTE.format(deadline="2s")
        + '\n[[layers]]\nname = "browser"\ntimeout = "10s"\n'
        + '\n[[layers]]\nname = "edge"\ntimeout = "1s"\n'
        + _call("pricing")
    )
    result = plan(parse(text, file="p.toml"))
    [violation] = result.violations
    assert violation.rule == "inner-shorter"
    assert "route deadline (2 s) is not shorter than edge (1 s)" in violation.message


def test_callee_deadline_longer_than_caller_timeout() -> None:
    """A callee whose own deadline outlives its caller's timeout breaks inner < outer."""
    text = ROUTE.format(deadline="2s") + _call(
        "search",
        'timeout = "1s"\ndeadline = "1.5s"\n\n[[route.calls.calls]]\nname = "index"\n'
        'latency = { p50 = "10ms", p99 = "50ms", p999 = "90ms" }\ntimeout = "1.2s"\n',
        q='p50 = "100ms", p99 = "300ms", p999 = "450ms"',
    )
    result = plan(parse(text, file="p.toml"))
    messages = [f.message for f in result.violations]
    assert any("callee's own deadline (1.5 s)" in m for m in messages)
    assert any(
        "index: configured timeout 1.2 s is not shorter than the search" in m for m in messages
    )
    index = result.call("index")
    assert index.depth == 1
    assert index.share <= 1.0


def test_generated_code_runs_and_matches_the_plan() -> None:
    """The code output is valid Python that builds the same Dependency objects."""
    result = plan(load(EXAMPLES / "checkout.toml"))
    namespace: dict[str, object] = {}
    exec(compile(code(result), "<plan>", "exec"), namespace)
    pricing = namespace["PRICING"]
    assert isinstance(pricing, deadlines.Dependency)
    assert pricing == result.call("pricing").dependency
    assert pricing.total == 0.5
    assert pricing.retry is not None
    assert pricing.retry.attempts == 3


def test_table_and_json_outputs() -> None:
    """The table shows each call and the findings; JSON carries the same numbers."""
    result = plan(load(EXAMPLES / "checkout.toml"))
    text = table(result)
    assert "pricing" in text
    assert "500 ms" in text
    assert "0 violations" in text
    document = json.loads(as_json(result))
    names = [c["name"] for c in document["calls"]]
    assert names == ["pricing", "recs", "orders-db"]
    assert document["calls"][0]["timeout"] == 0.5
    assert document["groups"][0]["fanout_tail"] == pytest.approx(0.0199)


def test_cli_exit_codes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """`deadlines plan`: 0 when clean, 1 on violations, 2 on malformed input."""
    assert main(["plan", str(EXAMPLES / "checkout.toml")]) == 0
    out = capsys.readouterr().out
    assert "PRICING = deadlines.Dependency(" in out
    assert main(["plan", str(EXAMPLES / "search.toml"), "--format", "json"]) == 1
    assert json.loads(capsys.readouterr().out)["findings"]
    bad = tmp_path / "bad.toml"
    bad.write_text('[route]\nname = "x"\ndeadline = "soon"\n')
    assert main(["plan", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}:3: route.deadline: expected a duration" in err
    assert main(["plan", str(EXAMPLES / "fanout.toml"), "--format", "code"]) == 0
    assert capsys.readouterr().out.startswith("# Planned by")


def test_a_proposed_connect_under_the_first_syn_retransmit_is_explained() -> None:
    """A proposed connect under 1 s is marked in the table, explained in the code, and
    warned about with what covers a lost SYN; one of 1 s or more is not."""
    result = plan(load(EXAMPLES / "checkout.toml"))
    warnings = {
        f.message.split(":", 1)[0]: f.message
        for f in result.findings
        if f.rule == "connect-syn" and f.severity == "warning"
    }
    assert set(warnings) == {"pricing", "recs", "orders-db"}
    assert warnings["pricing"].endswith("3 attempts fit, so a retry reconnects")
    assert warnings["recs"].endswith("the fallback covers it")
    assert "500 ms!" in table(result)
    assert "connect=0.5,  # under the 1 s SYN retransmit" in code(result)
    roomy = plan(parse(ROUTE.format(deadline="10s") + _call("slow", q='p50 = "1s", p99 = "2s"')))
    assert roomy.call("slow").connect == pytest.approx(1.5)
    assert not [f for f in roomy.findings if f.rule == "connect-syn"]
    alone = plan(parse(ROUTE.format(deadline="600ms") + _call("only")))
    [only] = [f for f in alone.findings if f.rule == "connect-syn"]
    assert only.message.endswith("no retry fits: a longer deadline, or a retry, would cover it")
