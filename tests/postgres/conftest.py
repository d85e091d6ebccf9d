"""Fixtures for the Postgres tests: the real server (`pg_server`, see tests/testservers.py),
a throwaway schema, a unique application_name to find our backends, and a TCP proxy that
can be frozen.

These tests FAIL (never skip) when no PostgreSQL server can be had.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from pgtest_support import Proxy, backends

from testservers import Postgres


@pytest.fixture(scope="session")
def server(pg_server: Postgres) -> str:
    """The DSN of the real server (checked to answer by `pg_server`)."""
    return pg_server.dsn


@pytest.fixture
def admin(server: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """An autocommit connection for setup and for looking at pg_stat_activity."""
    with psycopg.connect(server, autocommit=True, application_name="deadlines-test-admin") as c:
        yield c


@pytest.fixture
def app_name(admin: psycopg.Connection[tuple[object, ...]]) -> Iterator[str]:
    """A unique application_name for this test's connections; none may be left behind."""
    name = f"deadlines-test-{uuid.uuid4().hex[:10]}"
    yield name
    # Give closed connections a moment to go, then make sure none stays behind.
    for _ in range(50):
        if not backends(admin, name):
            break
        time.sleep(0.02)
    admin.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = %s",
        (name,),
    )


@pytest.fixture
def table(admin: psycopg.Connection[tuple[object, ...]]) -> Iterator[str]:
    """A throwaway table in a schema unique to this test; dropped afterwards."""
    schema = f"deadlines_pg_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    admin.execute(f"CREATE SCHEMA {schema}")
    admin.execute(f"CREATE TABLE {schema}.items (id int PRIMARY KEY, note text)")
    admin.execute(f"INSERT INTO {schema}.items VALUES (1, 'seed')")
    yield f"{schema}.items"
    admin.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture
def proxy(pg_server: Postgres) -> Iterator[Proxy]:
    """A freezable proxy to Postgres, stopped after the test."""
    p = Proxy(pg_server).start()
    yield p
    p.close()
