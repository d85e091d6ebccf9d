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
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import _params, chapter, report
from ..harness import Processes, read_lines
from ..progress import Progress

#: The aiohttp total that shows its rounding (aiohttp rounds deadlines of 5 s and more up
#: to a whole second of the loop's clock).
ROUNDED_TOTAL = 7.3

SERVERS = ("silent", "trickle", "header-trickle", "tls-never", "blackhole")
STILL_WAITING = "> cap, still waiting"
#: Outcomes of the cases whose waiter gives up while the work goes on.
WORKER_RUNS = "waiter stopped, worker still running"
NO_EXIT = "waiter stopped, process cannot exit"
EXITED = "waiter stopped, process exited"
#: Seconds between the starts of two cases in one client process, so that their limits
#: do not all fire in the same instant (and contend for the GIL there).
STAGGER = 0.05
#: A call that ends within this of a configured limit ended "on time".
ON_TIME = 0.05


@dataclass(frozen=True)
class Params:
    """The experiment's knobs."""

    cap: float = 15.0
    limit: float = 2.0
    interval: float = 1.0
    long: bool = False

    def __post_init__(self) -> None:
        _params.check(self, seconds=("cap", "limit", "interval"))
        if self.limit >= self.cap:
            raise ValueError(f"--limit ({self.limit} s) must be shorter than --cap ({self.cap} s)")


def quick() -> Params:
    """A short run for tests: a 3 s cap, 1 s limits, a byte every 0.4 s."""
    return Params(cap=3.0, limit=1.0, interval=0.4)


def kernel_connect_seconds() -> float | None:
    """When Linux gives up a connect whose SYNs are all dropped, or None off Linux.

    It retransmits the SYN ``net.ipv4.tcp_syn_retries`` times, 1 s after the first and
    doubling: 1 + 2 + ... + 2^retries seconds.
    """
    try:
        with open("/proc/sys/net/ipv4/tcp_syn_retries") as fh:
            retries = int(fh.read())
    except (OSError, ValueError):
        return None
    return float(2 ** (retries + 1) - 1)


def long_cap(p: Params) -> float:
    """The cap of the blackhole cases with `--long`: past the kernel's own connect timeout."""
    kernel = kernel_connect_seconds() or 127.0
    return max(p.cap, kernel + 30.0) if p.long else p.cap


@dataclass(frozen=True)
class Setup:
    """One way of calling: the client, its options, and the limits they configure."""

    client: str
    key: str
    words: str
    short: str
    limits_text: str
    limits: tuple[float, ...]
    servers: tuple[str, ...] = SERVERS
    #: Runs in a process of its own (``defaults.exit``): whether that process can exit.
    own_process: bool = False
    #: Why its limit fires late, when that is the point of the case.
    late_because: str = ""
    #: Its limit on the whole call, if it has one: the only kind that ends a trickle.
    total: float | None = None


