"""`inbound.py --paired`: two servers under load at once, each one's figures its own."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from statistics import median

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from harness import HERE, Child

# Loaded under another name: "inbound" is also the test package tests/inbound.
_spec = importlib.util.spec_from_file_location("benchmarks_inbound", HERE / "inbound.py")
assert _spec is not None and _spec.loader is not None
inbound = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)  # for dataclasses
_spec.loader.exec_module(inbound)


def test_a_paired_round_keeps_each_servers_figures_apart() -> None:
    """A bare asyncio server beside a Starlette app, either connected first: the bare
    one answers several times as many requests in the same instants, sooner, and each
    server's CPU per request is its own."""
    timing = inbound._Timing(rounds=1, epochs=1, seconds=0.6, warmup=0.1, paired=True)
    with (
        Child("servers.py", "fast") as fast,
        Child("servers.py", "starlette") as app,
        Child("loadgen.py") as loadgen,
    ):
        for flip in (False, True):
            quick, slow = inbound._paired_round(loadgen, fast, app, timing, "/", flip=flip)
            assert slow.rps > 0
            assert quick.rps > 3 * slow.rps, (flip, quick.rps, slow.rps)
            assert quick.cpu_us < slow.cpu_us, (flip, quick.cpu_us, slow.cpu_us)
            assert median(quick.latencies_ms) < median(slow.latencies_ms), flip
