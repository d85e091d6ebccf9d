"""`deadlines lab [defaults|cascade|chain|slow-server|overload|all]`: the experiments.

Bare `deadlines lab` runs them all (about five minutes) and writes one Markdown report
with tables and pictures. Each experiment prints tables like the chapter's, with the
chapter's figures beside its own and a verdict (agrees, or differs and why); `--json`
writes its figures, `--plot` a PNG, `--quick` a short version. The chapter's numbers
are only the defaults: every duration, rate, budget and pool size is a flag.
`deadlines lab slow-server --sim` runs the simulated twin with the same flags.
Every flag, output path, module and database is checked before any process starts.
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

from .._cli import UsageError, missing_modules, output_file
from .._tools import durations
from .progress import Progress

#: experiment -> its module (imported when it runs: `deadlines --help` needs no extra)
EXPERIMENTS: dict[str, str] = {
    "defaults": "deadlines.lab.defaults",
    "cascade": "deadlines.lab.cascade",
    "chain": "deadlines.lab.chain",
    "slow-server": "deadlines.lab.slow_server",
    "overload": "deadlines.lab.overload",
}


#: experiment -> its simulated twin in `deadlines.sim` (`deadlines lab NAME --sim`)
SIMULATED: dict[str, str] = {"slow-server": "lab_slow_server"}

#: experiment -> the third-party modules it imports (the `[lab]` extra installs them)
REQUIRES: dict[str, tuple[str, ...]] = {
    "defaults": ("httpx", "httpcore", "aiohttp", "requests"),
    "cascade": ("aiohttp",),
    "chain": ("httpx", "httpcore", "starlette", "uvicorn"),
    "slow-server": ("aiohttp",),
    "overload": ("aiohttp",),
}

#: Where bare `deadlines lab` writes its report.
DEFAULT_REPORT = "lab-report/report.md"
#: Runs expected to take longer are refused: `deadlines sim` is the tool for long runs.
LONGEST_RUN = 3600.0


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
    "overload": (
        "Beyond the chapter — goodput under overload",
        "A service with a fixed capacity C gets 0.5 to 8 × C, then 0.5 × C again. With"
        " timeouts alone its queue grows until every answer comes after the deadline;"
        " naive retries multiply the load. Deadlines with admission, queue-delay shedding"
        " and a retry budget keep it answering in time (the goals beside the measurement).",
    ),
}

#: A flag's kind for seconds: "300ms", "2s" or a number, read as `sim` and `plan` read them.
SECONDS = durations.flag

#: dest -> (experiment, Params field)
_FLAGS: dict[str, tuple[str, str]] = {}


def _flag(group: Any, experiment: str, field: str, kind: Any, help_text: str) -> None:
    dest = f"{experiment.replace('-', '_').replace('*', 'any')}__{field}"
    flag = "--" + field.replace("_", "-")
    if kind is tuple:
        group.add_argument(flag, dest=dest, metavar="A,B", help=help_text)
    elif kind is bool:
        group.add_argument(flag, dest=dest, action="store_const", const=True, help=help_text)
    else:
        metavar = {str: "DSN", SECONDS: "TIME"}.get(kind, "N")
        group.add_argument(flag, dest=dest, type=kind, metavar=metavar, help=help_text)
    _FLAGS[dest] = (experiment, field)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the lab's arguments to `parser` (the `lab` subcommand)."""
    parser.add_argument(
        "experiment", nargs="?", default="all", choices=[*EXPERIMENTS, "all"],
        help="which experiment (default: all, about five minutes)",
    )  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="short version (for tests)")
    parser.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG (one experiment)")
    parser.add_argument(
        "--report", metavar="PATH",
        help=f"a Markdown report with tables and PNGs beside it (all: {DEFAULT_REPORT})",
    )  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    parser.add_argument(
        "--sim", action="store_true",
        help="slow-server: simulate it (deadlines.sim) with the same flags, no processes",
    )  # fmt: skip
    _FLAGS.clear()
    g = parser.add_argument_group("defaults")
    _flag(g, "defaults", "cap", SECONDS, "seconds a case may run before '> cap' (15)")
    _flag(g, "defaults", "limit", SECONDS, "the common options' timeout, s (2)")
    _flag(g, "defaults", "interval", SECONDS, "trickle servers: seconds per byte (1)")
    _flag(g, "defaults", "long", bool, "let blackholed connects run until the kernel gives up"
          " (~2 min more)")  # fmt: skip
    g = parser.add_argument_group("cascade")
    _flag(g, "cascade", "duration", SECONDS, "seconds of load (10)")
    _flag(g, "cascade", "home_rate", float, "/home requests per second (50)")
    _flag(g, "cascade", "checkout_rate", float, "/checkout requests per second (10)")
    _flag(g, "cascade", "pool_size", int, "connections per pool (20)")
    _flag(g, "cascade", "recs_timeout", SECONDS, "timeout/deadlines: limit on recs, s (0.3)")
    _flag(g, "cascade", "checkout_timeout", SECONDS, "what the client gives /checkout, s (5)")
    _flag(g, "cascade", "home_deadline", SECONDS, "deadlines: /home's route deadline, s (1)")
    g = parser.add_argument_group("cascade, chain and overload")
    _flag(g, "*", "variants", tuple, "cascade: no_timeout,timeout,bulkhead,deadlines; "
          "chain: fixed,propagated; overload: switches joined by + (see the docs)")  # fmt: skip
    g = parser.add_argument_group("chain")
    _flag(g, "chain", "user_wait", SECONDS, "how long the user waits, s (2)")
    _flag(g, "chain", "a_work", SECONDS, "A's own work, s (0.2)")
    _flag(g, "chain", "b_work", SECONDS, "B's own work, s (0.3)")
    _flag(g, "chain", "c_work", SECONDS, "C's work before its commit, s (3)")
    _flag(g, "chain", "ab_timeout", SECONDS, "fixed: A's timeout on B, s (1.8)")
    _flag(g, "chain", "bc_timeout", SECONDS, "fixed: B's timeout on C, s (2)")
    _flag(g, "chain", "reserve", SECONDS, "propagated: reserve per hop, s (0.05)")
    _flag(g, "chain", "dsn", str, "commit into Postgres at this DSN (default: SQLite)")
    g = parser.add_argument_group("slow-server")
    _flag(g, "slow-server", "servers", int, "backend processes (3)")
    _flag(g, "slow-server", "rate", float, "requests per second (90)")
    _flag(g, "slow-server", "run_for", SECONDS, "seconds of load per policy (7)")
    _flag(g, "slow-server", "slow_factor", float, "how much slower one backend gets (5)")
    _flag(g, "slow-server", "slow_at", SECONDS, "when it gets slower, s (1)")
    _flag(g, "slow-server", "request_deadline", SECONDS, "deadlines policy: budget, s (1)")
    _flag(g, "slow-server", "client_timeout", SECONDS, "other policies: client gives up, s (3)")
    _flag(g, "slow-server", "policies", tuple, "round_robin,least_outstanding,...")
    g = parser.add_argument_group("slow-server and overload")
    _flag(g, "*", "service_ms", float, "one request's work: slow-server on a backend (20),"
          " overload CPU on the service (40), ms")  # fmt: skip
    g = parser.add_argument_group("overload")
    _flag(g, "overload", "loads", tuple, "load levels, multiples of C (0.5,1,2,4,8)")
    _flag(g, "overload", "level_for", SECONDS, "seconds at each level (4)")
    _flag(g, "overload", "after_load", float, "load after the spike, × C (0.5)")
    _flag(g, "overload", "recover_for", SECONDS, "seconds after the spike (6)")
    _flag(g, "overload", "deadline", SECONDS, "each user request's deadline, s (1)")
    _flag(g, "overload", "retries", int, "retries after a failure, with retries (3)")
    _flag(g, "overload", "retry_percent", float, "budget: retries as a share of calls (0.2)")
    _flag(g, "overload", "codel_target", SECONDS, "codel: queue delay target, s (0.1)")
    _flag(g, "overload", "codel_interval", SECONDS, "codel: interval, s (0.5)")
    _flag(g, "overload", "rejection_budget", float, "admission: most refused, share (0.2)")
    _flag(g, "overload", "calibrate_for", SECONDS, "seconds measuring C (1.5)")


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
        raise UsageError(f"{name}: {exc}") from None


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


