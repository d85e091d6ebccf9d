"""Inbound overhead: a bare Starlette app against the same app with `DeadlineMiddleware`.

    python benchmarks/inbound.py [--rounds 64] [--epochs 4] [--json PATH]   # the goal rows only
    python benchmarks/inbound.py --references   # ... and yardsticks beside (`YARDSTICKS`)
    python benchmarks/inbound.py --paired       # ... each round loads both servers at once

Both apps run under uvicorn, each in its own process, started afresh for each epoch
(`--epochs`: a few sets of processes, so no one process's luck decides); the load generator
(benchmarks/loadgen.py, a third process) drives one of them at a time with N keep-alive
connections on loopback, alternating A and B round by round so machine drift hits both.
Per round: throughput, each request's latency, and the server's CPU time per request
(from /proc, the most stable of the three on a shared machine). With ``--paired`` each
round loads the bare server and the other together instead, sharing one core, so that
the host's noise falls on both in the same instants (`_paired_round`). Every request carries
``x-request-timeout-ms``, as a request from another `deadlines` hop would.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness import (
    Child,
    Comparison,
    Summary,
    cpu_seconds,
    steadiness,
    steadiness_line,
    table,
    turns,
    verdict_ratio,
)
from servers import REFERENCES  # Starlette's own middlewares, set beside ours in reports

CONNECTIONS = 32
WARMUP = 0.3  # seconds of load before each round's count starts


@dataclass
class Round:
    """What one server did in one round."""

    rps: float
    latencies_ms: list[float]
    cpu_us: float  # server CPU per request
    loadgen_cpu_share: float  # the generator's CPU seconds over the window


def _pin(loadgen: Child, server: Child) -> None:
    """The load generator on one core, the server on another, when there are two.

    Left to the scheduler, the two sometimes share a core for part of a round, which
    halves that round's throughput for reasons that have nothing to do with the server.
    """
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= 2:
        os.sched_setaffinity(loadgen.pid, {cores[0]})
        os.sched_setaffinity(server.pid, {cores[1]})


def _round(loadgen: Child, server: Child, seconds: float, warmup: float, path: str) -> Round:
    command = _command(seconds, warmup, path) | {"port": server.port, "connections": CONNECTIONS}
    _pin(loadgen, server)
    cpu = cpu_seconds(server.pid)
    answer = loadgen.ask(command, timeout=warmup + seconds + 30)
    return _seen(answer, cpu_seconds(server.pid) - cpu, seconds, warmup)


def _command(seconds: float, warmup: float, path: str) -> dict[str, Any]:
    """A load round for the generator, less the servers and connections."""
    headers = {"x-request-timeout-ms": "2000"}
    return {"warmup": warmup, "seconds": seconds, "path": path, "headers": headers}


def _seen(answer: dict[str, Any], used: float, seconds: float, warmup: float) -> Round:
    """One server's `Round` from the generator's figures and the CPU it `used`."""
    if answer["errors"] or not answer["requests"]:
        raise RuntimeError(f"load round failed: {answer['errors']} errors, {answer['requests']} ok")
    # The server's CPU covers the warm-up too: divide by everything it answered.
    answered = answer["requests"] * (warmup + seconds) / seconds
    return Round(
        rps=answer["requests"] / seconds,
        latencies_ms=[us / 1000 for us in answer["lat_us"]],
        cpu_us=used / answered * 1e6,
        loadgen_cpu_share=answer["cpu_s"] / seconds,
    )


def run(
    quick: bool,
    *,
    rounds: int | None = None,
    ablations: bool = True,
    epochs: int | None = None,
    references: bool = False,
    paired: bool = False,
) -> list[Comparison]:
    """Throughput, latency and server CPU, bare vs middleware, in alternating rounds.

    A second bare server is the control: its ratio to the first (A/A) shows how far
    this run can tell servers apart. `references` (implied by `ablations`) adds
    yardsticks, each alone on the same app: a middleware that only calls the app (what
    one more layer costs), the floor (a middleware that only sets a context variable
    and watches `send`), and two of Starlette's own middlewares (`REFERENCES`), what a
    common middleware costs on this app. With `ablations`, also: the middleware with
    its caller-left watcher held off (``watch_after=60``: every request arms its timer
    on entry), to show what the watcher and the deferred timer save or cost under load;
    and bare vs middleware on uvloop and httptools, as ``uvicorn[standard]`` serves.
    `rounds` overrides the number of rounds (16; 3 when `quick`). The rounds are split
    into `epochs` parts (2; 1 when `quick`), each with freshly started servers: one
    process can run a few per cent faster or slower than an identical one for its
    whole life (memory layout, hash seeds), and fresh processes average that out.
    `paired`: each round loads the bare server and the other at the same time (see
    `_paired_round`) instead of one after the other.
    """
    default, seconds = (3, 1.0) if quick else (16, 2.0)
    timing = _Timing(rounds or default, epochs or (1 if quick else 2), seconds, WARMUP, paired)
    references = references or ablations
    configs: dict[str, tuple[str, ...]] = {"ours": ("--deadlines",), "twin": ()}
    if ablations:
        configs["unwatched"] = ("--deadlines", "--watch-after", "60")
    if references:
        configs |= {name: yardstick.argv for name, yardstick in YARDSTICKS.items()}
    seen = _against_bare(("starlette",), configs, timing, "/")
    rows = _rows(
        *seen["ours"], ("Starlette under uvicorn", "Starlette + DeadlineMiddleware"), "inbound"
    )
    control = _control(*seen["twin"], "Starlette", "inbound A/A")
    ablation: list[Comparison] = []
    if ablations:  # not goals: what the watcher saves
        unwatched = ("Starlette under uvicorn", "Starlette + DeadlineMiddleware(watch_after=60)")
        ablation += _rows(*seen["unwatched"], unwatched, "inbound, no watcher")
    if references:  # not goals: what other middlewares cost on the same app
        for name, yardstick in YARDSTICKS.items():
            labels = ("Starlette under uvicorn", f"Starlette + {yardstick.middleware}")
            ablation += _throughput_cpu(_rows(*seen[name], labels, yardstick.prefix))
    if ablations:
        ablation += _standard(timing)
    return rows + control + _reports(ablation) + _fastapi(timing)


@dataclass(frozen=True)
class _Yardstick:
    """A middleware set alone on the same app, for scale (reports, not goals)."""

    argv: tuple[str, ...]  # the server's extra arguments
    middleware: str  # what it is, in the rows' labels
    prefix: str  # the rows' names start with this


YARDSTICKS = {
    "passthrough": _Yardstick(
        ("--passthrough",), "a middleware that only calls the app", "inbound, pass-through"
    ),
    "floor": _Yardstick(("--floor",), "a contextvar/send middleware", "inbound floor"),
    **{
        name: _Yardstick(("--reference", name), middleware, f"inbound, Starlette's {middleware}")
        for name, middleware in REFERENCES.items()
    },
}


@dataclass(frozen=True)
class _Timing:
    """How a comparison is measured: rounds, epochs, each round's length, pairing."""

    rounds: int
    epochs: int
    seconds: float
    warmup: float
    paired: bool


