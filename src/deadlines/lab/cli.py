"""`deadlines lab [defaults|cascade|chain|slow-server|all]`: the experiments, from the shell.

Bare `deadlines lab` runs them all (about two minutes) and writes one Markdown report
with tables and pictures. Each experiment prints tables like the chapter's; `--json`
writes its figures, `--plot` a PNG, `--quick` a short version. The chapter's numbers
are only the defaults: every duration, rate, budget and pool size is a flag.
`deadlines lab slow-server --sim` runs the simulated twin with the same flags.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import signal
import sys
import time
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

from .progress import Progress

#: experiment -> its module (imported when it runs: `deadlines --help` needs no extra)
EXPERIMENTS: dict[str, str] = {
    "defaults": "deadlines.lab.defaults",
    "cascade": "deadlines.lab.cascade",
    "chain": "deadlines.lab.chain",
    "slow-server": "deadlines.lab.slow_server",
}


#: experiment -> its simulated twin in `deadlines.sim` (`deadlines lab NAME --sim`)
SIMULATED: dict[str, str] = {"slow-server": "lab_slow_server"}


def experiment(name: str) -> ModuleType:
    """The module of experiment `name`."""
    return importlib.import_module(EXPERIMENTS[name])


_SECTIONS = {
    "defaults": (
        "Part 2 — what clients do by default",
        "Each client against each misbehaving server, with no options and with common "
        "options. Idle timers do not cap a trickle; a waiter that gives up does not stop "
        "the worker; only a total limit, or a deadline, ends every case.",
    ),
    "cascade": (
        "Part 3 — no timeout, as a cascade",
        "Recommendations stop answering at t=0. Without a bound on the wait, /home "
        "requests pile up (Little's law) and, through the shared pool, /checkout dies "
        "too. A timeout bounds the wait; a bulkhead only bounds who shares it.",
    ),
    "chain": (
        "Part 4 — fixed timeouts vs a propagated budget",
        "A → B → C, the user waits 2 s, C needs 3 s and ends in a commit. With fixed "
        "timeouts C commits for nobody after A answered; with the budget propagated "
        "and cancellation on 'caller left', C stops at about the user's deadline.",
    ),
    "slow-server": (
        "Slow is worse than down",
        "One server of N becomes 5× slower at t=1 s but stays healthy. Round robin keeps "
        "sending it its share; its queue grows and so does p99. Least outstanding routes "
        "around it; deadlines shed the work nobody waits for any more.",
    ),
}

#: dest -> (experiment, Params field)
_FLAGS: dict[str, tuple[str, str]] = {}


def _flag(group: Any, experiment: str, field: str, kind: Any, help_text: str) -> None:
    dest = f"{experiment.replace('-', '_').replace('*', 'any')}__{field}"
    flag = "--" + field.replace("_", "-")
    if kind is tuple:
        group.add_argument(flag, dest=dest, metavar="A,B", help=help_text)
    else:
        metavar = "DSN" if kind is str else "N"
        group.add_argument(flag, dest=dest, type=kind, metavar=metavar, help=help_text)
    _FLAGS[dest] = (experiment, field)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the lab's arguments to `parser` (the `lab` subcommand)."""
    parser.add_argument(
        "experiment", nargs="?", default="all", choices=[*EXPERIMENTS, "all"],
        help="which experiment (default: all, about two minutes)",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="short version (for tests)")
    parser.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG (one experiment)")
    parser.add_argument(
        "--report", metavar="PATH", default="lab-report/report.md",
        help="all: where the Markdown report goes (PNGs beside it)",
    )  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    parser.add_argument(
        "--sim", action="store_true",
        help="slow-server: simulate it (deadlines.sim) with the same flags, no processes",
    )  # fmt: skip
    _FLAGS.clear()
    g = parser.add_argument_group("defaults")
    _flag(g, "defaults", "cap", float, "seconds a case may run before '> cap' (15)")
    _flag(g, "defaults", "limit", float, "the common options' timeout, s (2)")
    _flag(g, "defaults", "interval", float, "trickle servers: seconds per byte (1)")
    g = parser.add_argument_group("cascade")
    _flag(g, "cascade", "duration", float, "seconds of load (10)")
    _flag(g, "cascade", "home_rate", float, "/home requests per second (50)")
    _flag(g, "cascade", "checkout_rate", float, "/checkout requests per second (10)")
    _flag(g, "cascade", "pool_size", int, "connections per pool (20)")
    _flag(g, "cascade", "recs_timeout", float, "timeout/deadlines: limit on recs, s (0.3)")
    _flag(g, "cascade", "checkout_timeout", float, "what the client gives /checkout, s (5)")
    _flag(g, "cascade", "home_deadline", float, "deadlines: /home's route deadline, s (1)")
    g = parser.add_argument_group("cascade and chain")
    _flag(g, "*", "variants", tuple, "cascade: no_timeout,timeout,bulkhead,deadlines; "
          "chain: fixed,propagated")  # fmt: skip
    g = parser.add_argument_group("chain")
    _flag(g, "chain", "user_wait", float, "how long the user waits, s (2)")
    _flag(g, "chain", "a_work", float, "A's own work, s (0.2)")
    _flag(g, "chain", "b_work", float, "B's own work, s (0.3)")
    _flag(g, "chain", "c_work", float, "C's work before its commit, s (3)")
    _flag(g, "chain", "ab_timeout", float, "fixed: A's timeout on B, s (1.8)")
    _flag(g, "chain", "bc_timeout", float, "fixed: B's timeout on C, s (2)")
    _flag(g, "chain", "reserve", float, "propagated: reserve per hop, s (0.05)")
    _flag(g, "chain", "dsn", str, "commit into Postgres at this DSN (default: SQLite)")
    g = parser.add_argument_group("slow-server")
    _flag(g, "slow-server", "servers", int, "backend processes (3)")
    _flag(g, "slow-server", "rate", float, "requests per second (90)")
    _flag(g, "slow-server", "run_for", float, "seconds of load per policy (7)")
    _flag(g, "slow-server", "service_ms", float, "one request's work on a backend, ms (20)")
    _flag(g, "slow-server", "slow_factor", float, "how much slower one backend gets (5)")
    _flag(g, "slow-server", "slow_at", float, "when it gets slower, s (1)")
    _flag(g, "slow-server", "request_deadline", float, "deadlines policy: budget, s (1)")
    _flag(g, "slow-server", "client_timeout", float, "other policies: client gives up, s (3)")
    _flag(g, "slow-server", "policies", tuple, "round_robin,least_outstanding,...")


