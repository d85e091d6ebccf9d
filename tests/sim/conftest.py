"""Shared helpers for the simulator's tests: the example scenarios' paths."""

from __future__ import annotations

from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "sim"


@pytest.fixture
def examples() -> Path:
    """The folder of shipped example scenarios."""
    return EXAMPLES