def setups(limit: float) -> list[Setup]:
    """Every setup, with the limits it configures (in seconds) for marking the outcome."""
    lim = f"{limit:g}"
    s = f"{lim} s"
    aio = limit + 0.3
    return [
        Setup("httpx", "no options", "httpx.AsyncClient().get(url)", "httpx, no options",
              "5 s/phase", (5.0,)),
        Setup("httpx", "timeout", f"httpx.Timeout({lim})", f"httpx.Timeout({lim})",
              f"{s}/phase", (limit,)),
        Setup("httpx", "pool", f"httpx.Timeout({lim}), its pool of 1 held by a hung call",
              f"Timeout({lim}), pool in use", f"{s}/phase", (limit,), servers=("silent",),
              late_because="the pool wait and the read timeout add up"),
        Setup("httpx", "wait_for", f"asyncio.wait_for(get(url), {lim}), timeout=None",
              f"wait_for(httpx get, {lim})", f"{s} total", (limit,), total=limit),
        Setup("httpx", "fail_after", f"with anyio.fail_after({lim}): get(url), timeout=None",
              f"anyio.fail_after({lim}), httpx", f"{s} total", (limit,), total=limit),
        Setup("aiohttp", "no options", "ClientSession().get(url)", "aiohttp, no options",
              "300 s total", (30.0, 300.0), total=300.0),
        Setup("aiohttp", "timeout", f"ClientTimeout(total={aio:g})",
              f"ClientTimeout(total={aio:g})", f"{aio:g} s total", (aio,), total=aio),
        Setup("aiohttp", "total_rounded", f"ClientTimeout(total={ROUNDED_TOTAL:g})",
              f"ClientTimeout(total={ROUNDED_TOTAL:g})", f"{ROUNDED_TOTAL:g} s total",
              (ROUNDED_TOTAL,), total=ROUNDED_TOTAL,
              late_because="aiohttp rounds a deadline of 5 s or more up to a whole second"),
        Setup("aiohttp", "sock_read", f"ClientTimeout(sock_read={lim})",
              f"ClientTimeout(sock_read={lim})", f"{s}/read", (limit,)),
        Setup("requests", "no options", "requests.get(url)", "requests, no options", "none", ()),
        Setup("requests", "timeout", f"requests.get(url, timeout={lim})",
              f"requests timeout={lim}", f"{s}/read", (limit,)),
        Setup("requests", "executor", f"executor.submit(get, url).result(timeout={lim})",
              f"executor .result(timeout={lim})", f"{s} wait", (limit,)),
        Setup("requests", "to_thread", f"asyncio.wait_for(asyncio.to_thread(get, url), {lim})",
              f"wait_for(to_thread(get), {lim})", f"{s} wait", (limit,),
              servers=("silent",), own_process=True),
        Setup("requests", "run_in_executor",
              f"with ThreadPoolExecutor() as pool: wait_for(run_in_executor(pool, get, url),"
              f" {lim})", f"wait_for(executor get, {lim})", f"{s} wait", (limit,),
              servers=("silent",), own_process=True),
        Setup("urllib", "no options", "urlopen(url)", "urlopen, no options", "none", ()),
        Setup("urllib", "timeout", f"urlopen(url, timeout={lim})", f"urlopen(timeout={lim})",
              f"{s}/read", (limit,)),
        Setup("deadlines", "no options", 'deadlines.httpx.AsyncClient(Dependency("lab"))',
              "deadlines.httpx, defaults", "2/10/30 s", (2.0, 10.0, 30.0), total=30.0),
        Setup("deadlines", "scope", f"the same, in deadlines.scope({lim})",
              f"deadlines.scope({lim})", f"{s} total", (limit,), total=limit),
    ]  # fmt: skip


def expected_seconds(p: Params) -> float:
    """About how long `run` takes."""
    return long_cap(p) + _most_cases_per_process(p) * STAGGER + 3.0


def _most_cases_per_process(p: Params) -> int:
    counts: dict[str, int] = {}
    for setup in setups(p.limit):
        counts[setup.client] = counts.get(setup.client, 0) + len(setup.servers)
    return max(counts.values())


def deadlines_client_missing() -> str | None:
    """Why the `deadlines` client rows cannot run here, or None."""
    import importlib.util

    return None if importlib.util.find_spec("deadlines.httpx") else "waiting for deadlines.httpx"


def _still_waiting(case: dict[str, Any], cap: float) -> dict[str, Any]:
    return {
        "client": case["client"], "setup": case["setup"], "server": case["server"],
        "outcome": STILL_WAITING, "error": None,
        "elapsed_ms": round(cap * 1000.0, 1), "connection_closed": False,
    }  # fmt: skip


def run(p: Params, progress: Progress) -> dict[str, Any]:
    """Run every case; the JSON-ready result (``rows`` is the list the issue specifies)."""
    pending = deadlines_client_missing()
    chosen = [s for s in setups(p.limit) if not (s.client == "deadlines" and pending)]
    cases = [(setup, server) for setup in chosen for server in setup.servers]
    rows: list[dict[str, Any]] = []
    with progress.step("defaults", expected_seconds(p)), Processes() as procs:
        servers = procs.start(
            "defaults.servers", "--kinds", ",".join(server for _, server in cases),
            "--interval", str(p.interval),
        )  # fmt: skip
        payload = [
            {"client": setup.client, "key": setup.key, "setup": setup.words, "server": server,
             "url": url, "limit": p.limit, "own": setup.own_process,
             "cap": long_cap(p) if server == "blackhole" else p.cap}
            for (setup, server), url in zip(cases, servers.info["urls"], strict=True)
        ]  # fmt: skip
        # One process per client library: one client's threads and exceptions must not
        # delay another's timers through the GIL. A case that must show whether its
        # process can exit has a process of its own.
        groups: dict[str, list[dict[str, Any]]] = {}
        for case in payload:
            name = f"{case['setup']} {case['server']}" if case["own"] else case["client"]
            group = groups.setdefault(name, [])
            case["delay"] = round(len(group) * STAGGER, 3)
            group.append(case)
        specs = [
            ("defaults.exit" if group[0]["own"] else "defaults.clients", [json.dumps(group)])
            for group in groups.values()
        ]
        clients = procs.start_all(specs)
        started = time.monotonic()
        until = started + max(c["cap"] + c["delay"] for c in payload)
        done: dict[tuple[str, str, str], dict[str, Any]] = {}
        for _, line in read_lines(clients, until + 0.5):
            if line.startswith("CASE "):
                row = json.loads(line[5:])
                done[(row["client"], row["setup"], row["server"])] = row
                if len(done) == len(payload):
                    break
        # A process that could exit has done so by the cap.
        exit_by = started + p.cap
        while time.monotonic() < exit_by:
            time.sleep(0.1)
        alive = {
            (c["client"], c["setup"], c["server"]): child.process.poll() is None
            for child, group in zip(clients, groups.values(), strict=True)
            for c in group
            if c["own"]
        }
        for case in payload:
            key = (case["client"], case["setup"], case["server"])
            row = done.get(key)
            if row is None or row["elapsed_ms"] > case["cap"] * 1000.0:
                row = _still_waiting(case, case["cap"])
            elif key in alive:
                row["outcome"] = NO_EXIT if alive[key] else EXITED
            rows.append(row)
    return {
        "params": {"cap": p.cap, "limit": p.limit, "interval": p.interval, "long": p.long,
                   "long_cap": long_cap(p), "kernel_connect_s": kernel_connect_seconds()},
        "rows": rows,
        "pending": {"deadlines": pending} if pending else {},
    }  # fmt: skip


