"""The rules every subcommand follows (docs/cli.md): exit codes, output files, progress."""

from __future__ import annotations

from pathlib import Path

import pytest

from deadlines.__main__ import main

from .helpers import deadlines

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

CLEAN = "x = 1\n"
FINDING = 'import requests\n\nrequests.get("http://127.0.0.1:1/")\n'


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["plan", str(EXAMPLES / "plan/checkout.toml")], 0),
        (["plan", str(EXAMPLES / "plan/search.toml")], 1),
        (["plan"], 2),
        (["sim", str(EXAMPLES / "sim/chain.toml"), "--quiet"], 0),
        (["sim", str(EXAMPLES / "sim/chain.toml"), "--variant", "nope"], 2),
        (["lab", "slow-server", "--sim", "--quiet", "--run-for", "2"], 0),
        (["lab", "chain", "--user-wait", "-1"], 2),
        (["audit", "clean.py"], 0),
        (["audit", "finding.py"], 1),
        (["audit", "--format", "xml", "clean.py"], 2),
        (["pg-audit", "host=127.0.0.1 port=1 user=x", "--connect-timeout", "1"], 2),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else str(value),
)
def test_exit_codes_of_every_subcommand(args: list[str], code: int, tmp_path: Path) -> None:
    """0 ok, 1 findings or violations, 2 bad usage or input (in one line), never a traceback."""
    (tmp_path / "clean.py").write_text(CLEAN)
    (tmp_path / "finding.py").write_text(FINDING)
    run = deadlines(args, cwd=tmp_path, timeout=60)
    assert run.code == code, run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    if code == 2:
        assert len(run.stderr.strip().splitlines()) == 1, run.stderr


def test_a_bug_exits_3_with_its_traceback(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A crash inside a subcommand is neither a finding (1) nor bad input (2): exit 3."""
    from deadlines.plan import cli

    def broken(args: object) -> int:
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(cli, "run", broken)
    assert main(["plan", "x.toml"]) == 3
    err = capsys.readouterr().err
    assert "Traceback" in err and "ZeroDivisionError: a bug" in err
    assert "deadlines plan: internal error (a bug in deadlines" in err


@pytest.mark.parametrize(
    "command",
    [
        ["sim", str(EXAMPLES / "sim/chain.toml"), "--quiet"],
        ["lab", "slow-server", "--sim", "--quiet", "--run-for", "2"],
    ],
    ids=["sim", "lab"],
)
def test_output_files_are_created_or_refused_alike(command: list[str], tmp_path: Path) -> None:
    """sim and lab create missing folders for --json and --plot, and refuse a bad path first."""
    run = deadlines([*command, "--json", "new/a/b.json", "--plot", "new/c/d.png"], cwd=tmp_path)
    assert run.code == 0, run.stderr[-2000:]
    assert (tmp_path / "new/a/b.json").read_text().startswith("{")
    assert (tmp_path / "new/c/d.png").read_bytes()[:4] == b"\x89PNG"
    (tmp_path / "a-file").write_text("")
    for flag in ("--json", "--plot"):
        run = deadlines([*command, flag, "a-file/x"], cwd=tmp_path)
        assert run.code == 2 and run.stdout == ""
        assert (
            run.stderr == f"deadlines {command[0]}: {flag} a-file/x: {tmp_path / 'a-file'}"
            " is a file, not a directory\n"
        )
        run = deadlines([*command, flag, "new"], cwd=tmp_path)
        assert run.code == 2 and run.stderr.endswith(
            f"{flag} new: is a directory; expected a file name\n"
        )


def test_lab_report_for_one_experiment(tmp_path: Path) -> None:
    """--report with one experiment writes its report, with the PNG beside it."""
    run = deadlines(
        ["lab", "slow-server", "--sim", "--quiet", "--run-for", "2", "--report", "r/report.md"],
        cwd=tmp_path,
    )
    assert run.code == 0, run.stderr[-2000:]
    assert "Report: r/report.md" in run.stdout
    text = (tmp_path / "r/report.md").read_text()
    assert "## Slow is worse than down" in text and "![" in text
    assert (tmp_path / "r/slow-server.png").read_bytes()[:4] == b"\x89PNG"


def test_sim_shows_progress_on_a_run_longer_than_two_seconds(tmp_path: Path) -> None:
    """A run over 2 s reports how far it is on stderr; a short one prints nothing there."""
    long = deadlines(
        ["sim", str(EXAMPLES / "sim/slow-server.toml"), "--duration", "240s"],
        cwd=tmp_path,
    )
    assert long.code == 0, long.stderr[-2000:]
    assert "% done" in long.stderr and "[sim] done in" in long.stderr, long.stderr
    short = deadlines(["sim", str(EXAMPLES / "sim/chain.toml")], cwd=tmp_path)
    assert short.code == 0 and short.stderr == ""


def test_a_closed_stdout_ends_quietly_with_141(tmp_path: Path) -> None:
    """`deadlines ... | head` closing the pipe early is no traceback: exit 141, like SIGPIPE."""
    import os
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-m", "deadlines", "audit", "--list-rules"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=dict(os.environ),
        cwd=tmp_path,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the child writes a byte
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert proc.wait(30) == 141, err
    assert err == ""
