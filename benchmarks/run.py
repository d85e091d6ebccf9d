"""Benchmarks: what deadlines costs and how precisely it fires, side by side.

    python benchmarks/run.py [--quick] [--json PATH] [--only NAME ...]

Each comparison alternates A (the bare library) and B (through deadlines) in one run,
so machine noise hits both; the table reports medians (p50), p99, spread (IQR) and the
B/A ratio. Results depend on the machine: benchmarks/README.md records one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from harness import Comparison, table


def _suites(quick: bool) -> dict[str, Callable[[], list[Comparison]]]:
    import precision

    reps = 40 if quick else 200
    return {
        "precision": lambda: [precision.scope_vs_asyncio(reps)],
    }


def machine() -> dict[str, object]:
    """What the figures were measured on."""
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the selected suites and print (and optionally save) the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repetitions (smoke test)")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--only", nargs="*", help="run only these suites")
    args = parser.parse_args(argv)
    suites = _suites(args.quick)
    chosen = args.only or list(suites)
    unknown = sorted(set(chosen) - set(suites))
    if unknown:
        parser.error(f"unknown suite(s): {', '.join(unknown)}; known: {', '.join(suites)}")
    rows: list[Comparison] = []
    for name in chosen:
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        started = time.monotonic()
        rows += suites[name]()
        print(f"[bench] {name} done in {time.monotonic() - started:.1f} s", file=sys.stderr)
    print(table(rows))
    if args.json:
        payload = {"machine": machine(), "quick": args.quick, "rows": [r.to_json() for r in rows]}
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