@dataclasses.dataclass(frozen=True)
class _Run:
    """What a checked command line will do."""

    names: list[str]
    params: dict[str, Any]
    simulated: bool
    report: Path | None
    expected: float


def _prepare(args: argparse.Namespace) -> _Run:
    """Check every flag, module, output path and database first; raises `UsageError`."""
    every = args.experiment == "all"
    names = list(EXPERIMENTS) if every else [args.experiment]
    simulated = bool(getattr(args, "sim", False))
    if simulated and args.experiment not in SIMULATED:
        raise UsageError(
            f"{args.experiment}: --sim is for {', '.join(SIMULATED)} only "
            "(the cascade and chain have scenarios: deadlines sim examples/sim/...)"
        )
    if every and args.plot:
        raise UsageError(
            "--plot is for one experiment; all of them write one PNG each beside --report"
        )
    given = args.report if args.report is not None else (DEFAULT_REPORT if every else None)
    report = None if given is None else Path(given)
    wanted = set() if simulated else {m for n in names for m in REQUIRES[n]}
    if args.plot or report is not None:
        wanted.add("matplotlib")
    absent = missing_modules(tuple(sorted(wanted)))
    if absent:
        raise UsageError(f"needs {', '.join(absent)} (not installed): pip install 'deadlines[lab]'")
    params = {name: params_for(name, args) for name in names}
    for name in ("slow-server", "overload"):
        if name in params and not simulated:
            try:
                experiment(name).check_processes(params[name])
            except ValueError as exc:
                raise UsageError(f"{name}: {exc}") from None
    _check_outputs(args, names, report, every)
    expected = sum(_expected_seconds(n, p, simulated) for n, p in params.items())
    if expected > LONGEST_RUN:
        from deadlines.sim.run import human_seconds

        raise UsageError(
            f"this run would take about {human_seconds(expected)}; the lab runs at most an"
            " hour (deadlines sim is the tool for long runs)"
        )
    if "chain" in params and params["chain"].dsn:
        _check_dsn(params["chain"].dsn)
    return _Run(names, params, simulated, report, expected)


