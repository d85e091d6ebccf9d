"""`deadlines audit` from the command line, the flake8 plugin, the pre-commit hook."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from deadlines.__main__ import main
from deadlines.audit import RULES, python_files
from deadlines.audit.flake8 import Plugin

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).parent / "corpus"

BAD = 'import requests\n\n\ndef f():\n    return requests.get("u")\n'


def test_text_output_and_exit_status(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Findings print as path:line:col CODE message and exit 1; a clean tree exits 0."""
    bad = tmp_path / "bad.py"
    bad.write_text(BAD)
    (tmp_path / "good.py").write_text("x = 1\n")
    assert main(["audit", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"{bad}:5:12 DLN101 requests.get() without a timeout can wait forever:"
        " pass timeout=(connect, read)"
    ]
    assert main(["audit", str(tmp_path / "good.py")]) == 0
    assert capsys.readouterr().out == ""


def test_json_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--format json prints a list of {path, line, col, code, message}."""
    bad = tmp_path / "bad.py"
    bad.write_text(BAD)
    assert main(["audit", "--format", "json", str(bad)]) == 1
    [finding] = json.loads(capsys.readouterr().out)
    assert finding == {
        "path": str(bad),
        "line": 5,
        "col": 12,
        "code": "DLN101",
        "message": finding["message"],
    }


def test_unparsable_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A file that does not parse is reported on stderr and the exit status is 2."""
    (tmp_path / "broken.py").write_text("def f(:\n")
    assert main(["audit", str(tmp_path)]) == 2
    assert "broken.py:1: cannot parse" in capsys.readouterr().err


def test_select_ignore_exclude_and_list(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--select, --ignore and --exclude narrow the run; --list-rules lists every rule."""
    (tmp_path / "bad.py").write_text(BAD)
    assert main(["audit", "--select", "DLN108", str(tmp_path)]) == 0
    assert main(["audit", "--ignore", "dln101", str(tmp_path)]) == 0
    assert main(["audit", "--exclude", "bad.py", str(tmp_path)]) == 0
    capsys.readouterr()
    assert main(["audit", "--list-rules"]) == 0
    listed = capsys.readouterr().out
    assert all(code in listed for code in RULES)


def test_directories_skip_virtualenvs_and_caches(tmp_path: Path) -> None:
    """Searching a directory skips .venv, __pycache__, build and the like."""
    for folder in (".venv/lib", "__pycache__", "build", "pkg"):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "m.py").write_text("x = 1\n")
    assert [p.relative_to(tmp_path).as_posix() for p in python_files([tmp_path])] == ["pkg/m.py"]


def test_flake8_plugin_interface() -> None:
    """The plugin has name and version and yields (line, col 0-based, 'CODE msg', type)."""
    source = BAD + 'requests.post("u")  # deadlines: ignore[DLN101] on purpose\n'
    lines = source.splitlines(keepends=True)
    plugin = Plugin(ast.parse(source), "bad.py", lines)
    results = list(plugin.run())
    assert plugin.name == "deadlines"
    assert plugin.version
    assert len(results) == 1
    line, col, text, kind = results[0]
    assert (line, col) == (5, 11)
    assert text.startswith("DLN101 requests.get() without a timeout")
    assert kind is Plugin


def test_flake8_plugin_reads_the_file_without_lines(tmp_path: Path) -> None:
    """Given only (tree, filename), the plugin reads the file for suppression comments."""
    path = tmp_path / "m.py"
    path.write_text('import requests\nrequests.get("u")  # deadlines: ignore\nrequests.get("u")\n')
    results = list(Plugin(ast.parse(path.read_text()), str(path)).run())
    assert [r[0] for r in results] == [3]


def test_flake8_entry_point_selects_our_codes() -> None:
    """pyproject's flake8 entry point loads the plugin, and every code starts with its name."""
    text = (ROOT / "pyproject.toml").read_text()
    assert 'DLN = "deadlines.audit.flake8:Plugin"' in text
    assert all(code.startswith("DLN") for code in RULES)
    found = [ep for ep in entry_points(group="flake8.extension") if ep.name == "DLN"]
    if found:  # present when the installed metadata is current
        assert found[0].load() is Plugin


def test_pre_commit_hook_runs_the_audit() -> None:
    """.pre-commit-hooks.yaml declares deadlines-audit running `deadlines audit` on Python."""
    text = (ROOT / ".pre-commit-hooks.yaml").read_text()
    assert "id: deadlines-audit" in text
    assert "entry: deadlines audit" in text
    assert "types: [python]" in text


def test_module_entry_point_runs(tmp_path: Path) -> None:
    """`python -m deadlines audit` works as a subprocess (as pre-commit runs it)."""
    bad = tmp_path / "bad.py"
    bad.write_text(BAD)
    done = subprocess.run(
        [sys.executable, "-m", "deadlines", "audit", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert "DLN101" in done.stdout
