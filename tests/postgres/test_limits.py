"""deadlines.postgres without a server: the SET LOCAL values and the error mapping."""

from __future__ import annotations

import pytest

import deadlines
from deadlines import postgres
from deadlines.testing import FakeClock


class FakePgError(Exception):
    """A driver error as asyncpg and psycopg shape it: a message and a sqlstate."""

    def __init__(self, message: str, sqlstate: str) -> None:
        super().__init__(message)
        self.sqlstate = sqlstate


def test_limits_are_whole_ms_minus_the_reserve_and_never_zero() -> None:
    """1.5 s left gives 1480 ms; less than reserve + 1 ms fails fast instead of sending 0."""
    with FakeClock(), deadlines.scope(1.5):
        limits = postgres.transaction_limits(
            deadlines.CallBudget(postgres.POSTGRES), server_version=150004
        )
        assert limits.statement_ms == 1480 and limits.lock_ms == 1480
        assert limits.statement_source == "deadline" and limits.transaction_ms is None
        assert "set_config('statement_timeout', '1480', true)" in limits.sql()
        assert "client_connection_check_interval', '500'" in limits.sql()
    with FakeClock(), deadlines.scope(0.0205):
        budget = deadlines.CallBudget(postgres.POSTGRES)
        with pytest.raises(deadlines.BudgetExhausted):
            postgres.transaction_limits(budget, server_version=150004)


def test_transaction_timeout_only_on_postgres_17() -> None:
    """transaction_timeout is set on 17+, where it exists, and not before."""
    with FakeClock(), deadlines.scope(2.0):
        budget = deadlines.CallBudget(postgres.POSTGRES)
        assert postgres.transaction_limits(budget, server_version=170002).transaction_ms == 1980
        before_17 = postgres.transaction_limits(budget, server_version=160000)
        assert "transaction_timeout" not in before_17.sql()


def test_lock_timeout_below_the_statement_limit_only() -> None:
    """lock_timeout caps lock waits; above the statement limit it changes nothing."""
    with FakeClock(), deadlines.scope(1.0):
        budget = deadlines.CallBudget(postgres.POSTGRES)
        low = postgres.transaction_limits(budget, server_version=150000, lock_timeout=0.25)
        high = postgres.transaction_limits(budget, server_version=150000, lock_timeout=5.0)
    assert (low.lock_ms, low.lock_source) == (250, "lock")
    assert (high.lock_ms, high.lock_source) == (980, "deadline")


def test_translate_names_the_limit_that_fired() -> None:
    """57014 and 55P03 map to DeadlineExceeded when the budget bound, else to the cap's error."""
    timeout = FakePgError("canceling statement due to statement timeout", "57014")
    lock = FakePgError("canceling statement due to lock timeout", "55P03")
    with FakeClock(), deadlines.scope(1.0):
        limits = postgres.transaction_limits(
            deadlines.CallBudget(postgres.POSTGRES), server_version=150000
        )
        assert type(postgres.translate(timeout, limits)) is deadlines.DeadlineExceeded
        assert type(postgres.translate(lock, limits)) is deadlines.DeadlineExceeded
    dep = deadlines.Dependency("db", headers=0.5)
    with FakeClock(), deadlines.scope(5.0):
        limits = postgres.transaction_limits(deadlines.CallBudget(dep), server_version=150000)
        assert isinstance(postgres.translate(timeout, limits), postgres.StatementTimeout)
        assert isinstance(postgres.translate(lock, limits), postgres.LockTimeout)
        nowait = FakePgError("could not obtain lock on row", "55P03")
        assert postgres.translate(nowait, limits) is None
        idle = FakePgError("terminating connection due to idle-in-transaction timeout", "25P03")
        assert isinstance(postgres.translate(idle, limits), postgres.IdleInTransactionTimeout)


def test_findings_flag_unlimited_settings() -> None:
    """0 for statement_timeout is an error with its fix; a set value is ok."""
    rows = [
        ("idle_in_transaction_session_timeout", "60000", "ms", "user"),
        ("lock_timeout", "0", "ms", "default"),
        ("statement_timeout", "0", "ms", "default"),
    ]
    result = {f.setting: f for f in postgres.findings(rows, role='my"app', database="db")}
    assert result["statement_timeout"].severity == "error"
    assert result["statement_timeout"].fix == (
        'ALTER ROLE "my""app" IN DATABASE "db" SET statement_timeout = \'30s\';'
    )
    assert result["lock_timeout"].severity == "warning"
    assert result["idle_in_transaction_session_timeout"].severity == "ok"
    assert postgres.audit_failed(result.values())