def mark(seconds: float, limits: tuple[float, ...]) -> str:
    """An ended call against its configured limits: ``on time``, ``+0.53 s`` late, or its time.

    The limit it is measured against is the longest one it had already passed.
    """
    passed = [limit for limit in limits if limit <= seconds + ON_TIME]
    if not passed:
        return f"{seconds:.2f} s"
    late = seconds - max(passed)
    return "on time" if late <= ON_TIME else f"+{late:.2f} s"


def _waiting_mark(setup: Setup | None, cap: float) -> str:
    """A call still waiting at the cap: ``> cap`` if its whole-call limit (or every limit
    it has) is longer, else ``never`` (its limits do not fire on this server, or it has
    none)."""
    if setup is None or not setup.limits:
        return "never"
    beyond = min(setup.limits) > cap or (setup.total is not None and setup.total > cap)
    return "> cap" if beyond else "never"


def cell(row: dict[str, Any], setup: Setup | None, cap: float) -> str:
    """The compact cell: the outcome against the limits, ``*`` when the socket was left open."""
    limits = setup.limits if setup is not None else ()
    outcome = row["outcome"]
    seconds = row["elapsed_ms"] / 1000.0
    if outcome == STILL_WAITING:
        text = _waiting_mark(setup, seconds)
    elif outcome == WORKER_RUNS:
        text = "runs on"
    elif outcome == NO_EXIT:
        text = "no exit"
    else:
        text = mark(seconds, limits)
    open_socket = row["connection_closed"] is False and outcome != STILL_WAITING
    return text + ("*" if open_socket else "")


def _detail(row: dict[str, Any], cap: float) -> str:
    if row["outcome"] == STILL_WAITING:
        return f"> {row['elapsed_ms'] / 1000.0:g} s, waiting"
    secs = f"{row['elapsed_ms'] / 1000.0:.2f} s"
    if row["outcome"] == WORKER_RUNS:
        text = f"waiter gave up {secs}, worker runs"
    elif row["outcome"] in (NO_EXIT, EXITED):
        exited = "exited" if row["outcome"] == EXITED else "process cannot exit"
        text = f"waiter gave up {secs}, {exited}"
    elif row["outcome"] == "error":
        name = (row["error"] or "").split(":", 1)[0].rsplit(".", 1)[-1]
        text = f"{name} {secs}"
    else:
        text = f"{row['outcome']} {secs}"
    if row["connection_closed"] is False:
        text += ", socket open"
    return text


