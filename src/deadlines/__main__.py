"""The `deadlines` command line: `deadlines --help`, `python -m deadlines --help`.

Each subcommand lives in its own module and registers itself in `_COMMANDS`; the
module is imported only when its subcommand runs, so `deadlines --help` stays fast
and needs no optional dependency.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from . import __version__

#: subcommand -> (module with `add_arguments(parser)` and `run(args) -> int`, help)
_COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("deadlines.plan.cli", "Propose timeouts from measured latency; check a call tree."),
    "audit": ("deadlines.audit.cli", "Find unbounded waits in Python code (static check)."),
    "sim": ("deadlines.sim.cli", "Simulate a scenario (TOML): cascades, chains, slow servers."),
    "pg-audit": ("deadlines.postgres", "Report Postgres settings that run with no time limit."),
    "lab": ("deadlines.lab.cli", "Reproduce the chapter's measured failures with real processes."),
}


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every registered subcommand."""
    parser = argparse.ArgumentParser(
        prog="deadlines",
        description="One time budget for every hop: lab, simulator, planner and audit.",
    )
    parser.add_argument("--version", action="version", version=f"deadlines {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in _COMMANDS.items():
        module = importlib.import_module(module_name)
        module.add_arguments(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    module = importlib.import_module(_COMMANDS[args.command][0])
    result: int = module.run(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
