"""`benchmarks/versus.py`: the middleware from two trees, each server from its own."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VERSUS = ROOT / "benchmarks" / "versus.py"


def test_each_server_runs_its_own_tree(tmp_path: Path) -> None:
    """Two short paired rounds, a copy of the package against this checkout's."""
    copy = tmp_path / "before" / "src"
    shutil.copytree(ROOT / "src" / "deadlines", copy / "deadlines")
    out = tmp_path / "versus.json"
    argv = [str(copy), str(ROOT / "src"), "--rounds", "2", "--epochs", "1", "--seconds", "0.5"]
    proc = subprocess.run(
        [sys.executable, str(VERSUS), *argv, "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["before"] == str(copy.resolve())
    assert [row["metric"] for row in data["rows"]] == [
        "requests/s",
        "latency ms",
        "p99 ms",
        "CPU µs per req",
    ]
    for row in data["rows"]:
        assert row["a"]["n"] > 0 and row["b"]["n"] > 0
        assert math.isfinite(row["ratio"]) and row["ratio"] > 0
        assert str(copy.resolve()) in row["a_label"] and str(ROOT / "src") in row["b_label"]


def test_a_directory_without_the_package_is_refused(tmp_path: Path) -> None:
    """A path that holds no `deadlines` package is a usage error, before any server starts."""
    proc = subprocess.run(
        [sys.executable, str(VERSUS), str(tmp_path), str(ROOT / "src")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert "holds no deadlines package" in proc.stderr
