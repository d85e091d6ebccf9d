"""The benchmark suite keeps working: `benchmarks/run.py --quick` runs end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_quick_run_writes_every_row(tmp_path: Path) -> None:
    """A quick run exits 0 and its JSON has a finite A and B for every comparison."""
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["rows"], "no comparison ran"
    for row in data["rows"]:
        assert row["a"]["n"] > 0
        assert row["b"]["n"] > 0
        assert row["ratio"] == row["ratio"]  # not NaN
    assert "comparison" in proc.stdout
