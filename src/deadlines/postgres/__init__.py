"""Postgres limits from the budget: what to `SET LOCAL`, what an error means, what to audit.

Shared by `deadlines.asyncpg`, `deadlines.psycopg` and `deadlines.sqlalchemy`; needs only
the standard library. At the start of each transaction the driver modules run

    SELECT set_config('statement_timeout', '<ms>', true), set_config('lock_timeout', ...)

(`set_config(..., true)` is `SET LOCAL`: it ends with the transaction). The values come
from the remaining budget: whole milliseconds, rounded down, minus a small reserve so
that Postgres cancels the statement itself just before the caller's deadline fires.
A value of 0 means *no limit* to Postgres, so it is never sent: too little budget left
fails fast with `BudgetExhausted` instead.

`audit` reports a server or role that runs with no limit (`0`) for `statement_timeout`
or `idle_in_transaction_session_timeout`; ``deadlines pg-audit DSN`` runs it from the
command line.

This module is the policy; the drivers' shared plumbing (taking a connection within the
budget, bounded cleanup) is `deadlines.postgres._driver`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from .. import _clock, _validate
from .._budget import CallBudget
from .._dependency import Dependency
from .._errors import BudgetExhausted, DeadlineExceeded, HeadersTimeout, TotalTimeout
from ._audit import (
    AUDIT_SQL,
    AUDITED,
    IDENTITY_SQL,
    RECOMMENDED,
    Finding,
    audit,
    audit_failed,
    findings,
)

__all__ = [
    "AUDITED",
    "AUDIT_SQL",
    "DEFAULT_CHECK_INTERVAL",
    "DEFAULT_CLEANUP",
    "DEFAULT_RESERVE",
    "IDENTITY_SQL",
    "IDLE_IN_TRANSACTION_TIMEOUT",
    "LOCK_NOT_AVAILABLE",
    "POSTGRES",
    "QUERY_CANCELED",
    "RECOMMENDED",
    "TRANSACTION_TIMEOUT",
    "Finding",
    "IdleInTransactionTimeout",
    "LockTimeout",
    "StatementTimeout",
    "TransactionLimits",
    "audit",
    "audit_failed",
    "budget_error",
    "expired",
    "findings",
    "sqlstate_of",
    "supports_connection_check",
    "supports_transaction_timeout",
    "transaction_limits",
    "translate",
]

#: The default policy for a Postgres dependency: 1 s pool wait, 10 s per statement.
POSTGRES = Dependency("postgres", connect=2.0, headers=10.0, total=30.0, pool_wait=1.0)

#: Subtracted from the budget before it becomes `statement_timeout`, so the server
#: cancels first and the caller gets a clean error instead of racing the cancel.
DEFAULT_RESERVE = 0.02

#: Longest time a cancelled transaction may spend cancelling its query and rolling
#: back before the connection is closed instead (the caller never waits longer).
DEFAULT_CLEANUP = 0.1

#: How often a backend running a statement checks that its client is still there
#: (``client_connection_check_interval``, Postgres 14+), so a closed connection
#: stops its query even when no cancel request could reach the server.
DEFAULT_CHECK_INTERVAL = 0.5

#: SQLSTATEs this module translates.
QUERY_CANCELED = "57014"
LOCK_NOT_AVAILABLE = "55P03"
IDLE_IN_TRANSACTION_TIMEOUT = "25P03"
TRANSACTION_TIMEOUT = "25P04"

_Source = Literal["deadline", "total", "cap", "lock"]


class StatementTimeout(HeadersTimeout):
    """Postgres cancelled a statement at the dependency's own cap (`statement_timeout`).

    The statement was sent, so the outcome of a write outside a transaction is unknown;
    inside one, the transaction was rolled back.
    """

    @property
    def kind(self) -> str:
        """``"statement"``."""
        return "statement"


class LockTimeout(HeadersTimeout):
    """A statement waited longer than `lock_timeout` for a lock and was cancelled."""

    @property
    def kind(self) -> str:
        """``"lock"``."""
        return "lock"


class IdleInTransactionTimeout(HeadersTimeout):
    """The server ended the session: it sat idle inside a transaction for too long.

    Fired by `idle_in_transaction_session_timeout` (SQLSTATE 25P03), usually a role or
    server setting; the transaction was rolled back and the connection is gone.
    """

    @property
    def kind(self) -> str:
        """``"idle in transaction"``."""
        return "idle in transaction"


def supports_transaction_timeout(server_version: int) -> bool:
    """Whether the server (``server_version_num``, e.g. 150004) has `transaction_timeout`."""
    return server_version >= 170000


def supports_connection_check(server_version: int) -> bool:
    """Whether the server has ``client_connection_check_interval`` (Postgres 14+)."""
    return server_version >= 140000


@dataclass(frozen=True, slots=True)
class TransactionLimits:
    """The `SET LOCAL` values for one transaction, and where each one came from.

    `statement_ms` and `lock_ms` are whole milliseconds, at least 1 (never 0, which
    Postgres reads as no limit). `transaction_ms` is set on Postgres 17+ only.
    """

    budget: CallBudget
    statement_ms: int
    statement_source: _Source
    lock_ms: int
    lock_source: _Source
    lock_cap: float | None
    transaction_ms: int | None
    check_interval_ms: int | None

    def settings(self) -> dict[str, int]:
        """Setting name -> milliseconds, in the order they are set."""
        values = {"statement_timeout": self.statement_ms, "lock_timeout": self.lock_ms}
        if self.transaction_ms is not None:
            values["transaction_timeout"] = self.transaction_ms
        if self.check_interval_ms is not None:
            values["client_connection_check_interval"] = self.check_interval_ms
        return values

    def sql(self) -> str:
        """One statement that sets every limit for the current transaction only.

        No bind parameters (``SET`` takes none, and drivers differ in placeholder
        style); the values are integers this module computed.
        """
        calls = ", ".join(
            f"set_config('{name}', '{int(ms)}', true)" for name, ms in self.settings().items()
        )
        return f"SELECT {calls}"


def transaction_limits(
    budget: CallBudget,
    *,
    server_version: int,
    lock_timeout: float | timedelta | None = None,
    reserve: float | timedelta = DEFAULT_RESERVE,
    check_interval: float | timedelta | None = DEFAULT_CHECK_INTERVAL,
) -> TransactionLimits:
    """The limits for a transaction starting now under `budget`.

    `statement_timeout` = min(the dependency's `headers` cap, time left) - `reserve`;
    `lock_timeout` = min(`lock_timeout`, that); `transaction_timeout` (Postgres 17+) =
    time left until the call's end - `reserve`. Raises `BudgetExhausted` when less than
    a millisecond would be left.
    """
    reserve_s = _validate.seconds(reserve, "reserve")
    statement = budget.limit("headers")
    statement_source: _Source = budget.binding("headers")
    statement_ms = _ms(statement - reserve_s, budget, reserve_s)
    lock_cap = None if lock_timeout is None else _validate.seconds(lock_timeout, "lock_timeout")
    lock_ms, lock_source = statement_ms, statement_source
    if lock_cap is not None and math.floor(lock_cap * 1000.0) < statement_ms:
        lock_ms, lock_source = max(1, math.floor(lock_cap * 1000.0)), "lock"
    transaction_ms = None
    if supports_transaction_timeout(server_version):
        transaction_ms = _ms(budget.left() - reserve_s, budget, reserve_s)
    check_ms = None
    if check_interval is not None and supports_connection_check(server_version):
        check_ms = max(1, math.floor(_validate.seconds(check_interval, "check_interval") * 1000))
    return TransactionLimits(
        budget=budget,
        statement_ms=statement_ms,
        statement_source=statement_source,
        lock_ms=lock_ms,
        lock_source=lock_source,
        lock_cap=lock_cap,
        transaction_ms=transaction_ms,
        check_interval_ms=check_ms,
    )


def _ms(seconds: float, budget: CallBudget, reserve: float) -> int:
    ms = math.floor(seconds * 1000.0)
    if ms < 1:
        raise BudgetExhausted(
            remaining=budget.left(),
            min_useful=reserve + 0.001,
            dependency=budget.dependency.name,
        )
    return ms


# Errors: one boundary from SQLSTATE to the taxonomy.


def sqlstate_of(exc: BaseException) -> str | None:
    """The SQLSTATE of a driver error (asyncpg, psycopg, or SQLAlchemy's wrapper)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for attr in ("sqlstate", "pgcode"):
            value = getattr(current, attr, None)
            if isinstance(value, str) and len(value) == 5:
                return value
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else current.__cause__
    return None


def translate(exc: BaseException, limits: TransactionLimits) -> TimeoutError | None:
    """The `deadlines` error for a Postgres timeout error, or None for any other error.

    `DeadlineExceeded` when the request's budget was the binding limit; otherwise the
    `CallTimeout` that names the limit that fired (`StatementTimeout`, `LockTimeout`,
    `TotalTimeout`, `IdleInTransactionTimeout`). The statement had been sent.
    """
    state = sqlstate_of(exc)
    text = str(exc).lower()
    budget = limits.budget
    if state == QUERY_CANCELED:
        if "statement timeout" in text:
            return _fired(limits, limits.statement_source, "statement")
        if _clock.now() >= budget.end:  # our cancel, sent when the budget ran out
            return budget_error(budget, "total")
        return None
    if state == LOCK_NOT_AVAILABLE and "lock timeout" in text:
        return _fired(limits, limits.lock_source, "lock")
    if state == TRANSACTION_TIMEOUT:
        source: _Source = "deadline" if budget.end >= budget.request_end else "total"
        return _fired(limits, source, "transaction")
    if state == IDLE_IN_TRANSACTION_TIMEOUT:
        return IdleInTransactionTimeout(
            "postgres: the server ended the session after it sat idle in a transaction"
            " (idle_in_transaction_session_timeout); the transaction was rolled back",
            limit=math.nan,
            elapsed=_clock.now() - budget.start,
            dependency=budget.dependency.name,
            pool_wait=budget.pool_wait,
        )
    return None


def _fired(limits: TransactionLimits, source: _Source, which: str) -> TimeoutError:
    budget = limits.budget
    if source in ("deadline", "total"):
        return budget_error(budget, source)
    elapsed = _clock.now() - budget.start
    name = budget.dependency.name
    if which == "lock":
        cap = limits.lock_cap if source == "lock" else budget.dependency.headers
        return LockTimeout(
            limit=cap if cap is not None else limits.lock_ms / 1000.0,
            elapsed=elapsed,
            dependency=name,
            pool_wait=budget.pool_wait,
        )
    return StatementTimeout(
        limit=budget.dependency.headers,
        elapsed=elapsed,
        dependency=name,
        pool_wait=budget.pool_wait,
    )


def budget_error(
    budget: CallBudget, source: Literal["deadline", "total"] = "deadline"
) -> TimeoutError:
    """The error for the whole budget running out after the statement was sent."""
    if source == "total" and budget.end < budget.request_end:
        return TotalTimeout(
            limit=budget.dependency.total,
            elapsed=_clock.now() - budget.start,
            phase="headers",
            dependency=budget.dependency.name,
            request_sent=True,
            pool_wait=budget.pool_wait,
        )
    return DeadlineExceeded(
        limit=budget.request_budget,
        elapsed=_clock.now() - budget.start,
        phase="headers",
        dependency=budget.dependency.name,
        request_sent=True,
        pool_wait=budget.pool_wait,
    )


def expired(budget: CallBudget) -> bool:
    """Whether the call's end (deadline or total cap) has passed."""
    return _clock.now() >= budget.end
