"""Metrics on vs off: what the exporters add to each outbound call, side by side in one run.

    python benchmarks/metrics_overhead.py [--quick] [--json PATH]

A = the call with nobody subscribed to the event stream; B = the same call with
exporters installed (`deadlines.prometheus`, `deadlines.otel` with the SDK, and
`deadlines.logs`). A and B alternate in one run (benchmarks/harness.py), so machine noise
hits both. Two kinds of call:

* the event path alone: ``with CallBudget(dep): pass`` under a deadline, the cheapest
  possible call, so the ratio is the worst case and the difference is the exporters'
  absolute cost per call in microseconds;
* a real `deadlines.httpx` GET to a keep-alive server on loopback (when that module is
  present), where the goal is a ratio of at most 1.05 for each metrics backend
  (Prometheus, OTel); both at once with the timeout log ("all three") is a report,
  not a goal. Each of these rows comes with an A/A control: the call with no
  exporter run a second time in the same rotation, whose distance from 1.00 is what
  the run cannot resolve.

Samples are mean microseconds of CPU time per call of this process (the client and the
exporters; the loopback server runs in a process of its own) over a batch of calls.
CPU time, not wall time, because the exporters' cost is CPU work and because wall time
swings by a factor of three when other processes load the machine. The real calls' ratio
is the median of B/A over neighbouring batches (A and B alternate batch by batch), with
its interquartile range, as in `run.py`'s suites; the steadiness of the machine
(`harness.steadiness`) is printed before and after.

`deadlines.otel` holds an outbound call's metrics back and applies them in bulk (every
64 queued items, and at every collection). Each setup yields a `settle` function that
does what the next collection would do first; it runs before each timed batch and
inside it, at its end, so every record a batch makes is paid for within that batch.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from harness import (
    Comparison,
    Summary,
    alternate,
    steadiness,
    steadiness_line,
    table,
    turns,
    verdict_ratio,
)

import deadlines
from deadlines import CallBudget, Dependency

DEP = Dependency("bench", total=10)


def _nothing() -> None:
    """Nothing is held back: nothing to settle."""


Settle = Callable[[], None]


@contextlib.contextmanager
def _prometheus() -> Iterator[Settle]:
    from prometheus_client import CollectorRegistry

    from deadlines import prometheus

    with prometheus.install(CollectorRegistry()):
        yield _nothing


@contextlib.contextmanager
def _otel(*, traced: bool = False, exemplars: bool = True) -> Iterator[Settle]:
    from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter, MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from deadlines import otel

    # None: the SDK's default filter, which samples measurements made in a sampled span.
    exemplar_filter = None if exemplars else AlwaysOffExemplarFilter()
    meters = MeterProvider(metric_readers=[InMemoryMetricReader()], exemplar_filter=exemplar_filter)
    tracers = TracerProvider()
    spans = InMemorySpanExporter()
    tracers.add_span_processor(BatchSpanProcessor(spans))  # as in production
    try:
        with otel.install(meters, tracers) as telemetry:
            settle = telemetry._recorder.flush  # what a collection does first
            if traced:
                with tracers.get_tracer("bench").start_as_current_span("hop"):
                    yield settle
            else:
                yield settle
    finally:
        spans.clear()
        meters.shutdown()
        tracers.shutdown()


@contextlib.contextmanager
def _logs() -> Iterator[Settle]:
    from deadlines import logs

    with logs.install():
        yield _nothing


@contextlib.contextmanager
def _all() -> Iterator[Settle]:
    with _prometheus(), _otel() as settle, _logs():
        yield settle


@contextlib.contextmanager
def _off() -> Iterator[Settle]:
    yield _nothing


Setup = Callable[[], contextlib.AbstractContextManager[Settle]]

_SERVER = """
import sys
from deadlines.lab.servers import HealthyServer
with HealthyServer() as server:
    print(server.url, flush=True)
    sys.stdin.read()  # until the benchmark closes our stdin
"""


@contextlib.contextmanager
def _server_process() -> Iterator[str]:
    """The lab's HealthyServer in its own process, so our CPU time is the client's alone."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.close()
        proc.wait(timeout=10)
        proc.stdout.close()


# The goal (metrics on vs off, at most 1.05x) is judged per metrics backend, as a service
# installs one; "all three" (both backends and the timeout log at once) is reported.
GOALS = ("prometheus", "otel")

WARM = 20  # untimed calls after each install: first-use costs (children, storage) are not per call


def _event_side(setup: Setup, batches: int, calls: int) -> list[float]:
    """Mean CPU µs per `with CallBudget(dep): pass` under a deadline, one figure per batch."""

    def one() -> None:
        with CallBudget(DEP):
            pass

    with setup() as settle, deadlines.scope(3600):
        for _ in range(WARM):
            one()
        settle()
        figures = []
        for _ in range(batches):
            start = time.process_time()
            for _ in range(calls):
                one()
            settle()
            figures.append((time.process_time() - start) / calls * 1e6)
        return figures


def event_path(name: str, setup: Setup, *, rounds: int, batches: int, calls: int) -> Comparison:
    """The event path alone: nobody listening (A) vs `setup`'s exporters (B)."""
    _event_side(setup, 1, calls)  # warm up imports and caches
    a, b = alternate(
        rounds,
        lambda: _event_side(_off, batches, calls),
        lambda: _event_side(setup, batches, calls),
    )
    return Comparison(
        name=f"event path: {name}",
        metric="CPU µs per call",
        a_label="CallBudget, no exporter",
        b_label=f"CallBudget + {name}",
        a=Summary.of(a),
        b=Summary.of(b),
        goal="report (B - A µs)",
        notes={"paired_ratio_p50": _paired(a, b)},
    )


