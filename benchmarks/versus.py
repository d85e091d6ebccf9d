"""The inbound middleware from two source trees, loaded together: did a change move the clock?

    git worktree add /tmp/before HEAD                  # the tree to compare against
    python benchmarks/versus.py /tmp/before/src src    # 40 paired rounds, ~3 minutes
    python benchmarks/versus.py /tmp/before/src src --fastapi --rounds 64 --json out.json

Both servers run the benchmark's app with `DeadlineMiddleware` (the one-route Starlette
app; with ``--fastapi`` the FastAPI JSON route), A importing `deadlines` from the first
tree and B from the second (``PYTHONPATH``). Each round loads both at once on one shared
core (`inbound._paired_round`), so that a change worth a few tenths of a per cent of the
request can be read: the A/A pair's per-round IQR is ±0.5-1 %. Ratios are B over A:
throughput above 1.00 means the second tree serves more. Each server says which
`deadlines` it imported, and the run stops if that is not the tree it was given.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from pathlib import Path

from harness import Child, Comparison, steadiness, steadiness_line, table

from inbound import FASTAPI_PATH, WARMUP, _paired_epochs, _reports, _rows, _Timing


class _TreeServer(Child):
    """``servers.py KIND --deadlines``, importing `deadlines` from the tree `src`."""

    def __init__(self, src: Path, kind: str) -> None:
        paths = [str(src), *filter(None, [os.environ.get("PYTHONPATH")])]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
        super().__init__("servers.py", kind, "--deadlines", env=env)
        self.src = src

    def __enter__(self) -> _TreeServer:
        super().__enter__()
        where = Path(self.info.get("deadlines") or "").resolve()
        if self.src not in where.parents:
            self.stop()
            raise RuntimeError(f"the server imported deadlines from {where}, not from {self.src}")
        return self


def run(before: Path, after: Path, timing: _Timing, *, fastapi: bool) -> list[Comparison]:
    """A's rounds and B's, paired; the throughput, latency, p99 and CPU rows (B over A)."""
    kind, path = ("fastapi", FASTAPI_PATH) if fastapi else ("starlette", "/")
    servers = (
        functools.partial(_TreeServer, before, kind),
        functools.partial(_TreeServer, after, kind),
    )
    [(a, b)] = _paired_epochs([servers], timing, path)
    labels = (f"{kind} + DeadlineMiddleware from {before}", f"the same from {after}")
    return _reports(_rows(a, b, labels, "versus"))  # a change is read, not judged


def _tree(parser: argparse.ArgumentParser, value: str) -> Path:
    """A directory holding the `deadlines` package, resolved; else a usage error."""
    src = Path(value).resolve()
    if not (src / "deadlines" / "__init__.py").is_file():
        parser.error(f"{value} holds no deadlines package (give the tree's src directory)")
    return src


def main() -> int:
    """Parse the arguments, run the paired rounds, print the table (and write JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before", help="src directory of the tree to compare against (A)")
    parser.add_argument("after", help="src directory of the changed tree (B)")
    parser.add_argument("--rounds", type=int, default=40, help="paired rounds")
    parser.add_argument("--epochs", type=int, default=4, help="fresh servers this many times")
    parser.add_argument("--seconds", type=float, default=2.0, help="length of each round")
    parser.add_argument("--fastapi", action="store_true", help="the FastAPI JSON route")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    args = parser.parse_args()
    before, after = _tree(parser, args.before), _tree(parser, args.after)
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (a ratio's spread needs two)")
    if not 1 <= args.epochs <= args.rounds:
        parser.error("--epochs must be between 1 and --rounds")
    if args.seconds <= 0:
        parser.error("--seconds must be > 0")
    timing = _Timing(args.rounds, args.epochs, args.seconds, WARMUP, paired=True)
    first = steadiness()
    rows = run(before, after, timing, fastapi=args.fastapi)
    print(f"{args.rounds} paired rounds in {args.epochs} epochs; ", end="")
    print(steadiness_line(first, steadiness()))
    print(table(rows))
    if args.json:
        payload = {
            "before": str(before),
            "after": str(after),
            "rounds": args.rounds,
            "rows": [row.to_json() for row in rows],
        }
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