def params_for(name: str, args: argparse.Namespace) -> Any:
    """The experiment's Params: quick or default, with the given flags applied."""
    module = experiment(name)
    base = module.quick() if args.quick else module.Params()
    changes: dict[str, Any] = {}
    for dest, (owner, field) in _FLAGS.items():
        value = getattr(args, dest, None)
        if owner not in (name, "*") or value is None or not hasattr(base, field):
            continue
        if isinstance(getattr(base, field), tuple):
            value = tuple(part.strip() for part in str(value).split(",") if part.strip())
            if owner == "*" and args.experiment == "all":
                # One flag for several experiments: each takes the names it knows.
                value = tuple(v for v in value if v in getattr(module, "VARIANTS", ()))
                if not value:
                    continue
        changes[field] = value
    try:
        return dataclasses.replace(base, **changes)
    except (TypeError, ValueError) as exc:
        raise SystemExit(f"deadlines lab {name}: {exc}") from exc


def simulate(name: str, params: Any) -> dict[str, Any]:
    """Experiment `name`'s simulated twin (`deadlines.sim`), fed the same Params.

    Returns the experiment's JSON shape with ``"simulated": true``; no process starts.
    """
    from deadlines import sim

    twin = getattr(sim, SIMULATED[name])
    fields = {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}
    result: dict[str, Any] = twin(**fields)
    return result


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds through every `with Processes()`: children stopped


def run(args: argparse.Namespace) -> int:
    """Run the chosen experiment(s); returns the exit code."""
    if getattr(args, "sim", False) and args.experiment not in SIMULATED:
        print(
            f"deadlines lab {args.experiment}: --sim is for {', '.join(SIMULATED)} only "
            "(the cascade and chain have scenarios: deadlines sim examples/sim/...)",
            file=sys.stderr,
        )
        return 2
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    progress = Progress(quiet=args.quiet)
    try:
        if args.experiment == "all":
            return _run_all(args, progress)
        return _run_one(args.experiment, args, progress)
    except KeyboardInterrupt:
        print("deadlines lab: interrupted; every server it started was stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_one(name: str, args: argparse.Namespace, progress: Progress) -> int:
    from . import report

    module = experiment(name)
    params = params_for(name, args)
    if getattr(args, "sim", False):
        with progress.step(f"{name} (simulated)", 1.0):
            result = simulate(name, params)
    else:
        result = module.run(params, progress)
    for table in module.tables(result):
        print(table.text())
        print()
    if args.json:
        data = result["rows"] if name == "defaults" else result
        print(f"JSON: {report.write_json(args.json, data)}")
    if args.plot:
        print(f"PNG: {module.plot(result, args.plot)}")
    return 0


def _run_all(args: argparse.Namespace, progress: Progress) -> int:
    from . import report

    chosen = {name: params_for(name, args) for name in EXPERIMENTS}
    total = sum(experiment(n).expected_seconds(p) for n, p in chosen.items())
    progress.note(f"running {', '.join(chosen)}: about {total:.0f} s")
    started = time.monotonic()
    report_path = Path(args.report)
    folder = report_path.parent
    results: dict[str, Any] = {}
    sections = []
    for name, params in chosen.items():
        module = experiment(name)
        result = module.run(params, progress)
        results[name] = result
        tables = module.tables(result)
        for table in tables:
            print(table.text())
            print()
        picture = module.plot(result, folder / f"{name}.png")
        heading, text = _SECTIONS[name]
        sections.append((heading, text, tables, [picture]))
    took = time.monotonic() - started
    intro = (
        f"Measured by `deadlines lab{' --quick' if args.quick else ''}` in {took:.0f} s "
        f"with real processes on loopback (Python {sys.version.split()[0]}). "
        "Each section reproduces a measured table of the reference chapter."
    )
    path = report.markdown_report(
        report_path, title="deadlines lab report", intro=intro, sections=sections
    )
    json_path = Path(args.json) if args.json else folder / "results.json"
    report.write_json(json_path, results)
    print(f"JSON: {json_path}")
    print(f"Report: {path}")
    return 0
