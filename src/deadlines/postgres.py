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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, Protocol, TypeVar

from . import _clock, _validate
from ._budget import CallBudget
from ._dependency import Dependency
from ._errors import BudgetExhausted, DeadlineExceeded, HeadersTimeout, TotalTimeout

T = TypeVar("T")

_log = logging.getLogger("deadlines.postgres")

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


# Async plumbing shared by the asyncpg and psycopg integrations.

_background: set[asyncio.Task[Any]] = set()


def keep(task: asyncio.Task[T]) -> asyncio.Task[T]:
    """Hold a strong reference to a background task until it ends."""
    _background.add(task)
    task.add_done_callback(_background.discard)
    return task


async def acquire_within(
    acquire: Callable[[], Awaitable[T]],
    release: Callable[[T], Awaitable[object]],
    budget: CallBudget,
    *,
    reserve: float = DEFAULT_RESERVE,
) -> T:
    """Take a pooled connection within min(pool cap, time left - reserve), never leaking one.

    Ending `reserve` before the deadline lets the pool wait fail with its own error
    (phase ``"pool"``, safe to retry) rather than racing the scope's cancellation.
    The acquire runs in its own task: when the wait times out or the caller is
    cancelled just as a connection is handed over, that connection is released in
    the background instead of staying marked in use.
    """
    limit = budget.limit("pool")
    if budget.binding("pool") == "deadline":
        limit = max(0.0, limit - reserve)
    started = _clock.now()

    async def run() -> T:
        return await acquire()

    task = keep(asyncio.ensure_future(run()))
    try:
        done, _ = await asyncio.wait({task}, timeout=limit)
    except BaseException:
        _abandon(task, release)
        raise
    finally:
        budget.pool_wait = _clock.now() - started
    if not done:
        _abandon(task, release)
        raise budget.timeout("pool")
    return task.result()


def _abandon(task: asyncio.Task[T], release: Callable[[T], Awaitable[object]]) -> None:
    def give_back(done: asyncio.Task[T]) -> None:
        if done.cancelled() or done.exception() is not None:
            return
        keep(asyncio.ensure_future(_release_quietly(release, done.result())))

    task.cancel()
    task.add_done_callback(give_back)


async def _release_quietly(release: Callable[[T], Awaitable[object]], conn: T) -> None:
    with contextlib.suppress(Exception):
        await release(conn)


async def within(
    work: Callable[[], Awaitable[object]],
    seconds: float,
    give_up: Callable[[], Awaitable[object] | None],
) -> bool:
    """Run `work` for at most `seconds`, then `give_up`; True when `work` finished in time.

    Runs in its own task, bounded by itself: a second cancellation of the caller stops
    the caller's wait at once, never the cleanup (which still ends within `seconds`).
    Errors of `work` count as not finished, and errors of `give_up` are logged (debug):
    neither may replace the error that the caller is handling.
    """

    async def bounded() -> bool:
        inner = asyncio.ensure_future(work())
        done, _ = await asyncio.wait({inner}, timeout=max(0.0, seconds))
        if not done:
            # psycopg answers a first cancellation by cancelling on the server and
            # waiting up to 10 s; a second one makes it close the connection.
            for _ in range(10):
                inner.cancel()
                done, _ = await asyncio.wait({inner}, timeout=0.01)
                if done:
                    break
            inner.add_done_callback(_consume)
        elif not inner.cancelled() and inner.exception() is None:
            return True
        try:  # timed out or failed: the connection's state is unknown
            result = give_up()
            if result is not None:
                await result
        except Exception:  # e.g. asyncpg's: the failed release already gave it back
            _log.debug("giving up the connection failed", exc_info=True)
        return False

    task = keep(asyncio.ensure_future(bounded()))
    task.add_done_callback(_consume)
    return await asyncio.shield(task)