def _check_outputs(
    args: argparse.Namespace, names: list[str], report: Path | None, every: bool
) -> None:
    if args.json:
        output_file(args.json, "--json")
    if args.plot:
        output_file(args.plot, "--plot")
    if report is not None:
        output_file(report, "--report")
        for name in names:
            output_file(report.parent / f"{name}.png", "--report")
        if every and not args.json:
            output_file(report.parent / "results.json", "--report")


def _expected_seconds(name: str, params: Any, simulated: bool) -> float:
    if simulated:
        from deadlines.sim.run import SPEED

        return float(params.rate * params.run_for * len(params.policies)) / SPEED
    return float(experiment(name).expected_seconds(params))


def _check_dsn(dsn: str) -> None:
    if missing_modules(("psycopg",)):
        raise UsageError("--dsn needs psycopg: pip install 'deadlines[psycopg]'")
    from .chain import probe

    try:
        probe(dsn)
    except ValueError as exc:
        raise UsageError(f"chain: {exc}") from None


def run(args: argparse.Namespace) -> int:
    """Run the chosen experiment(s); returns the exit code."""
    plan = _prepare(args)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    progress = Progress(quiet=args.quiet)
    try:
        if args.experiment == "all":
            return _run_all(plan, args, progress)
        return _run_one(plan, args, progress)
    except KeyboardInterrupt:
        print("deadlines lab: interrupted; every server it started was stopped", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def _measure(name: str, plan: _Run, progress: Progress) -> dict[str, Any]:
    params = plan.params[name]
    if plan.simulated:
        with progress.step(f"{name} (simulated)", max(1.0, plan.expected)):
            return simulate(name, params)
    result: dict[str, Any] = experiment(name).run(params, progress)
    return result


def _section(
    name: str, result: dict[str, Any], folder: Path | None
) -> tuple[str, str, list[Any], list[Path]]:
    """Print the experiment's tables; its report section (PNG drawn into `folder`).

    The report also has the experiment's detailed tables (`details`), too wide for a
    terminal.
    """
    module = experiment(name)
    tables = module.tables(result)
    for table in tables:
        print(table.text())
        print()
    details = module.details(result) if hasattr(module, "details") else []
    pictures = [] if folder is None else [module.plot(result, folder / f"{name}.png")]
    heading, text = _SECTIONS[name]
    return heading, text, [*tables, *details], pictures


def _intro(args: argparse.Namespace, took: float) -> str:
    flags = " --quick" if args.quick else ""
    return (
        f"Measured by `deadlines lab{flags}` in {took:.0f} s with real processes on loopback"
        f" (Python {sys.version.split()[0]}). Each section reproduces a measured table of"
        " the reference chapter."
    )


def _run_one(plan: _Run, args: argparse.Namespace, progress: Progress) -> int:
    from . import report

    [name] = plan.names
    started = time.monotonic()
    result = _measure(name, plan, progress)
    folder = None if plan.report is None else plan.report.parent
    section = _section(name, result, folder)
    if args.json:
        data = result["rows"] if name == "defaults" else result
        print(f"JSON: {report.write_json(args.json, data)}")
    if args.plot:
        print(f"PNG: {experiment(name).plot(result, args.plot)}")
    if plan.report is not None:
        took = time.monotonic() - started
        path = report.markdown_report(
            plan.report, title="deadlines lab report", intro=_intro(args, took), sections=[section]
        )
        print(f"Report: {path}")
    return 0


def _run_all(plan: _Run, args: argparse.Namespace, progress: Progress) -> int:
    from . import report

    assert plan.report is not None
    progress.note(f"running {', '.join(plan.names)}: about {plan.expected:.0f} s")
    started = time.monotonic()
    folder = plan.report.parent
    results: dict[str, Any] = {}
    sections = []
    for name in plan.names:
        results[name] = _measure(name, plan, progress)
        sections.append(_section(name, results[name], folder))
    took = time.monotonic() - started
    path = report.markdown_report(
        plan.report, title="deadlines lab report", intro=_intro(args, took), sections=sections
    )
    json_path = Path(args.json) if args.json else folder / "results.json"
    report.write_json(json_path, results)
    print(f"JSON: {json_path}")
    print(f"Report: {path}")
    return 0