def _grid(result: dict[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    grid: dict[str, dict[str, dict[str, Any]]] = {}
    for row in result["rows"]:
        grid.setdefault(row["setup"], {})[row["server"]] = row
    return grid


def _setups_of(result: dict[str, Any]) -> dict[str, Setup]:
    return {setup.words: setup for setup in setups(result["params"]["limit"])}


def _chapter_cells(found: dict[str, tuple[float, float] | str]) -> list[str]:
    cells = []
    for server in SERVERS:
        value = found.get(server, "-")
        cells.append(value if isinstance(value, str) else mark(value[0], (value[1],)))
    return cells


def tables(result: dict[str, Any]) -> list[report.Table]:
    """The compact table (100 columns): each outcome against the limits it had."""
    params = result["params"]
    cap = params["cap"]
    known = _setups_of(result)
    table = report.Table(
        f"defaults: each client against each misbehaving server (cap {cap:g} s)",
        ["setup", "limits", *SERVERS],
    )
    for words, by_server in _grid(result).items():
        setup = known.get(words)
        short = setup.short if setup else words[:30]
        limits = setup.limits_text if setup else "?"
        cells = [cell(by_server[s], setup, cap) if s in by_server else "-" for s in SERVERS]
        table.rows.append([short, limits, *cells])
    for client, why in result.get("pending", {}).items():
        table.rows.append([client, "pending", why[:8], *["-"] * (len(SERVERS) - 1)])
    table.rows.append(["the chapter (Node 22):", "", *[""] * len(SERVERS)])
    for label, limits, found in chapter.DEFAULTS:
        table.rows.append([label, limits, *_chapter_cells(found)])
    table.note = (
        f"on time: it ended within {ON_TIME * 1000:.0f} ms of a configured limit; +x s: that"
        f" much later; never: still waiting at the {cap:g} s cap, its limits not firing (or"
        " none set); > cap: its whole-call limit, or every limit it has, is longer than the"
        " cap; runs on: the waiter"
        " gave up, the worker and its socket did not; no exit: the waiter gave up, the process"
        " could not exit; *: the client still held its socket 200 ms later. " + _kernel_note(result)
    ).rstrip()
    table.verdict = _verdict(result, known)
    return [table]


def _kernel_note(result: dict[str, Any]) -> str:
    params = result["params"]
    kernel = params.get("kernel_connect_s")
    if kernel is None:
        return ""
    rows = [r for r in result["rows"] if r["server"] == "blackhole" and r["setup"] in
            ("requests.get(url)", "urlopen(url)") and r["outcome"] == "error"]  # fmt: skip
    if params.get("long") and rows:
        took = max(r["elapsed_ms"] for r in rows) / 1000.0
        return (
            f"With no connect limit, a blackholed connect ended when the kernel gave up:"
            f" after {took:.0f} s ({kernel:.0f} s of SYN retransmits and waits at least, from"
            " net.ipv4.tcp_syn_retries). "
        )
    return (
        f"With no connect limit (requests, urlopen), a blackholed connect ends only when the"
        f" kernel gives up: after {kernel:.0f} s at least here (net.ipv4.tcp_syn_retries);"
        " --long measures it. "
    )


def details(result: dict[str, Any]) -> list[report.Table]:
    """The full table for report.md: each error, its time, the socket left open."""
    cap = result["params"]["cap"]
    known = _setups_of(result)
    table = report.Table(
        "defaults, in detail: what each call raised and when",
        ["client", "setup", "limits", *SERVERS],
    )
    for words, by_server in _grid(result).items():
        setup = known.get(words)
        client = next(iter(by_server.values()))["client"]
        limits = setup.limits_text if setup else "?"
        cells = [
            f"{_detail(by_server[s], cap)} ({cell(by_server[s], setup, cap)})"
            if s in by_server else "-"
            for s in SERVERS
        ]  # fmt: skip
        table.rows.append([client, words, limits, *cells])
    table.note = (
        "Each cell: the error the call raised and when, then (in brackets) the mark of the"
        " compact table. 'socket open': the client still held its TCP connection 200 ms after"
        " the call returned."
    )
    return [table]


def _find(result: dict[str, Any], key: str, server: str, known: dict[str, Setup]) -> list[Any]:
    return [
        r for r in result["rows"]
        if r["server"] == server and r["setup"] in known and known[r["setup"]].key == key
    ]  # fmt: skip


def _verdict(result: dict[str, Any], known: dict[str, Setup]) -> str:
    """Set the measurement beside the chapter's Part 2, from the rows themselves."""
    cap = result["params"]["cap"]
    per_read = [
        r for r in result["rows"]
        if r["server"] == "trickle" and r["setup"] in known
        and known[r["setup"]].limits_text.endswith(("/read", "/phase"))
    ]  # fmt: skip
    totals = [
        r for r in result["rows"]
        if r["server"] == "trickle" and r["setup"] in known
        and (known[r["setup"]].total or math.inf) <= cap
    ]  # fmt: skip
    never = all(r["outcome"] == STILL_WAITING for r in per_read)
    ended = all(r["outcome"] == "error" and r["elapsed_ms"] < cap * 1000 for r in totals)
    late: dict[str, list[float]] = {}
    cases: dict[str, int] = {}
    fired = 0
    for row in result["rows"]:
        setup = known.get(row["setup"])
        if setup is None or row["outcome"] != "error" or not setup.limits:
            continue
        fired += 1
        cases[setup.words] = cases.get(setup.words, 0) + 1
        text = mark(row["elapsed_ms"] / 1000.0, setup.limits)
        if text.startswith("+"):
            late.setdefault(setup.words, []).append(float(text[1:-2]))
    worst = []
    for words, values in late.items():
        setup = known[words]
        span = f"+{min(values):.2f}" + (f" to {max(values):.2f}" if len(values) > 1 else "")
        why = f", {setup.late_because}" if setup.late_because else ""
        worst.append(f"{setup.short} {span} s ({len(values)} of {cases[words]}{why})")
    shape = (
        "as with undici's bodyTimeout, every per-read limit"
        f" ({len(per_read)} cases) {'never' if never else 'did not always'} fired on the trickle,"
        f" and every whole-call limit within the cap ({len(totals)} cases)"
        f" {'ended' if ended else 'did not end'}"
        " it, as AbortSignal.timeout did. "
    )
    on_time = fired - sum(len(v) for v in late.values())
    timing = (
        f"Where a limit fired, {on_time} of {fired} calls ended within"
        f" {ON_TIME * 1000:.0f} ms of it (undici's timers were ~0.5 s late); late: "
        + ("; ".join(worst) if worst else "none")
        + ". The chapter's Node rows are in the table."
    )
    return chapter.verdict(never and ended, shape + timing)


#: The colours of the plot, by what the compact table's mark says.
_KINDS = (
    ("on time", "#27ae60", "ended by its limit, on time"),
    ("late", "#f1c40f", "ended by its limit, late"),
    ("early", "#3498db", "ended before any limit (an error or an answer)"),
    ("left", "#e67e22", "the waiter gave up; worker, socket or process lives on"),
    ("never", "#c0392b", "still waiting at the cap: its limit never fired, or it had none"),
    ("beyond", "#e6b0aa", "still waiting at the cap, which is shorter than its limit"),
)


def _kind(row: dict[str, Any], setup: Setup | None, cap: float) -> str:
    text = cell(row, setup, cap)
    if text in ("runs on*", "no exit*", "runs on", "no exit") or text.endswith("*"):
        return "left"
    if text == "> cap":
        return "beyond"
    if text == "on time":
        return "on time"
    if text.startswith("+"):
        return "late"
    return "never" if text == "never" else "early"


def plot(result: dict[str, Any], path: str | Path) -> Path:
    """Per server, how long each call waited: a bar per setup, coloured by what ended it,
    with the limits the setup configures marked, and the cap."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    plt = report.pyplot()
    params = result["params"]
    known = _setups_of(result)
    grid = _grid(result)
    setups_shown = list(grid)
    colours = {kind: colour for kind, colour, _ in _KINDS}
    used: set[str] = set()
    fig, axes = plt.subplots(1, len(SERVERS), figsize=(17, 0.34 * len(setups_shown) + 2.4),
                             sharey=True, layout="constrained")  # fmt: skip
    for ax, server in zip(axes, SERVERS, strict=True):
        cap = params.get("long_cap", params["cap"]) if server == "blackhole" else params["cap"]
        for y, words in enumerate(setups_shown):
            row = grid[words].get(server)
            setup = known.get(words)
            if row is None:
                continue
            kind = _kind(row, setup, cap)
            used.add(kind)
            ax.barh(y, row["elapsed_ms"] / 1000.0, height=0.7, color=colours[kind])
            for limit in setup.limits if setup else ():
                if limit <= cap:
                    ax.plot([limit], [y], marker="|", markersize=11, markeredgewidth=2,
                            color="black")  # fmt: skip
        ax.axvline(cap, color="grey", linestyle=":")
        ax.text(cap * 0.98, -0.9, f"cap {cap:g} s", ha="right", va="bottom", fontsize=7,
                color="grey")  # fmt: skip
        ax.set_xlim(0, cap * 1.04)
        ax.set_title(server)
        ax.set_xlabel("seconds until the call returned")
    axes[0].set_yticks(range(len(setups_shown)))
    axes[0].set_yticklabels(
        [known[w].short if w in known else w[:30] for w in setups_shown], fontsize=8
    )
    axes[0].set_ylim(len(setups_shown) - 0.5, -1.2)
    handles: list[Any] = [Patch(color=c, label=text) for k, c, text in _KINDS if k in used]
    handles.append(Line2D([], [], marker="|", markersize=11, markeredgewidth=2, color="black",
                          linestyle="none", label="a limit the setup configures"))  # fmt: skip
    fig.legend(handles=handles, loc="outside lower center", ncol=4, fontsize=8)
    fig.suptitle("defaults: how long each call waited, against the limits it was given")
    return report.save_figure(fig, path)