def _consume(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()


class Overrun:
    """Cancels a task a second time when its cancel path takes longer than `grace`.

    Drivers catch the first cancellation of a running query to cancel it on the
    server (psycopg waits up to 10 s for that, asyncpg's request has no limit); a
    second cancellation makes them give up and close the connection. This watcher
    looks every `grace` seconds: a task seen cancelling twice in a row, or still
    running past ``end + grace``, is cancelled again. It never starts a cancellation
    of a task that nobody cancelled.
    """

    __slots__ = ("_count", "_end", "_grace", "_handle", "_seen", "_task")

    def __init__(self, end: float, grace: float) -> None:
        self._task = asyncio.current_task()
        self._count = 0
        self._seen = False
        self._end = end
        self._grace = max(0.01, grace)
        self._handle = asyncio.get_running_loop().call_later(self._grace, self._look)

    @property
    def fired(self) -> bool:
        """Whether this watcher had to cancel the task again."""
        return self._count > 0

    def _look(self) -> None:
        task = self._task
        if task is None or task.done():
            return
        cancelling = task.cancelling() > self._count
        overdue = _clock.now() >= self._end + self._grace
        if cancelling and (self._seen or overdue):
            self._count += 1
            task.cancel()
        self._seen = cancelling
        self._handle = asyncio.get_running_loop().call_later(self._grace, self._look)

    def disarm(self) -> None:
        """Stop watching; undo this watcher's own cancellation requests on the task."""
        self._handle.cancel()
        task = self._task
        while self._count and task is not None and task.cancelling():
            task.uncancel()
            self._count -= 1


# Audit: servers and roles that run with no limit.

#: The settings the audit reads, and whether no limit there is an error.
AUDITED: dict[str, Literal["error", "warning"]] = {
    "statement_timeout": "error",
    "idle_in_transaction_session_timeout": "error",
    "lock_timeout": "warning",
}

#: Role-level settings this library recommends (a ceiling; SET LOCAL lowers it).
RECOMMENDED: dict[str, str] = {
    "statement_timeout": "30s",
    "idle_in_transaction_session_timeout": "60s",
    "lock_timeout": "5s",
}

AUDIT_SQL = (
    "SELECT name, setting, coalesce(unit, ''), source FROM pg_settings"
    " WHERE name IN ('statement_timeout', 'idle_in_transaction_session_timeout',"
    " 'lock_timeout', 'transaction_timeout', 'idle_session_timeout') ORDER BY name"
)
IDENTITY_SQL = "SELECT current_user, current_database(), current_setting('server_version_num')"


@dataclass(frozen=True, slots=True)
class Finding:
    """One audited setting: its value for this role and database, and what to do."""

    setting: str
    value: str
    source: str
    severity: Literal["error", "warning", "ok"]
    message: str
    fix: str | None = None

    def __str__(self) -> str:
        line = f"{self.severity.upper():7} {self.setting} = {self.value} ({self.source})"
        line += f": {self.message}"
        return line + (f"\n        fix: {self.fix}" if self.fix else "")


def findings(rows: Iterable[Sequence[str]], *, role: str, database: str) -> list[Finding]:
    """Judge `AUDIT_SQL` rows (name, setting, unit, source) for `role` on `database`."""
    values = {str(r[0]): (str(r[1]), str(r[2]), str(r[3])) for r in rows}
    result: list[Finding] = []
    for name, severity in AUDITED.items():
        if name not in values:
            continue
        setting, unit, source = values[name]
        shown = f"{setting}{unit}" if setting != "0" else "0"
        if setting != "0":
            result.append(Finding(name, shown, source, "ok", "bounded"))
            continue
        result.append(
            Finding(
                name,
                shown,
                source,
                severity,
                _WHY[name],
                f"ALTER ROLE {_ident(role)} IN DATABASE {_ident(database)}"
                f" SET {name} = '{RECOMMENDED[name]}';",
            )
        )
    return result


_WHY = {
    "statement_timeout": "no limit: a statement outside a deadline may run forever",
    "idle_in_transaction_session_timeout": (
        "no limit: a session left open inside a transaction holds its locks forever"
    ),
    "lock_timeout": (
        "no limit: a migration waiting for a lock queues every query behind it"
        " (set it in migration sessions at least)"
    ),
}


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class _Cursor(Protocol):
    def execute(self, query: Any, /) -> Any: ...
    def fetchall(self) -> Sequence[Sequence[Any]]: ...


class _DBAPIConnection(Protocol):
    def cursor(self) -> Any: ...


def audit(conn: _DBAPIConnection) -> list[Finding]:
    """Audit the limits a sync DB-API connection (psycopg, ...) runs with.

    Reports ``error`` for `statement_timeout` or `idle_in_transaction_session_timeout`
    at 0 (no limit) and ``warning`` for `lock_timeout` at 0, each with the
    ``ALTER ROLE`` that fixes it. For asyncpg use `deadlines.asyncpg.audit`.
    """
    cur: _Cursor = conn.cursor()
    try:
        cur.execute(IDENTITY_SQL)
        role, database, _ = cur.fetchall()[0]
        cur.execute(AUDIT_SQL)
        rows = cur.fetchall()
    finally:
        close = getattr(cur, "close", None)
        if close is not None:
            close()
    return findings(rows, role=str(role), database=str(database))


def audit_failed(result: Iterable[Finding]) -> bool:
    """Whether any finding is an error (a limit the library relies on is missing)."""
    return any(f.severity == "error" for f in result)


@asynccontextmanager
async def guarded(
    limits: TransactionLimits,
    grace: float,
    *,
    commit: Callable[[], Awaitable[object]],
    rollback: Callable[[], Awaitable[None]],
) -> AsyncIterator[None]:
    """Run a transaction's body: commit at the end, or roll back and say why.

    The body's Postgres errors are translated to the taxonomy; a cancellation (the
    deadline fired or the caller left) rolls back and propagates; a body that ends
    after the deadline commits nothing. `rollback` must itself be bounded by `grace`.
    """
    budget = limits.budget
    watch = Overrun(budget.end, grace)
    try:
        yield
    except BaseException as exc:
        watch.disarm()
        await rollback()
        mapped = translate(exc, limits) if isinstance(exc, Exception) else None
        if mapped is not None:
            raise mapped from exc
        raise
    watch.disarm()
    if expired(budget):  # the caller has given up: commit nothing
        await rollback()
        raise budget_error(budget)
    try:
        await commit()
    except BaseException as exc:
        await rollback()
        mapped = translate(exc, limits) if isinstance(exc, Exception) else None
        if mapped is not None:
            raise mapped from exc
        raise
