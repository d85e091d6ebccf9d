"""``deadlines plan CONFIG.toml``: propose timeouts for a route and check the configured ones.

Exit status: 0 when no rule is broken, 1 when there are violations, 2 when the input
is malformed (the message names the file, the line and what was expected). Values that
were accepted but look like a mistake are warned about on stderr.
"""

from __future__ import annotations

import argparse
import sys

from . import as_json, code, load, plan, table
from ._errors import PlanError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``deadlines plan``."""
    parser.add_argument("config", metavar="CONFIG.toml", help="the route's call tree and latencies")
    parser.add_argument(
        "--format",
        choices=("text", "code", "json"),
        default="text",
        help="text: table, findings and code (default); code: only the Dependency code; json",
    )


def run(args: argparse.Namespace) -> int:
    """Run the planner; returns the exit status."""
    try:
        route = load(args.config)
    except PlanError as exc:
        print(f"deadlines plan: {exc}", file=sys.stderr)
        return 2
    for warning in route.warnings:
        print(f"deadlines plan: {warning}", file=sys.stderr)
    result = plan(route)
    if args.format == "json":
        print(as_json(result))
    elif args.format == "code":
        print(code(result), end="")
    else:
        print(table(result))
        print()
        print(code(result), end="")
    return 1 if result.violations else 0