def httpx_calls(
    name: str, setup: Setup, *, rounds: int, batches: int, calls: int
) -> list[Comparison]:
    """Real deadlines.httpx GETs on loopback: no exporter (A) vs `setup`'s (B).

    A third side runs the calls with no exporter again (A'), in the same rotation: the
    A/A row's distance from 1.00 is what this run cannot resolve. Empty when
    `deadlines.httpx` cannot be imported.
    """
    try:
        import deadlines.httpx as dhttpx
        import deadlines.lab.servers  # the server process needs it
    except ImportError as exc:
        print(f"[bench] skipping httpx calls: {exc}", file=sys.stderr)
        return []

    async def main() -> list[list[float]]:
        with _server_process() as url:
            async with dhttpx.AsyncClient(DEP, base_url=url) as client:

                async def one() -> None:
                    (await client.get("/")).raise_for_status()

                async def side(which: Setup) -> list[float]:
                    with which() as settle, deadlines.scope(3600):
                        for _ in range(WARM):
                            await one()
                        settle()
                        figures = []
                        for _ in range(batches):
                            start = time.process_time()
                            for _ in range(calls):
                                await one()
                            settle()
                            figures.append((time.process_time() - start) / calls * 1e6)
                        return figures

                await side(setup)  # warm up: connections, imports, caches
                setups = [_off, setup, _off]
                seen: list[list[float]] = [[], [], []]
                for k in turns(rounds, 3):
                    seen[k] += await side(setups[k])
                return seen

    a, b, twin = asyncio.run(main())
    row = Comparison(
        name=f"httpx GET on loopback: {name}",
        metric="CPU µs per call",
        a_label="deadlines.httpx, no exporter",
        b_label=f"deadlines.httpx + {name}",
        a=Summary.of(a),
        b=Summary.of(b),
        goal="ratio <= 1.05",
        # The ratio is the median over neighbouring batches, as in the other suites: the
        # machine's drift between a batch and the next is far smaller than across a row.
        rounds=_pairs(a, b),
    )
    control = Comparison(
        name=f"httpx GET on loopback: A/A ({name} run)",
        metric="CPU µs per call",
        a_label="deadlines.httpx, no exporter",
        b_label="the same, again",
        a=Summary.of(a),
        b=Summary.of(twin),
        goal="report",
        rounds=_pairs(a, twin),
    )
    if name in GOALS:
        verdict_ratio(row, at_most=1.05)
    else:
        row.goal = "report"
    return [row, control]


def _pairs(a: list[float], b: list[float]) -> list[float]:
    """B/A of neighbouring batches: slow drift of the machine cancels out."""
    return [y / x for x, y in zip(a, b, strict=True) if x > 0]


def _paired(a: list[float], b: list[float]) -> float:
    """Median of `_pairs`."""
    return statistics.median(_pairs(a, b))


def run(quick: bool) -> list[Comparison]:
    """Every comparison; `quick` makes it a smoke test of a few seconds."""
    rounds, batches, calls = (2, 2, 200) if quick else (10, 4, 1000)
    rows = [
        event_path("prometheus", _prometheus, rounds=rounds, batches=batches, calls=calls),
        event_path("otel", _otel, rounds=rounds, batches=batches, calls=calls),
        event_path(
            "otel, in a span",
            lambda: _otel(traced=True),
            rounds=rounds,
            batches=batches,
            calls=calls,
        ),
        event_path(
            "otel, in a span, no exemplars",
            lambda: _otel(traced=True, exemplars=False),
            rounds=rounds,
            batches=batches,
            calls=calls,
        ),
        event_path("logs", _logs, rounds=rounds, batches=batches, calls=calls),
        event_path("all three", _all, rounds=rounds, batches=batches, calls=calls),
    ]
    # Many small batches: the median shrugs off the load spikes of a shared machine.
    http_rounds, http_batches, http_calls = (2, 1, 20) if quick else (100, 1, 40)
    added = {r.name.removeprefix("event path: "): r.b.p50 - r.a.p50 for r in rows}
    for name, setup in [("prometheus", _prometheus), ("otel", _otel), ("all three", _all)]:
        found = httpx_calls(name, setup, rounds=http_rounds, batches=http_batches, calls=http_calls)
        if not found:
            break
        row = found[0]
        # The exporters' exact cost (the event path) over the call's: the same ratio
        # without the call's own noise, which is larger than what is measured.
        row.notes["event_path_ratio"] = 1 + added[name] / row.a.p50
        rows += found
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run, print the table and the added microseconds per call."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few repetitions (smoke test)")
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    args = parser.parse_args(argv)
    before = steadiness()
    rows = run(args.quick)
    after = steadiness()
    print(table(rows))
    print()
    print(steadiness_line(before, after))
    for r in rows:
        if r.rounds:  # the ratio is already the median over neighbouring batches
            low, high = r.ratio_spread
            how = f"ratio {r.ratio:.3f}, IQR {low:.3f}-{high:.3f}"
        else:
            how = f"ratio {r.ratio:.3f}, paired batches {r.notes['paired_ratio_p50']:.3f}"
        derived = r.notes.get("event_path_ratio")
        tail = "" if derived is None else f", event path over this call {derived:.3f}"
        print(f"{r.name:<34} adds {r.b.p50 - r.a.p50:7.2f} CPU µs per call ({how}{tail})")
    if args.json:
        payload = {
            "quick": args.quick,
            "steadiness": {"before": before, "after": after},
            "rows": [r.to_json() for r in rows],
        }
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