def _against_bare(
    bare: tuple[str, ...], others: dict[str, tuple[str, ...]], timing: _Timing, path: str
) -> dict[str, tuple[list[Round], list[Round]]]:
    """For each of `others` (extra arguments to the `bare` server's), the bare server's
    rounds and its own, round for round."""
    runs = [bare, *((*bare, *extra) for extra in others.values())]
    if timing.paired:
        servers = [functools.partial(Child, "servers.py", *argv) for argv in runs]
        pairs = _paired_epochs([(servers[0], other) for other in servers[1:]], timing, path)
        return dict(zip(others, pairs, strict=True))
    base, *rest = _epochs(runs, timing.rounds, timing.epochs, timing.seconds, timing.warmup, path)
    return {name: (base, mine) for name, mine in zip(others, rest, strict=True)}


def _standard(timing: _Timing) -> list[Comparison]:
    """The Starlette comparison under uvloop and httptools (``uvicorn[standard]``): a
    cheaper bare request, so the same microseconds weigh more (throughput and CPU)."""
    seen = _against_bare(("starlette", "--standard"), {"ours": ("--deadlines",)}, timing, "/")
    labels = ("Starlette, uvloop + httptools", "the same + DeadlineMiddleware")
    return _throughput_cpu(_rows(*seen["ours"], labels, "inbound, uvicorn[standard]"))


def _throughput_cpu(rows: list[Comparison]) -> list[Comparison]:
    """Of a comparison's rows, throughput and CPU per request (for reports)."""
    return [row for row in rows if row.metric in ("requests/s", "CPU µs per req")]


def _epochs(
    runs: list[tuple[str, ...]],
    rounds: int,
    epochs: int,
    seconds: float,
    warmup: float,
    path: str,
) -> list[list[Round]]:
    """Each server's rounds over `epochs` lives: per epoch, fresh servers and generator."""
    results: list[list[Round]] = [[] for _ in runs]
    for share in _shares(rounds, epochs):
        with contextlib.ExitStack() as stack:
            servers = [stack.enter_context(Child("servers.py", *argv)) for argv in runs]
            loadgen = stack.enter_context(Child("loadgen.py"))
            for mine, more in zip(
                results, _rotate(loadgen, servers, share, seconds, warmup, path), strict=True
            ):
                mine += more
    return results


