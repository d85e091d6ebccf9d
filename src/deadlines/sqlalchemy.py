"""SQLAlchemy 2: every transaction begun inside a deadline scope gets the budget's limits.

    engine = create_engine("postgresql+psycopg://app@db/app", pool_timeout=1.0)
    deadlines.sqlalchemy.install(engine)          # or an AsyncEngine

    with deadlines.scope(1.5), engine.begin() as conn:
        conn.execute(text("UPDATE ..."))           # statement_timeout ~1480 ms

One call adds engine event hooks: at ``begin`` (Core connections and ORM sessions
alike) the transaction runs ``SET LOCAL statement_timeout`` and ``lock_timeout``
(plus ``transaction_timeout`` on Postgres 17+) from the time left; Postgres timeouts
are raised as `DeadlineExceeded` (the budget was binding) or `StatementTimeout` /
`LockTimeout`; and a commit after the deadline is refused, so nothing is committed
for a caller that gave up. Transactions begun outside any scope are left alone.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from ._extras import missing

try:
    from sqlalchemy import event
    from sqlalchemy.engine import Connection, Engine, ExceptionContext
except ImportError as exc:  # pragma: no cover - depends on the install
    raise missing("deadlines.sqlalchemy", "SQLAlchemy 2", "sqlalchemy") from exc

from . import _scope, _validate
from ._budget import CallBudget
from ._dependency import Dependency
from .postgres import (
    DEFAULT_CHECK_INTERVAL,
    DEFAULT_RESERVE,
    POSTGRES,
    TransactionLimits,
    budget_error,
    expired,
    transaction_limits,
    translate,
)

if TYPE_CHECKING:  # its import needs greenlet, which sync-only users may not have
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["install"]

_KEY = "deadlines.limits"


class _Hooks:
    """The event handlers `install` registers, with their options."""

    def __init__(
        self,
        dependency: Dependency,
        lock_timeout: float | timedelta | None,
        reserve: float,
        check_interval: float | timedelta | None,
    ) -> None:
        self.dependency = dependency
        self.lock_timeout = lock_timeout
        self.reserve = reserve
        self.check_interval = check_interval

    def begin(self, conn: Connection) -> None:
        """Set the limits from the budget on the DBAPI connection (which then BEGINs)."""
        conn.info.pop(_KEY, None)
        if _scope.current() is None:
            return
        budget = CallBudget(self.dependency)  # BudgetExhausted: nothing is sent
        limits = transaction_limits(
            budget,
            server_version=_server_version(conn),
            lock_timeout=self.lock_timeout,
            reserve=self.reserve,
            check_interval=self.check_interval,
        )
        budget.request_sent = True
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.execute(limits.sql())  # the driver begins the transaction implicitly
        finally:
            cursor.close()
        conn.info[_KEY] = limits

    def commit(self, conn: Connection) -> None:
        """Refuse to commit once the deadline has passed: the caller has given up."""
        limits: TransactionLimits | None = conn.info.get(_KEY)
        if limits is not None and expired(limits.budget):
            raise budget_error(limits.budget)
        conn.info.pop(_KEY, None)

    def rollback(self, conn: Connection) -> None:
        """The transaction is over: forget its limits."""
        conn.info.pop(_KEY, None)

    def handle_error(self, context: ExceptionContext) -> BaseException | None:
        """Raise Postgres timeouts of a limited transaction as `deadlines` errors."""
        conn = context.connection
        limits: TransactionLimits | None = None if conn is None else conn.info.get(_KEY)
        if limits is None or context.original_exception is None:
            return None
        return translate(context.original_exception, limits)


def _server_version(conn: Connection) -> int:
    info = conn.dialect.server_version_info or (0,)
    major = int(info[0])
    minor = int(info[1]) if len(info) > 1 else 0
    return major * 10000 + minor


def install(
    engine: Engine | AsyncEngine,
    *,
    dependency: Dependency = POSTGRES,
    lock_timeout: float | timedelta | None = None,
    reserve: float | timedelta = DEFAULT_RESERVE,
    check_interval: float | timedelta | None = DEFAULT_CHECK_INTERVAL,
) -> Callable[[], None]:
    """Limit every transaction that `engine` begins inside a deadline scope.

    Returns a function that removes the hooks again. Options are those of
    `deadlines.asyncpg.transaction`. The pool wait is not covered: give the engine
    a bounded ``pool_timeout`` (with an `AsyncEngine`, the scope's cancellation also
    ends the wait). A budget below ``dependency.min_useful`` raises `BudgetExhausted`
    at ``begin``, before any statement is sent.
    """
    target = getattr(engine, "sync_engine", engine)  # an AsyncEngine wraps a sync one
    if not isinstance(target, Engine):
        raise TypeError(f"engine must be a SQLAlchemy Engine or AsyncEngine, not {engine!r}")
    hooks = _Hooks(dependency, lock_timeout, _validate.seconds(reserve, "reserve"), check_interval)
    listeners: list[tuple[str, Callable[..., Any]]] = [
        ("begin", hooks.begin),
        ("commit", hooks.commit),
        ("rollback", hooks.rollback),
        ("handle_error", hooks.handle_error),
    ]
    for name, fn in listeners:
        event.listen(target, name, fn)

    def uninstall() -> None:
        for name, fn in listeners:
            event.remove(target, name, fn)

    return uninstall
