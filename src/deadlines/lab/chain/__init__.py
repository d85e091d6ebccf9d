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

from .. import _params, chapter, report
from ..harness import Processes
from ..progress import Progress

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
            ("chain.hop", ["--name", "A", "--work", str(p.a_work), "--timeout",
                           str(p.ab_timeout), *common]),
            ("chain.hop", ["--name", "B", "--work", str(p.b_work), "--timeout",
                           str(p.bc_timeout), *common]),
            ("chain.hop", ["--name", "C", "--work", str(p.c_work), *common]),
        ]
    )  # fmt: skip
    # The lab's own hops, on loopback: they answer at once or not at all.
    with httpx.Client(timeout=5) as client:  # deadlines: ignore[DLN109]
        client.get(a.url + "/_next", params={"url": b.url}).raise_for_status()
        client.get(b.url + "/_next", params={"url": c.url}).raise_for_status()
    return [a, b, c]


async def _events(urls: list[str]) -> list[dict[str, Any]]:
    async with httpx.AsyncClient(timeout=5) as client:  # deadlines: ignore[DLN109] the lab's hops
        found: list[dict[str, Any]] = []
        for url in urls:
            found.extend((await client.get(url + "/_events")).json())
        return found


async def _user(p: Params, a_url: str, rid: str) -> tuple[float, int | None, str | None]:
    """The user: waits `user_wait` s, tells A so in the header, then hangs up."""
    headers = {"x-request-timeout-ms": str(round(p.user_wait * 1000))}
    # A's answer arrives at once when it comes: a per-read limit is the user's wait here.
    async with httpx.AsyncClient(timeout=p.user_wait) as client:  # deadlines: ignore[DLN109]
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
    "fixed": "fixed timeouts",
    "propagated": "propagated (deadlines)",
}
#: A figure within this of the chapter's agrees with it.
AGREE_MS = 50.0


def _c_cell(x: dict[str, Any]) -> str:
    if x["c_committed"]:
        return f"committed at {report.ms(x['c_finished_ms'])}"
    if x["c_stopped_ms"] is not None:
        return f"stopped at {report.ms(x['c_stopped_ms'])} ({x['c_stop_reason']})"
    return "no commit"


def _chapter_row(run: chapter.ChainRun) -> list[str]:
    told = "not told" if run.c_budget_ms is None else report.ms(run.c_budget_ms)
    work = (
        f"committed at {report.ms(run.c_ended_ms)}"
        if run.c_committed
        else f"stopped at {report.ms(run.c_ended_ms)} ({run.c_stop_reason})"
    )
    return ["  the chapter (Node)", f"504 at {report.ms(run.a_answered_ms)}",
            report.ms(run.b_gave_up_ms), told, work]  # fmt: skip


def tables(result: dict[str, Any]) -> list[report.Table]:
    """The chapter's table: a row per variant, the chapter's row below each."""
    p = result["params"]
    table = report.Table(
        f"chain: A ({p['a_work']:g} s) → B ({p['b_work']:g} s) → C ({p['c_work']:g} s, then "
        f"COMMIT); the user waits {p['user_wait']:g} s",
        ["run", "A answers", "B gives up", "C is told", f"C's {p['c_work']:g} s of work"],
    )
    for name, x in result["variants"].items():
        told = "not told" if x["c_budget_ms"] is None else f"{x['c_budget_ms']:,} ms"
        table.rows.append([
            _LABELS.get(name, name), f"{x['a_status']} at {report.ms(x['a_answered_ms'])}",
            report.ms(x["b_gave_up_ms"]), told, _c_cell(x),
        ])  # fmt: skip
        if name in chapter.CHAIN:
            table.rows.append(_chapter_row(chapter.CHAIN[name]))
    table.note = (
        "Times from the user's request."
        f" fixed: A→B {p['ab_timeout']:g} s, B→C {p['bc_timeout']:g} s, nothing stops when a"
        f" caller leaves. propagated: deadlines.asgi.DeadlineMiddleware with a"
        f" {p['reserve'] * 1000:g} ms reserve per hop, deadlines.httpx sending the time left."
    )
    for name, why in result.get("pending", {}).items():
        table.note += f" {name}: pending ({why})."
    table.verdict = verdict(result)
    return [table]


def verdict(result: dict[str, Any]) -> str:
    """Each variant beside the chapter's Part 4; the propagated one's difference explained."""
    p = result["params"]
    same = chapter.same_params(p, chapter.CHAIN_PARAMS)
    parts = []
    agrees = True
    fixed = result["variants"].get("fixed")
    if fixed is not None:
        ok, text = _fixed(fixed, same)
        agrees &= ok
        parts.append(text)
    propagated = result["variants"].get("propagated")
    if propagated is not None:
        ok, text = _propagated(propagated, p, same)
        agrees &= ok
        parts.append(text)
    return chapter.verdict(agrees, " ".join(parts) or "no variant ran.")


def _fixed(x: dict[str, Any], same: bool) -> tuple[bool, str]:
    ref = chapter.CHAIN["fixed"]
    shape = x["c_committed"] and (x["c_finished_ms"] or 0) > (x["a_answered_ms"] or 0)
    if not shape:
        return False, "fixed: C did not commit after A answered, as the chapter's did."
    if not same:
        return True, "fixed: C commits for nobody after A answered, as in the chapter."
    ours = (x["a_answered_ms"], x["b_gave_up_ms"], x["c_finished_ms"])
    theirs = (ref.a_answered_ms, ref.b_gave_up_ms, ref.c_ended_ms)
    off = max(abs((a or 0.0) - b) for a, b in zip(ours, theirs, strict=True))
    figures = " / ".join(report.ms(v, unit=False) for v in ours)
    return off <= AGREE_MS, (
        f"fixed: {figures} ms against the chapter's 2,004 / 2,509 / 3,510 (within"
        f" {off:.0f} ms), C committing for nobody."
    )


