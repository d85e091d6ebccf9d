"""``deadlines pg-audit DSN``: report the Postgres settings that run with no time limit.

Connects with psycopg and prints `deadlines.postgres.audit`'s findings. Exit status: 0
every audited limit is set, 1 a limit is unset (0), 2 the server cannot be reached.
"""

from __future__ import annotations

import argparse
import math
import sys

from .. import postgres
from .._extras import missing


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``deadlines pg-audit``."""
    parser.add_argument("dsn", help="libpq connection string or URI, e.g. postgresql://app@db/app")
    parser.add_argument(
        "--connect-timeout",
        type=_connect_timeout,
        default=5.0,
        help="seconds to wait for the connection (default 5)",
    )


def _connect_timeout(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(
            f"expected a positive number of seconds up to 3600, got {text!r}"
        )
    return value


def run(args: argparse.Namespace) -> int:
    """Print the findings; exit 1 when a limit is unset (0), 2 when unreachable."""
    try:
        import psycopg
    except ImportError:  # pragma: no cover - depends on the install
        print(missing("deadlines pg-audit", "psycopg", "psycopg"), file=sys.stderr)
        return 2
    timeout = max(1, math.ceil(args.connect_timeout))
    try:
        with psycopg.connect(args.dsn, connect_timeout=timeout, autocommit=True) as conn:
            result = postgres.audit(conn)
    except psycopg.Error as exc:
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        print(f"deadlines pg-audit: cannot audit: {lines[0]}", file=sys.stderr)
        return 2
    for finding in result:
        print(finding)
    failed = postgres.audit_failed(result)
    print("FAILED: unlimited settings found" if failed else "ok: every audited limit is set")
    return 1 if failed else 0
