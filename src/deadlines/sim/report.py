"""Reports of a `Result`: a plain-text table and a PNG (matplotlib, imported lazily)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._extras import missing
from .result import LoadSummary, Result, VariantResult


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _causes(causes: dict[str, int], unfinished: int = 0) -> str:
    parts = [f"{cause} {n}" for cause, n in causes.items()]
    if unfinished:
        parts.append(f"unfinished {unfinished}")
    return ", ".join(parts) or "-"


def table(result: Result) -> str:
    """Every variant's loads, services, calls and trace as aligned text."""
    lines = [f"{result.scenario}: {result.description}".rstrip(": "), f"seed {result.seed}"]
    for variant in result.variants.values():
        lines.append("")
        lines.extend(_variant(variant))
    return "\n".join(lines)


def _variant(v: VariantResult) -> list[str]:
    head = (
        f"== {v.name}: {v.duration_s:g} s of load + {v.drain_s:g} s drain"
        f" ({v.events:,} events, {v.wall_s:.2f} s)"
    )
    rows = [["load", "sent", "ok", "failed", "p50 ms", "p95 ms", "p99 ms", "p99.9 ms",
             "in flight@end", "failures"]]  # fmt: skip
    rows += [_load_row(name, load) for name, load in v.loads.items()]
    out = [head, *_align(rows)]
    rows = [["service", "requests", "open max", "in flight max", "queue max by server"]]
    for name, svc in v.services.items():
        queues = " ".join(str(s.queue_max) for s in svc.servers)
        rows.append([name, str(svc.requests), str(svc.open_max), str(svc.in_flight_max), queues])
    out += ["", *_align(rows)]
    rows = [["call", "calls", "ok", "failed", "retries", "fallbacks", "pool wait ms mean/max",
             "failures"]]  # fmt: skip
    for service, calls in v.calls.items():
        for name, call in calls.items():
            if not call.calls:
                continue
            wait = f"{_num(call.pool_wait_mean_ms)}/{_num(call.pool_wait_max_ms)}"
            rows.append(
                [f"{service}.{name}", str(call.calls), str(call.ok), str(call.failed),
                 str(call.retries), str(call.fallbacks), wait, _causes(call.causes)]
            )  # fmt: skip
    if len(rows) > 1:
        out += ["", *_align(rows)]
    if len(v.trace) > 1:  # a request that crossed hops: show who did what when
        rows = [["first request", "started", "budget", "answered", "status", "gave up",
                 "stopped", "finished", "committed"]]  # fmt: skip
        for name, hop in v.trace.items():
            rows.append(
                [name, _num(hop.started_ms, 0), _num(hop.budget_ms, 0), _num(hop.answered_ms, 0),
                 "-" if hop.status is None else str(hop.status), _num(hop.gave_up_ms, 0),
                 _num(hop.stopped_ms, 0), _num(hop.finished_ms, 0),
                 "yes" if hop.committed else "no"]
            )  # fmt: skip
        out += ["", *_align(rows), "(times in ms since the client sent the request)"]
    return out


def _load_row(name: str, load: LoadSummary) -> list[str]:
    return [
        name,
        str(load.requests),
        str(load.ok),
        str(load.failed),
        _num(load.p50_ms),
        _num(load.p95_ms),
        _num(load.p99_ms),
        _num(load.p999_ms),
        str(load.in_flight_end),
        _causes(load.causes, load.unfinished),
    ]


def _align(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            for row in rows]  # fmt: skip


def plot(result: Result, path: Path) -> Path:
    """One row per variant: in flight per load, p50/p99 per load, queue per server."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise missing("deadlines sim --plot", "matplotlib", "sim") from exc
    variants = list(result.variants.values())
    # A constrained layout keeps the figure's title clear of the first row's titles.
    fig, axes = plt.subplots(
        len(variants), 3, figsize=(15, 3.2 * len(variants)), squeeze=False, layout="constrained"
    )
    for row, variant in zip(axes, variants, strict=True):
        _plot_variant(row, variant)
    fig.suptitle(f"{result.scenario} (seed {result.seed})")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _plot_variant(row: Sequence[Any], v: VariantResult) -> None:
    in_flight, latency, queues = row
    series = v.series
    for name, values in series.in_flight.items():
        in_flight.plot(series.t_s, values, label=name)
    in_flight.set_title(f"{v.name}: in flight (server side)")
    in_flight.set_xlabel("s")
    in_flight.legend(loc="upper left", fontsize="small")
    for name, lat in series.latency.items():
        # A window or two (a single request) is no line: show its points.
        marker = "o" if len(lat["t_s"]) < 3 else None
        latency.plot(lat["t_s"], lat["p50_ms"], marker=marker, label=f"{name} p50")
        latency.plot(lat["t_s"], lat["p99_ms"], marker=marker, linestyle="--", label=f"{name} p99")
    latency.set_xlim(in_flight.get_xlim())  # the same time axis as the in-flight panel
    latency.set_title("latency seen by clients (ms)")
    latency.set_xlabel("s")
    latency.legend(loc="upper left", fontsize="small")
    # The queues of the service with the most servers: where a slow server shows.
    service = max(series.queue, key=lambda name: len(v.services[name].servers))
    samples = series.queue[service]
    for index in range(len(v.services[service].servers)):
        queues.plot(series.t_s, [s[index] for s in samples], label=f"{service}[{index}]")
    queues.set_title(f"{service}: queue per server")
    queues.set_xlabel("s")
    queues.legend(loc="upper left", fontsize="small")
