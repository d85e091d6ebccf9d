"""Shared test configuration: anyio backends and service checks."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio unless a test parametrizes `anyio_backend` itself."""
    return "asyncio"


def pytest_report_header(config: pytest.Config) -> str:
    """Say whether missing services fail the run (CI) or not."""
    required = os.environ.get("DEADLINES_REQUIRE_SERVICES") == "1"
    return f"deadlines: services required = {required}"
