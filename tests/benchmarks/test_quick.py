"""The benchmark suite keeps working: `benchmarks/run.py --quick` runs end to end."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PREFIXES = ("outbound ", "inbound", "firing:", "cascade x10:", "memory per hung call:")


@pytest.mark.timeout(600)  # every suite in turn: a few minutes on a loaded 2-core machine
def test_quick_run_writes_every_row(tmp_path: Path) -> None:
    """A quick run exits 0, covers every suite, and reports finite figures for every row."""
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
    assert data["quick"] is True
    assert data["machine"]["cpus"] and data["machine"]["versions"]["httpx"]
    for when in ("steadiness_before", "steadiness_after"):
        steadiness = data["machine"][when]
        assert steadiness["spread"] >= 1.0
        for p10, p50, p90 in steadiness["work_ms_p10_p50_p90"].values():
            assert 0 < p10 <= p50 <= p90
    assert "inbound A/A: throughput" in [row["name"] for row in data["rows"]]
    assert "inbound, uvicorn[standard]: throughput" in [row["name"] for row in data["rows"]]
    assert "inbound, Starlette's GZipMiddleware: throughput" in [r["name"] for r in data["rows"]]
    assert "inbound, pass-through: throughput" in [r["name"] for r in data["rows"]]
    assert "inbound floor: server CPU per request" in [r["name"] for r in data["rows"]]
    assert "outbound aiohttp: sequential A/A" in [row["name"] for row in data["rows"]]
    names = [row["name"] for row in data["rows"]]
    for prefix in PREFIXES:
        assert any(name.startswith(prefix) for name in names), f"no {prefix!r} row in {names}"
    for row in data["rows"]:
        if "ratio" in row:  # an A/B comparison
            assert row["a"]["n"] > 0
            assert row["b"]["n"] > 0
            assert math.isfinite(row["ratio"]), row["name"]
        else:  # a figure under a bound
            assert row["value"]["n"] > 0
            assert math.isfinite(row["value"]["max"]) and row["bound"] > 0
    assert "comparison" in proc.stdout
    assert "steadiness (fixed work" in proc.stdout
    assert "bounded figure" in proc.stdout
