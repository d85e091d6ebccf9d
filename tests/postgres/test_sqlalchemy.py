"""deadlines.sqlalchemy against the real Postgres: one install() call, sync engine."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from pgtest_support import running
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

import deadlines
from deadlines import postgres
from deadlines.sqlalchemy import install
from testservers import Postgres

pytestmark = [pytest.mark.postgres, pytest.mark.realtime]

Admin = psycopg.Connection[tuple[object, ...]]


@pytest.fixture
def engine(pg_server: Postgres, app_name: str) -> Iterator[Engine]:
    """A psycopg-backed engine with the hooks installed."""
    eng = create_engine(
        pg_server.url("postgresql+psycopg"),
        pool_size=2,
        pool_timeout=1.0,
        connect_args={"application_name": app_name},
    )
    uninstall = install(eng)
    yield eng
    uninstall()
    eng.dispose()


def statement_timeout(conn: Any) -> str:
    return str(conn.execute(text("SHOW statement_timeout")).scalar_one())


def test_sync_pg_sleep_cancelled_at_the_budget(engine: Engine, admin: Admin, app_name: str) -> None:
    """Sync engine: pg_sleep(5) under a 0.5 s budget is cancelled by Postgres at the budget."""
    start = time.monotonic()
    with (
        pytest.raises(deadlines.DeadlineExceeded) as info,
        deadlines.scope(0.5),
        engine.begin() as conn,
    ):
        conn.execute(text("SELECT pg_sleep(5)"))
    assert 0.45 <= time.monotonic() - start <= 1.0
    assert info.value.phase == "headers" and info.value.dependency == "postgres"
    assert postgres.sqlstate_of(info.value.__cause__ or info.value) == "57014"
    assert running(admin, app_name) == []


def test_limits_only_inside_a_scope_core_and_orm(engine: Engine) -> None:
    """Core connections and ORM sessions get the limits inside a scope, nothing outside."""
    with engine.begin() as conn:
        assert statement_timeout(conn) == "0"
    with deadlines.scope(2.0):
        with engine.begin() as conn:
            assert 1800 <= int(statement_timeout(conn)[:-2]) <= 2000
        with Session(engine) as session, session.begin():
            value = str(session.execute(text("SHOW statement_timeout")).scalar_one())
            assert 1800 <= int(value[:-2]) <= 2000
    with engine.connect() as conn:  # SET LOCAL ended with the transaction
        assert statement_timeout(conn) == "0"


def test_statement_cap_and_lock_timeout(
    pg_server: Postgres, admin: Admin, table: str, app_name: str
) -> None:
    """The dependency's cap gives StatementTimeout; lock_timeout gives LockTimeout."""
    eng = create_engine(
        pg_server.url("postgresql+psycopg"),
        connect_args={"application_name": app_name},
    )
    uninstall = install(eng, dependency=deadlines.Dependency("db", headers=0.3), lock_timeout=0.15)
    try:
        with pytest.raises(postgres.StatementTimeout), deadlines.scope(5.0), eng.begin() as c:
            c.execute(text("SELECT pg_sleep(5)"))
        with admin.transaction():
            admin.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            start = time.monotonic()
            with pytest.raises(postgres.LockTimeout), deadlines.scope(5.0), eng.begin() as c:
                c.execute(text(f"SELECT * FROM {table}"))
            assert 0.1 <= time.monotonic() - start <= 0.8
    finally:
        uninstall()
        eng.dispose()


def test_nothing_committed_after_the_deadline(engine: Engine, admin: Admin, table: str) -> None:
    """A transaction whose deadline passed before commit is rolled back (Core and ORM)."""
    with pytest.raises(deadlines.DeadlineExceeded), deadlines.scope(0.2), engine.begin() as conn:
        conn.execute(text(f"INSERT INTO {table} VALUES (2, 'late')"))
        time.sleep(0.3)
    with (
        pytest.raises(deadlines.DeadlineExceeded),
        deadlines.scope(0.2),
        Session(engine) as session,
        session.begin(),
    ):
        session.execute(text(f"INSERT INTO {table} VALUES (3, 'late')"))
        time.sleep(0.3)
    assert admin.execute(f"SELECT count(*) FROM {table}").fetchone() == (1,)
    with deadlines.scope(2.0), engine.begin() as conn:
        conn.execute(text(f"INSERT INTO {table} VALUES (4, 'in time')"))
    assert admin.execute(f"SELECT count(*) FROM {table}").fetchone() == (2,)


def test_budget_below_min_useful_fails_fast(pg_server: Postgres, app_name: str) -> None:
    """Below min_useful the transaction fails at begin, before any statement."""
    eng = create_engine(
        pg_server.url("postgresql+psycopg"),
        connect_args={"application_name": app_name},
    )
    install(eng, dependency=deadlines.Dependency("postgres", min_useful=0.5))
    try:
        with pytest.raises(deadlines.BudgetExhausted), deadlines.scope(0.2), eng.begin() as c:
            c.execute(text("SELECT 1"))
        assert eng.pool.checkedout() == 0  # type: ignore[attr-defined]
    finally:
        eng.dispose()


def test_install_rejects_other_objects() -> None:
    """install() says clearly what it needs."""
    with pytest.raises(TypeError, match="Engine or AsyncEngine"):
        install("postgresql://nowhere")  # type: ignore[arg-type]
