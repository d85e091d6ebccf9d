"""Shared test configuration: the anyio backend.

Tests that need Postgres (127.0.0.1:5432) or Redis (127.0.0.1:6379) connect to them
directly and fail, never skip, when the service is down; `.ci/run` starts both.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio unless a test parametrizes `anyio_backend` itself."""
    return "asyncio"
