"""Experiment `chain` (the chapter's Part 4): fixed timeouts vs a propagated budget.

A (200 ms of work) → B (300 ms) → C (3 s, then a real commit); the user waits 2 s.
Three hop processes per variant. Every time below is from the user's request, read
on the monotonic clock that all processes of this machine share.

* ``fixed``: A→B 1.8 s, B→C 2 s, no cancellation: C commits for nobody.
* ``propagated``: the library: C is told the time left and stops at the deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from . import _params, report
from .harness import Processes
from .progress import Progress

VARIANTS = ("fixed", "propagated")
_CREATE = (
    "CREATE TABLE IF NOT EXISTS deadlines_lab_chain "
    "(request_id TEXT NOT NULL, hop TEXT NOT NULL)"
)  # fmt: skip


@dataclass(frozen=True)
class Params:
    """The experiment's knobs (the chapter's numbers are the defaults)."""

    user_wait: float = 2.0
    a_work: float = 0.2
    b_work: float = 0.3
    c_work: float = 3.0
    ab_timeout: float = 1.8
    bc_timeout: float = 2.0
    reserve: float = 0.05
    dsn: str | None = None
    variants: tuple[str, ...] = field(default=VARIANTS)

    def __post_init__(self) -> None:
        _params.check(
            self,
            known=VARIANTS,
            seconds=("user_wait", "a_work", "b_work", "c_work", "ab_timeout", "bc_timeout",
                     "reserve"),
        )  # fmt: skip


def quick() -> Params:
    """The test version: the chapter's numbers already take only a few seconds."""
    return Params()


def expected_seconds(p: Params) -> float:
    """About how long `run` takes."""
    return len(p.variants) * (p.a_work + p.b_work + p.c_work + 4.0)


def probe(dsn: str) -> None:
    """Raise `ValueError` naming ``--dsn`` when Postgres at `dsn` cannot be reached."""
    import psycopg

    try:
        with psycopg.connect(dsn, connect_timeout=5):
            pass
    except psycopg.Error as exc:
        lines = str(exc).strip().splitlines() or [type(exc).__name__]
        raise ValueError(f"--dsn: cannot connect: {lines[0]}") from None


class _Store:
    """Where C commits: a temporary SQLite file, or Postgres when a DSN is given."""

    def __init__(self, dsn: str | None) -> None:
        self.dsn = dsn
        self._dir = tempfile.TemporaryDirectory(prefix="deadlines-lab-")
        self.path = os.path.join(self._dir.name, "chain.sqlite3")
        self._execute(_CREATE)

    def _execute(self, sql: str, *args: str) -> list[Any]:
        if self.dsn:
            import psycopg

            with psycopg.connect(self.dsn, connect_timeout=5) as conn:
                cur = conn.execute(sql.replace("?", "%s"), args)
                return cur.fetchall() if cur.description else []
        with contextlib.closing(sqlite3.connect(self.path, timeout=5)) as lite, lite:
            return lite.execute(sql, args).fetchall()

    def committed(self, request_id: str) -> bool:
        """Whether C's row for `request_id` is there (and so was committed)."""
        rows = self._execute("SELECT 1 FROM deadlines_lab_chain WHERE request_id = ?", request_id)
        return bool(rows)

    def forget(self, request_id: str) -> None:
        """Remove the run's row (Postgres is shared; leave it as it was)."""
        self._execute("DELETE FROM deadlines_lab_chain WHERE request_id = ?", request_id)

    def close(self) -> None:
        """Remove the temporary SQLite file."""
        self._dir.cleanup()


