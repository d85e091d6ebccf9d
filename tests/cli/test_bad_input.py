"""Bad input to any subcommand: one line naming the file or flag and what is accepted, exit 2.

Each case is run as a user would run it (a `deadlines` process in a scratch folder).
None may print a traceback, and none may start work first: no table, no JSON, no
progress before the error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .helpers import Run, deadlines

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

PLAN = """\
[route]
name = "GET /x"
deadline = {deadline}

[[route.calls]]
name = "pricing"
latency = {{ p50 = "40ms", p99 = {p99} }}
"""

SCENARIO = """\
duration = "{duration}"

[services.api.routes.home]
work = "10ms"

[[load]]
to = "api/home"
rate = {rate}
"""

LATIN1 = b'# -*- coding: latin-1 -*-\nimport requests\n\nNAME = "caf\xe9"\nrequests.get(NAME)\n'

FILES: dict[str, bytes | str] = {
    "binary.toml": bytes(range(256)) * 4,
    "huge-p99.toml": PLAN.format(deadline='"2s"', p99="1e300"),
    "overflow.toml": PLAN.format(deadline="1e306", p99='"180ms"'),
    "hours.toml": PLAN.format(deadline='"2h"', p99='"180ms"'),
    "bare.toml": PLAN.format(deadline="2000", p99='"180ms"'),
    "forever.toml": SCENARIO.format(duration="600m", rate="1e7"),
    "short.toml": SCENARIO.format(duration="1s", rate="10"),
    "a-file": "not a directory\n",
    "latin1.py": LATIN1,
    "undeclared.py": LATIN1.split(b"\n", 1)[1],  # latin-1 without its coding line
    "lying.py": b"# -*- coding: ascii -*-\n" + LATIN1.split(b"\n", 1)[1],
    "clean.py": "x = 1\n",
}


@dataclass(frozen=True)
class Case:
    """One command, the exit code it must give, and what its stderr must say."""

    args: list[str]
    code: int
    says: tuple[str, ...]
    hide: tuple[str, ...] = ()
    work_allowed: bool = False
    extra: dict[str, str] = field(default_factory=dict)


CASES = {
    # The nine cases that printed a traceback.
    "plan-binary-file": Case(["plan", "binary.toml"], 2, ("binary.toml", "UTF-8")),
    "plan-p99-1e300": Case(["plan", "huge-p99.toml"], 2, ("latency.p99", "at most a year")),
    "plan-overflow": Case(["plan", "overflow.toml"], 2, ("route.deadline", "at most a year")),
    "sim-plot-under-a-file": Case(
        ["sim", str(EXAMPLES / "sim/chain.toml"), "--plot", "a-file/x.png"],
        2,
        ("--plot a-file/x.png", "is a file, not a directory"),
    ),
    "sim-json-a-directory": Case(
        ["sim", str(EXAMPLES / "sim/chain.toml"), "--json", "."],
        2,
        ("--json .", "is a directory"),
    ),
    "lab-sim-rate-1e12": Case(
        ["lab", "slow-server", "--sim", "--rate", "1e12"], 2, ("--rate", "at most 1e+07")
    ),
    "lab-cascade-pool-size": Case(
        ["lab", "cascade", "--pool-size", "100000000"], 2, ("--pool-size", "at most 100000")
    ),
    "lab-chain-dsn-refused": Case(
        ["lab", "chain", "--dsn", "postgresql://postgres@127.0.0.1:1/test"],
        2,
        ("--dsn", "cannot connect", "127.0.0.1"),
    ),
    "lab-json-under-a-file": Case(
        ["lab", "--json", "a-file/results.json"], 2, ("--json a-file/results.json", "is a file")
    ),
    "lab-dsn-without-psycopg": Case(
        ["lab", "chain", "--dsn", "postgresql://postgres@127.0.0.1:5432/test"],
        2,
        ("--dsn needs psycopg", "pip install 'deadlines[psycopg]'"),
        hide=("psycopg",),
    ),
    "lab-without-the-lab-extra": Case(
        ["lab"], 2, ("aiohttp", "httpx", "pip install 'deadlines[lab]'"), hide=("aiohttp", "httpx")
    ),
    # The cases that were accepted without a word.
    "plan-bare-2000-is-not-seconds": Case(
        ["plan", "bare.toml"],
        0,
        ("bare.toml:3", "route.deadline", "warning", "2,000 s", '"2000ms"'),
        work_allowed=True,
    ),
    "sim-a-run-of-days-is-refused": Case(
        ["sim", "forever.toml"], 2, ("about 3.6e+11 requests", "days", "--force")
    ),
    "audit-unknown-select": Case(
        ["audit", "--select", "XYZ999", "clean.py"], 2, ("--select", "XYZ999", "DLN101")
    ),
    "audit-unknown-ignore": Case(
        ["audit", "--ignore", "DLN9", "clean.py"], 2, ("--ignore", "DLN9", "DLN108")
    ),
    "audit-reads-a-latin1-file-that-says-so": Case(
        ["audit", "latin1.py"], 1, ("",), work_allowed=True, extra={"stdout": "latin1.py:5:1"}
    ),
    "lab-plot-with-every-experiment": Case(
        ["lab", "--plot", "x.png"], 2, ("--plot", "one experiment", "--report")
    ),
    # Units: the message lists the accepted ones.
    "plan-unit-h": Case(["plan", "hours.toml"], 2, ("route.deadline", "(us, ms, s, m or min)")),
    "sim-unit-h": Case(
        ["sim", "short.toml", "--duration", "2h"], 2, ("--duration", "(us, ms, s, m or min)")
    ),
    "lab-unit-h": Case(
        ["lab", "cascade", "--duration", "2h"], 2, ("--duration", "(us, ms, s, m or min)")
    ),
    "lab-cascade-too-many-requests": Case(
        ["lab", "cascade", "--duration", "3000"], 2, ("180,000 requests", "deadlines sim")
    ),
    "lab-a-run-over-an-hour-is-refused": Case(
        ["lab", "chain", "--c-work", "3000"], 2, ("about 100 min", "deadlines sim")
    ),
    "plan-missing-file": Case(["plan", "nope.toml"], 2, ("nope.toml", "No such file")),
    "audit-missing-file": Case(["audit", "nope.py"], 2, ("nope.py", "cannot read")),
    "audit-undeclared-latin1": Case(
        ["audit", "undeclared.py"], 2, ("undeclared.py", "expected UTF-8", "0xe9 at offset 28")
    ),
    "audit-wrong-coding-line": Case(
        ["audit", "lying.py"], 2, ("lying.py", "expected ascii text", "0xe9 at offset 52")
    ),
    "pg-audit-bad-timeout": Case(
        ["pg-audit", "postgresql://127.0.0.1:1/x", "--connect-timeout", "nan"],
        2,
        ("--connect-timeout", "a positive number of seconds"),
    ),
}


def _check(run: Run, case: Case) -> None:
    assert run.code == case.code, run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    for words in case.says:
        assert words in run.stderr, (words, run.stderr)
    for words in case.extra.values():
        assert words in run.stdout, (words, run.stdout)
    if case.code == 2:
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr
    if not case.work_allowed:
        assert run.stdout == "", run.stdout[-2000:]


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """A folder holding every input file the cases use."""
    for name, content in FILES.items():
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
    return tmp_path


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_and_exit_2(name: str, scratch: Path) -> None:
    """Each case exits with its documented code, one line, no traceback, no work done first."""
    case = CASES[name]
    run = deadlines(case.args, cwd=scratch, hide=case.hide, timeout=60)
    _check(run, case)
    if not case.work_allowed:
        assert run.seconds < 30, "validated before any work starts"
    assert sorted(p.name for p in scratch.iterdir()) == sorted(FILES), "no output written"
