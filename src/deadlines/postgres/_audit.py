"""The audit: servers and roles that run with no limit (``deadlines pg-audit DSN``)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

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
