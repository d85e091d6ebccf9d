"""Experiment `defaults` (the chapter's Part 2, in Python): what clients do by default.

Every (client, setup) runs against every misbehaving server at the same time: the
servers in one process, the clients in another, each case against its own server so
that its connection can be told apart. A case still waiting at `cap` is reported as
"> cap, still waiting" and stopped by ending the client process.

`connection_closed` is read from the client's side (Linux ``/proc/net/tcp``): whether
the client still holds a TCP socket to that server 200 ms after its call returned.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import _params, report
from .harness import Processes, read_lines
from .progress import Progress

SERVERS = ("silent", "trickle", "header-trickle", "tls-never", "blackhole")
STILL_WAITING = "> cap, still waiting"
#: Seconds between the starts of two setups in one client process, so that their limits
#: do not all fire in the same instant.
STAGGER = 0.05


@dataclass(frozen=True)
class Params:
    """The experiment's knobs."""

    cap: float = 15.0
    limit: float = 2.0
    interval: float = 1.0

    def __post_init__(self) -> None:
        _params.check(self, seconds=("cap", "limit", "interval"))
        if self.limit >= self.cap:
            raise ValueError(f"--limit ({self.limit} s) must be shorter than --cap ({self.cap} s)")


def quick() -> Params:
    """A short run for tests: a 3 s cap, 1 s limits, a byte every 0.4 s."""
    return Params(cap=3.0, limit=1.0, interval=0.4)


def setups(limit: float) -> list[tuple[str, str, str]]:
    """(client, setup key, what the setup is, in words) for every case."""
    lim = f"{limit:g}"
    return [
        ("httpx", "no options", "httpx.AsyncClient().get(url)"),
        ("httpx", "timeout", f"httpx.Timeout({lim})"),
        ("httpx", "wait_for", f"asyncio.wait_for(get(url), {lim}), timeout=None"),
        ("aiohttp", "no options", "ClientSession().get(url)"),
        ("aiohttp", "timeout", f"ClientTimeout(total={limit + 0.3:g})"),
        ("requests", "no options", "requests.get(url)"),
        ("requests", "timeout", f"requests.get(url, timeout={lim})"),
        ("requests", "executor", f"executor.submit(get, url).result(timeout={lim})"),
        ("urllib", "no options", "urlopen(url)"),
        ("urllib", "timeout", f"urlopen(url, timeout={lim})"),
        ("deadlines", "no options", 'deadlines.httpx.AsyncClient(Dependency("lab"))'),
        ("deadlines", "scope", f"the same, in deadlines.scope({lim})"),
    ]


def expected_seconds(p: Params) -> float:
    """About how long `run` takes."""
    return p.cap + 12 * STAGGER + 3.0


def deadlines_client_missing() -> str | None:
    """Why the `deadlines` client rows cannot run here, or None."""
    import importlib.util

    return None if importlib.util.find_spec("deadlines.httpx") else "waiting for deadlines.httpx"