def _hops(p: Params, variant: str, procs: Processes, store: _Store) -> list[Any]:
    common = ["--variant", variant, "--reserve", str(p.reserve), "--db", store.path]
    if p.dsn:
        common += ["--dsn", p.dsn]
    a, b, c = procs.start_all(
        [
            ("chain_hop", ["--name", "A", "--work", str(p.a_work), "--timeout",
                           str(p.ab_timeout), *common]),
            ("chain_hop", ["--name", "B", "--work", str(p.b_work), "--timeout",
                           str(p.bc_timeout), *common]),
            ("chain_hop", ["--name", "C", "--work", str(p.c_work), *common]),
        ]
    )  # fmt: skip
    with httpx.Client(timeout=5) as client:
        client.get(a.url + "/_next", params={"url": b.url}).raise_for_status()
        client.get(b.url + "/_next", params={"url": c.url}).raise_for_status()
    return [a, b, c]


async def _events(urls: list[str]) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(timeout=5) as client:
        found: list[dict[str, Any]] = []
        for url in urls:
            found.extend((await client.get(url + "/_events")).json())
        return found


async def _user(p: Params, a_url: str, rid: str) -> tuple[float, int | None, str | None]:
    """The user: waits `user_wait` s, tells A so in the header, then hangs up."""
    headers = {"x-request-timeout-ms": str(round(p.user_wait * 1000))}
    async with httpx.AsyncClient(timeout=p.user_wait) as client:
        await client.get(a_url + "/_warm")  # warm every hop's connection first
        start = time.monotonic()
        try:
            resp = await client.get(a_url + "/work", params={"id": rid}, headers=headers)
            return start, resp.status_code, None
        except httpx.TimeoutException as exc:
            return start, None, type(exc).__name__


def _first(events: list[dict[str, Any]], hop: str, kind: str) -> dict[str, Any] | None:
    return next((e for e in events if e["hop"] == hop and e["event"] == kind), None)


def run_variant(p: Params, variant: str) -> dict[str, Any]:
    """Three fresh hops, one user request; what each hop did and when."""
    store = _Store(p.dsn)
    rid = uuid.uuid4().hex
    try:
        with Processes() as procs:
            a, b, c = _hops(p, variant, procs, store)
            start, status, error = asyncio.run(_user(p, a.url, rid))
            # Wait for C to finish or stop (bounded: C's work plus a margin).
            until = start + p.a_work + p.b_work + p.c_work + 3.0
            events: list[dict[str, Any]] = []
            while time.monotonic() < until:
                events = asyncio.run(_events([a.url, b.url, c.url]))
                if _first(events, "C", "finished") or _first(events, "C", "stopped"):
                    break
                time.sleep(0.1)
            time.sleep(0.2)  # let the last notes land
            events = asyncio.run(_events([a.url, b.url, c.url]))
        committed = store.committed(rid)
        if p.dsn:
            store.forget(rid)
    finally:
        store.close()

    def at(hop: str, kind: str) -> float | None:
        event = _first(events, hop, kind)
        return None if event is None else round((event["t"] - start) * 1000.0, 1)

    answered = _first(events, "A", "answered")
    c_arrived = _first(events, "C", "arrived")
    c_stopped = _first(events, "C", "stopped")
    return {
        "a_answered_ms": at("A", "answered"),
        "a_status": None if answered is None else answered["status"],
        "b_gave_up_ms": at("B", "gave_up"),
        "c_budget_ms": None if c_arrived is None else c_arrived["budget_ms"],
        "c_stopped_ms": at("C", "stopped"),
        "c_stop_reason": None if c_stopped is None else c_stopped["reason"],
        "c_finished_ms": at("C", "finished"),
        "c_committed": committed,
        "user_status": status,
        "user_error": error,
    }


def pending_variants() -> dict[str, str]:
    """Variants that cannot run in this install, with why."""
    import importlib.util

    absent = [
        m for m in ("deadlines.asgi", "deadlines.httpx") if importlib.util.find_spec(m) is None
    ]
    return {"propagated": f"waiting for {', '.join(absent)}"} if absent else {}


