"""The audit's rules: one code per unbounded wait from the reference chapter's checklist.

Codes start with ``DLN`` (the flake8 entry point's name, so flake8 reports them by
default). `docs/audit.md` shows a bad and a good example of each.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Rule:
    """One audit rule: its code, a short name and what it finds."""

    code: str
    name: str
    summary: str


RULES: dict[str, Rule] = {
    rule.code: rule
    for rule in (
        Rule(
            "DLN101",
            "http-no-timeout",
            "an HTTP call or client with no timeout, or with timeout=None: it can wait forever",
        ),
        Rule(
            "DLN102",
            "stream-read-timeout-not-total",
            "a requests/urllib3 timeout on a streamed body: it limits each read, not the"
            " whole body, so a server that trickles bytes holds it open forever",
        ),
        Rule(
            "DLN103",
            "thread-future-timeout",
            "a concurrent.futures wait with a timeout: it stops the waiter, the thread keeps"
            " running the work",
        ),
        Rule(
            "DLN104",
            "asyncio-wait-pending",
            "asyncio.wait(..., timeout=...) or FIRST_COMPLETED returns with the pending"
            " tasks still running, and they are never cancelled",
        ),
        Rule(
            "DLN105",
            "timeout-cannot-cancel",
            "an asyncio timeout around work it cannot stop (shield, a thread): the await is"
            " cancelled, the work goes on",
        ),
        Rule(
            "DLN106",
            "pool-no-acquire-limit",
            "a database pool with no limit on waiting for a connection",
        ),
        Rule(
            "DLN107",
            "db-no-statement-limit",
            "a database pool or connection with no statement limit (command_timeout,"
            " statement_timeout)",
        ),
        Rule(
            "DLN108",
            "socket-no-timeout",
            "a socket with no timeout: connect and every read can block forever",
        ),
        Rule(
            "DLN109",
            "per-read-limits-only",
            "an httpx client or call with per-phase limits only (its default 5 s, or a"
            " number): each read restarts the clock, so a server that trickles bytes holds"
            " the call forever; nothing bounds the whole call",
        ),
    )
}
