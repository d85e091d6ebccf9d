"""`deadlines sim SCENARIO.toml`: run a scenario, print a table, write JSON and a PNG.

Everything is checked before the run starts: the scenario, the output paths, matplotlib
for `--plot`, and the run's estimated time (over an hour is refused without `--force`).
A run that lasts more than 2 s shows its progress on stderr.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TextIO

from .._cli import UsageError, missing_modules, output_file
from .._extras import missing
from .._tools import durations
from .run import RunTooLong, run_scenario
from .scenario import ScenarioError

HELP = "simulate a scenario (TOML): cascades, chains, slow servers, in hours of traffic"

#: Runs estimated to take longer than this are refused unless --force is given.
LONGEST_RUN = 3600.0


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
        "--duration", type=durations.flag, metavar="TIME", help='send load this long, e.g. "2s"'
    )
    parser.add_argument(
        "--drain", type=durations.flag, metavar="TIME", help="keep running this long after the load"
    )
    parser.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    parser.add_argument("--plot", metavar="PATH", help="write a PNG (needs matplotlib)")
    parser.add_argument("--quiet", action="store_true", help="print no table and no progress")
    parser.add_argument(
        "--force", action="store_true", help="run even if it is estimated to take over an hour"
    )


class Progress:
    """Shows how far a run is, once it has lasted `after` seconds; on stderr."""

    def __init__(self, stream: TextIO, *, after: float = 2.0) -> None:
        """Write to `stream`: redrawn on a terminal, a line every 5 s elsewhere."""
        self.stream = stream
        self.after = after
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.started = time.monotonic()
        self.shown = 0.0

    def __call__(self, variant: str, done: float) -> None:
        """Report that `done` (0 to 1) of the run is finished, now in `variant`."""
        now = time.monotonic()
        elapsed = now - self.started
        if elapsed < self.after or now - self.shown < (0.5 if self.tty else 5.0):
            return
        self.shown = now
        left = elapsed * (1.0 - done) / done if done > 0 else float("inf")
        text = f"[sim] {variant}: {done:.0%} done, {elapsed:.0f} s, about {left:.0f} s left"
        if self.tty:
            self.stream.write(f"\r\033[K{text}")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def finish(self) -> None:
        """End the display with the total time, if anything was shown."""
        if self.shown:
            end = "\r\033[K" if self.tty else ""
            took = time.monotonic() - self.started
            self.stream.write(f"{end}[sim] done in {took:.1f} s\n")
            self.stream.flush()


def run(args: argparse.Namespace) -> int:
    """Run the simulation the arguments describe; 0 on success, 2 on bad input."""
    if args.json:
        output_file(args.json, "--json")
    if args.plot:
        output_file(args.plot, "--plot")
        if missing_modules(("matplotlib",)):
            raise UsageError(str(missing("--plot", "matplotlib", "sim")))
    progress = None if args.quiet else Progress(sys.stderr)
    try:
        result = run_scenario(
            args.scenario,
            seed=args.seed,
            variants=args.variant,
            duration=args.duration,
            drain=args.drain,
            max_seconds=None if args.force else LONGEST_RUN,
            progress=progress,
        )
    except RunTooLong as exc:
        raise UsageError(f"{exc}, or pass --force to run it anyway") from None
    except (ScenarioError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    if progress is not None:
        progress.finish()
    if not args.quiet:
        print(result.table())
    if args.json:
        print(f"wrote {result.write_json(args.json)}")
    if args.plot:
        print(f"wrote {result.plot(args.plot)}")
    return 0
