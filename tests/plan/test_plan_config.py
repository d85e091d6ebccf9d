"""Plan files: the chapter's examples load, and malformed ones say which line and what."""

from __future__ import annotations

from pathlib import Path

import pytest

from deadlines.plan import PlanError, load, parse

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "plan"

MINIMAL = """\
[route]
name = "GET /x"
deadline = "2s"

[[route.calls]]
name = "pricing"
latency = { p50 = "40ms", p99 = "180ms", p999 = "310ms" }
"""


def _error(text: str) -> PlanError:
    with pytest.raises(PlanError) as info:
        parse(text, file="p.toml")
    return info.value


def test_examples_load() -> None:
    """Every example plan loads, with its CSV and Prometheus samples."""
    for path in sorted(EXAMPLES.glob("*.toml")):
        route = load(path)
        assert route.deadline > 0
        assert route.body.items


def test_minimal_plan() -> None:
    """Durations are strings with units or numbers of seconds."""
    route = parse(MINIMAL.replace('"2s"', "2.5"), file="p.toml")
    assert route.deadline == 2.5
    call = route.body.items[0]
    assert call.name == "pricing"
    assert call.latency.p999 == pytest.approx(0.31)


def test_bad_duration_names_line_and_expectation() -> None:
    """A duration that is not one names its line, its key and what was expected."""
    error = _error(MINIMAL.replace('p99 = "180ms"', 'p99 = "fast"'))
    assert error.line == 7
    assert error.where == "route.calls[0].latency.p99"
    assert 'expected a duration with a unit (us, ms, s, m or min), like "40ms"' in str(error)
    assert str(error).startswith("p.toml:7: route.calls[0].latency.p99: ")


def test_toml_syntax_error_names_line() -> None:
    """Broken TOML reports the line tomllib found."""
    error = _error(MINIMAL.replace('deadline = "2s"', "deadline = 2s"))
    assert error.line == 3
    assert "expected valid TOML" in str(error)


def test_unknown_key_is_a_typo() -> None:
    """A misspelt key is named, with the keys that are allowed."""
    error = _error(MINIMAL + 'timout = "1s"\n')
    assert error.line == 8
    assert "unknown key 'timout'" in str(error)
    assert "timeout" in str(error)


def test_missing_pieces() -> None:
    """Missing route, deadline, calls or latency source are each explained."""
    assert "expected a [route] table" in str(_error("[[layers]]\nname='b'\ntimeout='1s'\n"))
    assert "expected deadline =" in str(_error(MINIMAL.replace('deadline = "2s"\n', "")))
    no_calls = _error('[route]\nname = "x"\ndeadline = "1s"\n')
    assert "expected at least one [[route.calls]]" in str(no_calls)
    neither = _error(
        MINIMAL.replace(
            'latency = { p50 = "40ms", p99 = "180ms", p999 = "310ms" }',
            'latency = { p50 = "40ms" }',
        )
    )
    assert "expected exactly one of" in str(neither)
    assert neither.line == 7


def test_quantiles_out_of_order() -> None:
    """p50 <= p99 <= p99.9 is checked."""
    error = _error(MINIMAL.replace('p999 = "310ms"', 'p999 = "100ms"'))
    assert "expected p99 <= p99.9" in str(error)
    assert error.line == 7


def test_errors_in_nested_arrays_of_tables() -> None:
    """Errors deep in nested [[route.calls.calls]] point at the right line."""
    text = MINIMAL + (
        '\n[[route.calls]]\nname = "fan"\nmode = "parallel"\n\n'
        '[[route.calls.calls]]\nname = "a"\nlatency = { p50 = "1ms", p99 = "2ms" }\n\n'
        '[[route.calls.calls]]\nname = "b"\nlatency = { p50 = "1ms", p99 = "2ms" }\n'
        "attempts = 0\n"
    )
    error = _error(text)
    assert error.where == "route.calls[1].calls[1].attempts"
    assert error.line == 20
    assert "expected an integer 1-100" in str(error)


