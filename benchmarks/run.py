"""Benchmarks: what deadlines costs and how precisely it fires, side by side.

    python benchmarks/run.py [--quick] [--json PATH] [--only NAME ...]

Suites (run in this order; ``--only`` picks some):

* ``outbound``  bare httpx / aiohttp vs `deadlines.httpx` / `deadlines.aiohttp`:
  latency and CPU per small GET, sequential and 64 at once (goal: ratio <= 1.10);
* ``inbound``   Starlette under uvicorn, bare vs `DeadlineMiddleware`, under load from a
  separate load-generator process (goal: latency ratio <= 1.05, throughput >= 0.95);
* ``precision`` how late a 50 ms limit fires: `deadlines` vs asyncio / httpx / aiohttp
  against a silent server (goal: p99 <= 5 ms);
* ``cascade``   the lab's cascade, `deadlines` variant, at 10x the chapter's rate:
  requests in flight against Little's Law bound, and the API's memory;
* ``memory``    KiB held per call hung on a silent server, bare vs `deadlines`.

Each comparison alternates A (bare) and B (through deadlines) in one run, so machine
noise hits both; the table gives medians (p50), p99, the B/A ratio (median of the
per-round ratios) and its interquartile range. Servers and load generators run in
their own processes. Results depend on the machine: benchmarks/README.md records one
full run. ``--quick`` is a smoke test (about a minute) whose figures mean little.

Before and after the suites, `harness.steadiness` times a fixed piece of work on each
CPU: its spread (p90/p10) says whether the machine was quiet enough for ratios of a few
per cent to mean anything (the inbound suite's A/A row says the same from its side).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import Row, steadiness, steadiness_line, table

SUITES = ("outbound", "inbound", "precision", "cascade", "memory")
_PACKAGES = ("deadlines", "httpx", "httpcore", "aiohttp", "uvicorn", "starlette", "h11", "anyio")


def _suite(name: str) -> Callable[[bool], Sequence[Row]]:
    # Imported on demand: a suite's clients are loaded only when it runs.
    if name == "outbound":
        import outbound

        return outbound.run
    if name == "inbound":
        import inbound

        return inbound.run
    if name == "precision":
        import precision

        return precision.run
    if name == "cascade":
        import inflight

        return inflight.run
    import memory

    return memory.run


def machine() -> dict[str, object]:
    """What the figures were measured on."""
    versions: dict[str, str | None] = {}
    for package in _PACKAGES:
        try:
            versions[package] = version(package)
        except PackageNotFoundError:
            versions[package] = None
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "versions": versions,
        "when": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def main(argv: list[str] | None = None) -> int:
    """Run the selected suites and print (and optionally save) the table."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repetitions (smoke test)")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument("--only", nargs="*", choices=SUITES, help="run only these suites")
    args = parser.parse_args(argv)
    chosen = args.only or list(SUITES)
    info = machine()
    info["steadiness_before"] = before = steadiness()
    rows: list[Row] = []
    timings: dict[str, float] = {}
    for name in chosen:
        print(f"[bench] {name} ...", file=sys.stderr, flush=True)
        started = time.monotonic()
        rows += _suite(name)(args.quick)
        timings[name] = round(time.monotonic() - started, 1)
        print(f"[bench] {name} done in {timings[name]} s", file=sys.stderr, flush=True)
    info["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    info["steadiness_after"] = after = steadiness()
    print(
        f"{info['when']}: {info['cpus']} CPUs, Python {info['python']},"
        f" load average {info['load_average']} before, {info['load_average_after']} after"
        f"{' (quick: smoke test only)' if args.quick else ''}"
    )
    print(steadiness_line(before, after))
    print(table(rows))
    if args.json:
        payload = {
            "machine": info,
            "quick": args.quick,
            "seconds": timings,
            "rows": [r.to_json() for r in rows],
        }
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