def run(p: Params, progress: Progress) -> dict[str, Any]:
    """Run every case; the JSON-ready result (``rows`` is the list the issue specifies)."""
    pending = deadlines_client_missing()
    cases = [
        (client, key, words, server)
        for client, key, words in setups(p.limit)
        for server in SERVERS
        if not (client == "deadlines" and pending)
    ]
    rows: list[dict[str, Any]] = []
    with progress.step("defaults", expected_seconds(p)), Processes() as procs:
        servers = procs.start(
            "defaults_servers", "--kinds", ",".join(c[3] for c in cases),
            "--interval", str(p.interval),
        )  # fmt: skip
        payload = [
            {"client": c, "key": key, "setup": words, "server": s, "url": url,
             "limit": p.limit, "delay": round((i // len(SERVERS)) * STAGGER, 3)}
            for i, ((c, key, words, s), url) in enumerate(
                zip(cases, servers.info["urls"], strict=True)
            )
        ]  # fmt: skip
        # One process per client library: one client's threads and exceptions must not
        # delay another's timers through the GIL.
        by_client: dict[str, list[dict[str, Any]]] = {}
        for case in payload:
            by_client.setdefault(case["client"], []).append(case)
        clients = procs.start_all(
            [("defaults_clients", [json.dumps(cases)]) for cases in by_client.values()]
        )
        until = time.monotonic() + p.cap + len(payload) / len(SERVERS) * STAGGER
        done: dict[tuple[str, str, str], dict[str, Any]] = {}
        for _, line in read_lines(clients, until + 0.5):
            if line.startswith("CASE "):
                row = json.loads(line[5:])
                done[(row["client"], row["setup"], row["server"])] = row
                if len(done) == len(payload):
                    break
        for case in payload:
            key = (case["client"], case["setup"], case["server"])
            row = done.get(key)
            if row is None or row["elapsed_ms"] > p.cap * 1000.0:
                row = {
                    "client": case["client"], "setup": case["setup"], "server": case["server"],
                    "outcome": STILL_WAITING, "error": None,
                    "elapsed_ms": round(p.cap * 1000.0, 1), "connection_closed": False,
                }  # fmt: skip
            rows.append(row)
    return {
        "params": {"cap": p.cap, "limit": p.limit, "interval": p.interval},
        "rows": rows,
        "pending": {"deadlines": pending} if pending else {},
    }


def _cell(row: dict[str, Any], cap: float) -> str:
    if row["outcome"] == STILL_WAITING:
        return f"> {cap:g} s, waiting"
    secs = f"{row['elapsed_ms'] / 1000.0:.2f} s"
    if row["outcome"] == "waiter stopped, worker still running":
        text = f"waiter gave up {secs}, worker runs"
    elif row["outcome"] == "error":
        name = (row["error"] or "").split(":", 1)[0].rsplit(".", 1)[-1]
        text = f"{name} {secs}"
    else:
        text = f"{row['outcome']} {secs}"
    if row["connection_closed"] is False:
        text += ", socket open"
    return text


def tables(result: dict[str, Any]) -> list[report.Table]:
    """One row per (client, setup), one column per server."""
    cap = result["params"]["cap"]
    table = report.Table(
        f"defaults: each client against each misbehaving server (cap {cap:g} s)",
        ["client", "setup", *SERVERS],
    )
    grid: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for row in result["rows"]:
        grid.setdefault((row["client"], row["setup"]), {})[row["server"]] = row
    for (client, setup), by_server in grid.items():
        cells = [_cell(by_server[s], cap) if s in by_server else "-" for s in SERVERS]
        table.rows.append([client, setup, *cells])
    for client, why in result.get("pending", {}).items():
        table.rows.append([client, "pending", why, *["-"] * (len(SERVERS) - 1)])
    table.note = (
        "'socket open': the client still held its TCP connection 200 ms after the call "
        "returned. '> cap, waiting': the call had not returned when the case was stopped."
    )
    return [table]


def _colour(row: dict[str, Any]) -> str:
    if row["outcome"] == STILL_WAITING:
        return "#c0392b"
    return "#e67e22" if row["connection_closed"] is False else "#27ae60"


def plot(result: dict[str, Any], path: str | Path) -> Path:
    """Time to give up per case, as horizontal bars; cases at the cap are hatched."""
    plt = report.pyplot()
    rows = result["rows"]
    cap = result["params"]["cap"]
    fig, axes = plt.subplots(1, len(SERVERS), figsize=(16, 0.3 * len(rows) / len(SERVERS) + 2),
                             sharey=True)  # fmt: skip
    labels: list[str] = []
    for ax, server in zip(axes, SERVERS, strict=True):
        mine = [r for r in rows if r["server"] == server]
        labels = [f"{r['client']}: {r['setup']}"[:60] for r in mine]
        values = [r["elapsed_ms"] / 1000.0 for r in mine]
        colors = [_colour(r) for r in mine]
        ax.barh(range(len(mine)), values, color=colors)
        ax.axvline(cap, color="grey", linestyle=":")
        ax.set_title(server)
        ax.set_xlabel("seconds")
        ax.invert_yaxis()
    axes[0].set_yticks(range(len(labels)))
    axes[0].set_yticklabels(labels, fontsize=7)
    fig.suptitle("defaults: red = still waiting at the cap, orange = socket left open")
    return report.save_figure(fig, path)
