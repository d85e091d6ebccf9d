"""Shared test configuration: the anyio backend, and the servers of `testservers`.

Tests that need PostgreSQL or Redis take the `pg_server` or `redis_url` fixture: the
server named in the environment, else the machine's on the default address, else a
throwaway one started for the session. With none of these they fail, never skip.
"""

from __future__ import annotations

import pytest

pytest_plugins = ["testservers"]


@pytest.fixture
def anyio_backend() -> str:
    """Async tests run on asyncio unless a test parametrizes `anyio_backend` itself."""
    return "asyncio"