def test_wrong_types() -> None:
    """Booleans, modes and tables of the wrong type are named."""
    assert "expected true or false" in str(_error(MINIMAL + "critical = 1\n"))
    mode = _error(MINIMAL.replace('deadline = "2s"', 'deadline = "2s"\nmode = "fanout"'))
    assert "expected 'sequential' or 'parallel'" in str(mode)
    assert mode.line == 4
    latency = _error(MINIMAL.replace('{ p50 = "40ms", p99 = "180ms", p999 = "310ms" }', '"fast"'))
    assert "route.calls[0].latency: expected a table, got a string" in str(latency)


def test_sample_file_errors_name_the_sample_file(tmp_path: Path) -> None:
    """A bad line in a CSV file is reported in that file, not in the plan."""
    (tmp_path / "s.csv").write_text("latency_ms\n" + "5\n" * 150 + "oops\n")
    plan = tmp_path / "p.toml"
    plan.write_text(
        MINIMAL.replace('{ p50 = "40ms", p99 = "180ms", p999 = "310ms" }', '{ csv = "s.csv" }')
    )
    with pytest.raises(PlanError) as info:
        load(plan)
    assert info.value.file == str(tmp_path / "s.csv")
    assert info.value.line == 152
    missing = tmp_path / "q.toml"
    missing.write_text(plan.read_text().replace("s.csv", "nope.csv"))
    with pytest.raises(PlanError, match="cannot read"):
        load(missing)


def test_quoted_p99_9_key_and_its_line() -> None:
    """`"p99.9"` is accepted as a quoted key, and an error in it names its line."""
    text = MINIMAL.replace('p999 = "310ms"', '"p99.9" = "310ms"')
    assert parse(text, file="p.toml").body.items[0].latency.p999 == pytest.approx(0.31)
    multiline = MINIMAL.replace(
        'latency = { p50 = "40ms", p99 = "180ms", p999 = "310ms" }',
        '[route.calls.latency]\np50 = "40ms"\np99 = "180ms"\n"p99.9" = "soon"',
    )
    error = _error(multiline)
    assert error.where == "route.calls[0].latency.p99.9"
    assert error.line == 10


def test_a_bare_number_too_large_for_seconds_is_kept_with_a_warning() -> None:
    """`deadline = 2000` is 2,000 s, as written, with a located warning; units silence it."""
    route = parse(MINIMAL.replace('"2s"', "2000"), file="p.toml")
    assert route.deadline == 2000.0
    assert route.warnings == (
        'p.toml:3: route.deadline: warning: 2000 is read as 2,000 s; write "2000ms" if you'
        ' meant milliseconds, or "2000s" to keep it',
    )
    assert parse(MINIMAL.replace('"2s"', '"2000s"')).warnings == ()
    assert parse(MINIMAL.replace('"2s"', "60")).warnings == ()
    assert parse(MINIMAL).warnings == ()


def test_durations_past_a_year_are_refused_not_overflowed() -> None:
    """1e306 s is refused with its key named, before any arithmetic can overflow on it."""
    error = _error(MINIMAL.replace('"2s"', "1e306"))
    assert error.where == "route.deadline"
    assert "at most a year" in str(error)
    error = _error(MINIMAL.replace('p99 = "180ms", p999 = "310ms"', "p99 = 1e300"))
    assert error.where == "route.calls[0].latency.p99"


def test_files_that_are_not_utf8_are_refused_by_name(tmp_path: Path) -> None:
    """A binary plan or sample file is a PlanError naming the file and the byte."""
    plan = tmp_path / "p.toml"
    plan.write_bytes(b"\xfc\x80binary")
    with pytest.raises(PlanError, match=r"expected UTF-8 text, got byte 0xfc at offset 0"):
        load(plan)
    (tmp_path / "s.csv").write_bytes(b"latency_ms\n\xff\n")
    plan.write_text(
        MINIMAL.replace('{ p50 = "40ms", p99 = "180ms", p999 = "310ms" }', '{ csv = "s.csv" }')
    )
    with pytest.raises(PlanError, match=r"s\.csv: cannot read the samples: expected UTF-8"):
        load(plan)
