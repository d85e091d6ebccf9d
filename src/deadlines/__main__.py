"""The `deadlines` command line: `deadlines --help`, `python -m deadlines --help`.

Each subcommand lives in its own module and registers itself in `_COMMANDS`; the
module is imported only when its subcommand runs, so `deadlines --help` loads the core
and the CLI only, stays fast and needs no optional dependency. Every subcommand follows
one set of rules for exit codes and errors (`deadlines._cli`, docs/cli.md).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Sequence
from typing import NoReturn

from . import __version__, _cli

#: subcommand -> (module with `add_arguments(parser)` and `run(args) -> int`, help)
_COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("deadlines.plan.cli", "Propose timeouts from measured latency; check a call tree."),
    "audit": ("deadlines.audit.cli", "Find unbounded waits in Python code (static check)."),
    "sim": ("deadlines.sim.cli", "Simulate a scenario (TOML): cascades, chains, slow servers."),
    "pg-audit": ("deadlines.audit.pg_cli", "Report Postgres settings that run with no time limit."),
    "lab": ("deadlines.lab.cli", "Reproduce the chapter's measured failures with real processes."),
}


class _Parser(argparse.ArgumentParser):
    """argparse, with its usage errors in one line (the rules of docs/cli.md)."""

    def error(self, message: str) -> NoReturn:
        """Print ``PROG: MESSAGE (see PROG --help)`` on stderr and exit 2."""
        self.exit(_cli.USAGE, f"{self.prog}: {message} (see '{self.prog} --help')\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser; only `command`'s module is imported, to add its arguments."""
    parser = _Parser(
        prog="deadlines",
        description="One time budget for every hop: lab, simulator, planner and audit.",
    )
    parser.add_argument("--version", action="version", version=f"deadlines {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in _COMMANDS.items():
        subparser = sub.add_parser(name, help=help_text, description=help_text)
        if name == command:
            importlib.import_module(module_name).add_arguments(subparser)
    return parser


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand `argv` names: its first word that is not an option."""
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the process exit code."""
    words = sys.argv[1:] if argv is None else argv
    parser = build_parser(_command(words))
    args = parser.parse_args(words)
    if args.command is None:
        parser.print_help()
        return 0
    module = importlib.import_module(_COMMANDS[args.command][0])
    try:
        result: int = module.run(args)
    except _cli.UsageError as exc:
        print(f"deadlines {args.command}: {exc}", file=sys.stderr)
        return _cli.USAGE
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, as a process killed by SIGPIPE.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return _cli.PIPE_CLOSED
    except Exception:
        # A crash must not look like a finding (exit 1) or like bad input (exit 2).
        traceback.print_exc()
        print(
            f"deadlines {args.command}: internal error (a bug in deadlines {__version__}):"
            " please report it with the traceback above",
            file=sys.stderr,
        )
        return _cli.BUG
    return result


if __name__ == "__main__":
    sys.exit(main())
