"""`deadlines sim SCENARIO.toml`: run a scenario, print a table, write JSON and a PNG."""

from __future__ import annotations

import argparse
import sys

from .run import run_scenario
from .scenario import ScenarioError, parse_duration

HELP = "simulate a scenario (TOML): cascades, chains, slow servers, in hours of traffic"


def _seconds(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the `sim` subcommand's options to `parser`."""
    parser.add_argument("scenario", metavar="SCENARIO.toml", help="the scenario file")
    parser.add_argument(
        "--variant",
        action="append",
        metavar="NAME",
        help="run only this variant (repeatable; default: all)",
    )
    parser.add_argument("--seed", type=int, help="random seed (default: the scenario's)")
    parser.add_argument(
        "--duration", type=_seconds, metavar="TIME", help='send load this long, e.g. "2s"'
    )
    parser.add_argument(
        "--drain", type=_seconds, metavar="TIME", help="keep running this long after the load"
    )
    parser.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG (needs matplotlib)")
    parser.add_argument("--quiet", action="store_true", help="print no table")


def run(args: argparse.Namespace) -> int:
    """Run the simulation the arguments describe; 0 on success, 2 on a bad scenario."""
    try:
        result = run_scenario(
            args.scenario,
            seed=args.seed,
            variants=args.variant,
            duration=args.duration,
            drain=args.drain,
        )
    except (ScenarioError, ValueError) as exc:
        print(f"deadlines sim: {exc}", file=sys.stderr)
        return 2
    if not args.quiet:
        print(result.table())
    if args.json:
        print(f"wrote {result.write_json(args.json)}")
    if args.plot:
        try:
            print(f"wrote {result.plot(args.plot)}")
        except ImportError as exc:
            print(f"deadlines sim: {exc}", file=sys.stderr)
            return 1
    return 0