def run(p: Params, progress: Progress) -> dict[str, Any]:
    """Run every variant; the JSON-ready result."""
    params = {k: (list(v) if isinstance(v, tuple) else v) for k, v in p.__dict__.items()}
    params["dsn"] = "postgres" if p.dsn else None  # never write credentials into a report
    result: dict[str, Any] = {"params": params, "variants": {}, "pending": {}}
    unavailable = pending_variants()
    for variant in p.variants:
        if variant in unavailable:
            result["pending"][variant] = unavailable[variant]
            continue
        with progress.step(f"chain {variant}", p.a_work + p.b_work + p.c_work + 3.0):
            result["variants"][variant] = run_variant(p, variant)
    return result


_LABELS = {
    "fixed": ("Fixed timeouts (A→B {ab_timeout:g} s, B→C {bc_timeout:g} s, no cancellation)"),
    "propagated": "Propagated budget plus 'caller left' (deadlines)",
}


def tables(result: dict[str, Any]) -> list[report.Table]:
    """The chapter's table: one column per variant."""
    p = result["params"]
    names = list(result["variants"])
    table = report.Table(
        f"chain: A ({p['a_work']:g} s) → B ({p['b_work']:g} s) → C ({p['c_work']:g} s, then "
        f"COMMIT); the user waits {p['user_wait']:g} s",
        ["", *[_LABELS.get(n, n).format(**p) for n in names]],
    )
    v = result["variants"]

    def a_cell(n: str) -> str:
        return f"{v[n]['a_status']} at {report.ms(v[n]['a_answered_ms'])}"

    def c_cell(n: str) -> str:
        x = v[n]
        if x["c_committed"]:
            return f"finished and committed at {report.ms(x['c_finished_ms'])}"
        if x["c_stopped_ms"] is not None:
            return f"stopped at {report.ms(x['c_stopped_ms'])} ({x['c_stop_reason']}), no commit"
        return "no commit"

    def budget_cell(n: str) -> str:
        budget = v[n]["c_budget_ms"]
        return "not told" if budget is None else f"{budget:,} ms"

    table.rows += [
        ["A answers the user", *[a_cell(n) for n in names]],
        ["B gives up on C", *[report.ms(v[n]["b_gave_up_ms"]) for n in names]],
        ["C is told it has", *[budget_cell(n) for n in names]],
        [f"C's {p['c_work']:g} s of work", *[c_cell(n) for n in names]],
    ]
    for name, why in result.get("pending", {}).items():
        table.note += f"{name}: pending ({why}). "
    return [table]


def plot(result: dict[str, Any], path: str | Path) -> Path:
    """A timeline per variant: when A answered, B gave up, C stopped or committed."""
    plt = report.pyplot()
    names = list(result["variants"])
    fig, ax = plt.subplots(figsize=(9, 1.6 + 1.5 * len(names)))
    user_wait = result["params"]["user_wait"] * 1000.0
    for row, name in enumerate(names):
        v = result["variants"][name]
        marks = [
            ("A answers", v["a_answered_ms"], "tab:blue"),
            ("B gives up", v["b_gave_up_ms"], "tab:orange"),
            ("C stopped", v["c_stopped_ms"], "tab:green"),
            ("C committed", v["c_finished_ms"] if v["c_committed"] else None, "tab:red"),
        ]
        shown = [(label, value, colour) for label, value, colour in marks if value is not None]
        for k, (label, value, colour) in enumerate(shown):
            ax.scatter([value], [row], color=colour, s=60, zorder=3)
            # Stack the labels: in the propagated run every mark falls within a few ms.
            ax.annotate(f"{label} {value:,.0f} ms", (value, row), textcoords="offset points",
                        xytext=(6, 10 + 11 * k), fontsize=8, color=colour)  # fmt: skip
    ax.axvline(user_wait, color="grey", linestyle=":", label="the user gives up")
    ax.set_yticks(range(len(names)))
    ax.set_yticklabels(names)
    ax.set_ylim(-0.5, len(names) - 0.1)
    ax.margins(x=0.18)  # room for the labels right of the last mark
    ax.set_xlabel("ms since the user's request")
    ax.set_title("chain: who is still working after the user left?")
    ax.legend(fontsize=8, loc="lower right")
    return report.save_figure(fig, path)
