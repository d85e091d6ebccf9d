"""The metrics overhead benchmark keeps working: a `--quick` run goes end to end."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_overhead_run_reports_every_row(tmp_path: Path) -> None:
    """A quick run exits 0, prints the table and gives finite figures for each row; each
    backend's real-call row is judged, and every one has its A/A control."""
    out = tmp_path / "overhead.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-W",
            "error",
            str(ROOT / "benchmarks" / "metrics_overhead.py"),
            "--quick",
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert data["steadiness"]["before"]["spread"] >= 1.0
    assert data["steadiness"]["after"]["spread"] >= 1.0
    names = [row["name"] for row in rows]
    assert "event path: prometheus" in names and "event path: all three" in names
    for row in rows:
        assert row["a"]["n"] > 0 and row["b"]["n"] > 0
        assert math.isfinite(row["ratio"]) and row["ratio"] > 0
    assert "CPU µs per call" in proc.stdout
    assert "steadiness (fixed work" in proc.stdout
    httpx_rows = [row for row in rows if row["name"].startswith("httpx GET")]
    assert httpx_rows
    for row in httpx_rows:  # paired: one ratio per neighbouring pair of batches
        assert len(row["rounds"]) == row["a"]["n"] == row["b"]["n"]
    by_name = {row["name"]: row for row in rows}
    for exporter in ("prometheus", "otel", "all three"):
        row = by_name[f"httpx GET on loopback: {exporter}"]
        control = by_name[f"httpx GET on loopback: A/A ({exporter} run)"]
        if exporter == "all three":  # both backends and the log at once: reported
            assert row["goal"] == "report" and row["passed"] is None
        else:  # the goal is judged per metrics backend
            assert row["passed"] == (row["ratio"] <= 1.05)
        # The control's sides are both calls without an exporter: the row's own A samples.
        assert control["goal"] == "report" and control["passed"] is None
        assert control["a"] == row["a"] and control["b"]["n"] == row["b"]["n"]
