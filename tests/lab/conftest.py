"""Fixtures for the lab tests: one quick run of every experiment, shared by the shape tests."""

from __future__ import annotations

import json

import pytest

from .helpers import QuickAll, run_lab


@pytest.fixture(scope="session")
def quick_all(tmp_path_factory: pytest.TempPathFactory) -> QuickAll:
    """One quick run of every experiment (about a minute), as a user would start it."""
    folder = tmp_path_factory.mktemp("lab")
    report = folder / "report.md"
    json_path = folder / "results.json"
    run = run_lab(["--quick", "--report", str(report), "--json", str(json_path)], timeout=280)
    assert run.returncode == 0, run.stderr[-3000:]
    return QuickAll(run, json.loads(json_path.read_text()), report)