def _propagated(x: dict[str, Any], p: dict[str, Any], same: bool) -> tuple[bool, str]:
    ref = chapter.CHAIN["propagated"]
    if x["c_committed"] or x["c_stopped_ms"] is None or x["a_status"] != 504:
        return False, "propagated: C was not stopped before its commit, as the chapter's was."
    stopped = x["c_stopped_ms"]
    reserve_ms = p["reserve"] * 1000.0
    own = p["user_wait"] * 1000.0 - 3 * reserve_ms
    earlier = ref.c_ended_ms - stopped
    told = f"{x['c_budget_ms']:,} ms" if x["c_budget_ms"] is not None else "nothing"
    why = (
        f"C stops {earlier:,.0f} ms earlier than the chapter's, on '{x['c_stop_reason']}'"
        f" rather than 'caller left': every hop keeps a {reserve_ms:g} ms reserve (the"
        f" chapter's RESERVE_MS), so C is told {told} where the chapter's C was told 1,448"
        " (2,000 less A's and B's 500 ms of work and one reserve), and C's own deadline,"
        f" {p['user_wait'] * 1000:,.0f} ms less three reserves, is {own:,.0f} ms. The chapter's"
        " C ran on until B hung up at 1,963 ms. The lab keeps a reserve at every hop: it is"
        " what deadlines does, and the chapter's own rule (the innermost work gives up"
        " first, while its caller still listens)."
    )
    if not same:
        return True, f"propagated: C stopped, nothing committed, as in the chapter; {why}"
    return abs(earlier) <= AGREE_MS, (
        f"propagated: the same shape (504, C stopped, nothing committed), but {why}"
    )


#: Each hop's lane inside a run's band, so marks a few ms apart do not hide each other.
_LANES = {"A": 0.3, "B": 0.0, "C": -0.3}


def _marks(x: dict[str, Any]) -> list[tuple[str, str, float | None, str]]:
    """(hop, label, ms, colour) of what each hop did."""
    committed = x["c_finished_ms"] if x["c_committed"] else None
    return [
        ("A", "A answers", x["a_answered_ms"], "tab:blue"),
        ("B", "B gives up", x["b_gave_up_ms"], "tab:orange"),
        ("C", "C stopped", x["c_stopped_ms"], "tab:green"),
        ("C", "C committed", committed, "tab:red"),
    ]


def plot(result: dict[str, Any], path: str | Path) -> Path:
    """A timeline per run, a lane per hop: when A answered, B gave up, C stopped or committed.

    Hollow grey marks are the chapter's figures for the same events.
    """
    plt = report.pyplot()
    names = list(result["variants"])
    fig, ax = plt.subplots(figsize=(10, 1.2 + 1.9 * len(names)), layout="constrained")
    user_wait = result["params"]["user_wait"] * 1000.0
    for row, name in enumerate(names):
        x = result["variants"][name]
        for hop, label, value, colour in _marks(x):
            if value is None:
                continue
            y = row + _LANES[hop]
            ax.scatter([value], [y], color=colour, s=60, zorder=3)
            ax.annotate(f"{label} {value:,.0f} ms", (value, y), textcoords="offset points",
                        xytext=(8, -3), fontsize=8, color=colour)  # fmt: skip
        ref = chapter.CHAIN.get(name)
        if ref is not None and chapter.same_params(result["params"], chapter.CHAIN_PARAMS):
            for hop, value in (("A", ref.a_answered_ms), ("B", ref.b_gave_up_ms),
                               ("C", ref.c_ended_ms)):  # fmt: skip
                # Just under the lane, so it never hides the measured mark or its label.
                y = row + _LANES[hop] - 0.12
                ax.scatter([value], [y], s=40, facecolor="none", edgecolor="grey", zorder=2)
                ax.annotate(f"{value:,.0f}", (value, y), textcoords="offset points",
                            xytext=(7, -3), fontsize=7, color="grey")  # fmt: skip
        if name == "propagated":
            reserves = 3 * result["params"]["reserve"] * 1000.0
            ax.vlines(user_wait - reserves, row - 0.45, row + 0.45, color="tab:green",
                      linestyle="--", linewidth=1,
                      label=f"C's own deadline: the user's wait less 3 reserves of"
                            f" {reserves / 3:g} ms")  # fmt: skip
    ax.scatter([], [], s=60, facecolor="none", edgecolor="grey", label="the chapter (Node)")
    ax.axvline(user_wait, color="grey", linestyle=":", label="the user gives up")
    ticks = [row + offset for row in range(len(names)) for offset in _LANES.values()]
    ax.set_yticks(ticks)
    ax.set_yticklabels([f"{_LABELS.get(n, n)}: {hop}" for n in names for hop in _LANES],
                       fontsize=8)  # fmt: skip
    ax.set_ylim(-0.6, len(names) - 0.4)
    ax.margins(x=0.2)  # room for the labels right of the last mark
    ax.set_xlabel("ms since the user's request")
    ax.set_title("chain: who is still working after the user left?")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="upper right")
    return report.save_figure(fig, path)