def _shares(rounds: int, epochs: int) -> list[int]:
    """The rounds each epoch runs: `rounds` split as evenly as it goes, at least one each."""
    epochs = max(1, min(epochs, rounds))
    return [rounds // epochs + (1 if epoch < rounds % epochs else 0) for epoch in range(epochs)]


def _warm_up(loadgen: Child, servers: list[Child], path: str) -> None:
    """A short round for each server: imports, caches, first connections."""
    for server in servers:
        _round(loadgen, server, 0.5, 0.2, path)


def _rotate(
    loadgen: Child, servers: list[Child], rounds: int, seconds: float, warmup: float, path: str
) -> list[list[Round]]:
    """Each server's rounds; every round each server in turn, each going first in turn."""
    _warm_up(loadgen, servers, path)
    results: list[list[Round]] = [[] for _ in servers]
    for k in turns(rounds, len(servers)):
        results[k].append(_round(loadgen, servers[k], seconds, warmup, path))
    return results


def _paired_epochs(
    pairs: list[tuple[Callable[[], Child], Callable[[], Child]]], timing: _Timing, path: str
) -> list[tuple[list[Round], list[Round]]]:
    """For each pair of servers (each started by calling its factory), both one's rounds
    and the other's, loaded together.

    Each comparison has a bare server of its own, so that the two in a pair work and
    idle alike. A bare server shared by every pair ran in every round while each other
    server rested between its own, and the other read 1-3 % more throughput in A/A
    pairs (1.012 and 1.026; the scheduler's credit for a rested process, probably). Per epoch,
    fresh servers and generator; every round runs the pairs in turn (`turns` sets the
    order), and a pair's two servers take turns to have their connections opened first.
    """
    results: list[tuple[list[Round], list[Round]]] = [([], []) for _ in pairs]
    for share in _shares(timing.rounds, timing.epochs):
        with contextlib.ExitStack() as stack:
            started = [
                (stack.enter_context(first()), stack.enter_context(second()))
                for first, second in pairs
            ]
            loadgen = stack.enter_context(Child("loadgen.py"))
            _warm_up(loadgen, [server for pair in started for server in pair], path)
            for k in turns(share, len(started)):
                mine = results[k]
                flip = len(mine[0]) % 2 == 1  # who connects first, in turn
                a, b = _paired_round(loadgen, *started[k], timing, path, flip=flip)
                mine[0].append(a)
                mine[1].append(b)
    return results


def _paired_round(
    loadgen: Child, a: Child, b: Child, timing: _Timing, path: str, *, flip: bool
) -> tuple[Round, Round]:
    """`a` and `b` under load at the same time, sharing one core; each one's `Round`.

    Half the connections go to each, and the two servers share one core (the generator
    has the other), so the scheduler gives them equal time in the same instants: the
    hypervisor's steals and the host's drift, which move a round of one server against
    a round of the other by ±10 % on a shared machine, fall on both alike, and what
    one does more per request shows as fewer requests in the same time. `flip` opens
    `b`'s connections first.
    """
    pair = [b, a] if flip else [a, b]
    for server in pair:
        _pin(loadgen, server)  # both on the server core
    command = _command(timing.seconds, timing.warmup, path) | {
        "ports": [server.port for server in pair],
        "connections": CONNECTIONS // 2,
    }
    cpu = [cpu_seconds(server.pid) for server in pair]
    answer = loadgen.ask(command, timeout=timing.warmup + timing.seconds + 30)
    seen = [
        _seen(
            figures | {"cpu_s": answer["cpu_s"]},
            cpu_seconds(server.pid) - used,
            timing.seconds,
            timing.warmup,
        )
        for server, figures, used in zip(pair, answer["ports"], cpu, strict=True)
    ]
    return (seen[1], seen[0]) if flip else (seen[0], seen[1])


FASTAPI_PATH = "/items/42?q=x"


def _fastapi(timing: _Timing) -> list[Comparison]:
    """The same comparison on a typical route: FastAPI, a path parameter, a pydantic model.

    With its own A/A control, a second bare FastAPI server.
    """
    others = {"ours": ("--deadlines",), "twin": ()}
    seen = _against_bare(("fastapi",), others, timing, FASTAPI_PATH)
    labels = ("FastAPI JSON route under uvicorn", "FastAPI + DeadlineMiddleware")
    control = _control(*seen["twin"], "FastAPI JSON route", "inbound, FastAPI A/A")
    return _rows(*seen["ours"], labels, "inbound, FastAPI route") + control


def _control(a: list[Round], twin: list[Round], label: str, prefix: str) -> list[Comparison]:
    """The A/A rows: throughput and CPU of a second, identical bare server (reports)."""
    rows = _rows(a, twin, (f"{label} under uvicorn", "the same, a second server"), prefix)
    return _reports(_throughput_cpu(rows))


def _reports(rows: list[Comparison]) -> list[Comparison]:
    """`rows` reported, not judged against the overhead goal (yardsticks, controls)."""
    for row in rows:
        row.goal = "report"
        row.passed = None
    return rows


def _rows(a: list[Round], b: list[Round], labels: tuple[str, str], prefix: str) -> list[Comparison]:
    pairs = list(zip(a, b, strict=True))
    notes = {
        "connections": CONNECTIONS,
        "loadgen_cpu_share_max": round(max(r.loadgen_cpu_share for r in a + b), 3),
    }
    throughput = Comparison(
        f"{prefix}: throughput",
        "requests/s",
        *labels,
        a=Summary.of([r.rps for r in a]),
        b=Summary.of([r.rps for r in b]),
        goal="ratio >= 0.95",
        rounds=[y.rps / x.rps for x, y in pairs],
        notes=notes,
    )
    latency = Comparison(
        f"{prefix}: latency under load",
        "latency ms",
        *labels,
        a=Summary.of([v for r in a for v in r.latencies_ms]),
        b=Summary.of([v for r in b for v in r.latencies_ms]),
        goal="ratio <= 1.05",
        rounds=[
            statistics.median(y.latencies_ms) / statistics.median(x.latencies_ms) for x, y in pairs
        ],
        notes=notes,
    )
    p99 = Comparison(
        f"{prefix}: p99 latency per round",
        "p99 ms",
        *labels,
        a=Summary.of([_p99(r.latencies_ms) for r in a]),
        b=Summary.of([_p99(r.latencies_ms) for r in b]),
        goal="ratio <= 1.05",
        rounds=[_p99(y.latencies_ms) / _p99(x.latencies_ms) for x, y in pairs],
        notes=notes,
    )
    cpu = Comparison(
        f"{prefix}: server CPU per request",
        "CPU µs per req",
        *labels,
        a=Summary.of([r.cpu_us for r in a]),
        b=Summary.of([r.cpu_us for r in b]),
        goal="report",
        rounds=[y.cpu_us / x.cpu_us for x, y in pairs],
        notes={
            **notes,
            "added_cpu_us": round(statistics.median(y.cpu_us - x.cpu_us for x, y in pairs), 1),
        },
    )
    return [
        verdict_ratio(throughput, at_least=0.95),
        verdict_ratio(latency, at_most=1.05),
        verdict_ratio(p99, at_most=1.05),
        cpu,
    ]


def _p99(values: list[float]) -> float:
    from harness import quantile

    return quantile(values, 0.99)


def main() -> int:
    """The goal comparisons alone, with as many rounds as a noisy machine needs."""
    parser = argparse.ArgumentParser(description="Inbound overhead with many rounds.")
    parser.add_argument("--rounds", type=int, default=64, help="rounds per comparison")
    parser.add_argument(
        "--epochs", type=int, default=4, help="fresh server processes this many times"
    )
    parser.add_argument("--json", type=Path, help="write the figures to this file")
    parser.add_argument(
        "--references",
        action="store_true",
        help="also yardsticks on the same app: a pass-through, the floor, Starlette's "
        "TrustedHost and GZip middlewares (reports)",
    )
    parser.add_argument(
        "--paired",
        action="store_true",
        help="load the bare server and the other at the same time, on one shared core",
    )
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if not 1 <= args.epochs <= args.rounds:
        parser.error("--epochs must be between 1 and --rounds")
    before = steadiness()
    rows = run(
        False,
        rounds=args.rounds,
        ablations=False,
        epochs=args.epochs,
        references=args.references,
        paired=args.paired,
    )
    after = steadiness()
    how = "paired rounds" if args.paired else "rounds"
    print(f"{args.rounds} {how} in {args.epochs} epochs; {steadiness_line(before, after)}")
    print(table(rows))
    if args.json:
        steady = {"before": before, "after": after}
        payload = {
            "rounds": args.rounds,
            "epochs": args.epochs,
            "paired": args.paired,
            "steadiness": steady,
            "rows": [r.to_json() for r in rows],
        }
        args.json.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
