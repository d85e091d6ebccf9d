"""Experiment `cascade` (the chapter's Part 3): no timeout, as a cascade.

An API (one process) with `/home` (recommendations ∥ price) and `/checkout` (price)
calls one downstream host (another process). At t=0 recommendations stop answering.
An open-loop load of /home and /checkout runs for a while; the client gives /checkout
a few seconds. Per variant: /home requests in flight over time, /checkout outcomes,
and the most connections the downstream ever saw open.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from ..._tools.stats import percentile
from .. import _params, chapter, report
from ..harness import Processes
from ..load import LoadRun, run_open_loop
from ..progress import Progress

VARIANTS = ("no_timeout", "timeout", "bulkhead", "deadlines")
_LABELS = {
    "no_timeout": "No timeout, one shared pool",
    "timeout": "Timeout on recommendations, page renders without them",
    "bulkhead": "Separate pool for recommendations, no timeout",
    "deadlines": "deadlines: request deadline + pool per dependency + fallback",
}


@dataclass(frozen=True)
class Params:
    """The experiment's knobs (the chapter's numbers are the defaults)."""

    duration: float = 10.0
    home_rate: float = 50.0
    checkout_rate: float = 10.0
    pool_size: int = 20
    recs_timeout: float = 0.3
    checkout_timeout: float = 5.0
    home_deadline: float = 1.0
    price_ms: float = 5.0
    sample_every: float = 0.5
    variants: tuple[str, ...] = field(default=VARIANTS)

    def __post_init__(self) -> None:
        _params.check(
            self,
            known=VARIANTS,
            at_most={"pool_size": (100_000, "a deadlines.Dependency's largest pool"),
                     "price_ms": (_params.HOUR * 1000, "an hour")},
            seconds=("duration", "recs_timeout", "checkout_timeout", "home_deadline",
                     "sample_every"),
        )  # fmt: skip
        _params.check_requests(
            (self.home_rate + self.checkout_rate) * self.duration,
            "--home-rate and --checkout-rate over --duration",
        )


def quick() -> Params:
    """A short run for tests."""
    return Params(duration=2.5, checkout_timeout=1.5, sample_every=0.25)


def expected_seconds(p: Params) -> float:
    """About how long `run` takes."""
    return len(p.variants) * (p.duration + p.checkout_timeout + 1.5)


async def _sample(
    session: aiohttp.ClientSession, url: str, every: float, until: float
) -> list[list[float]]:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    series: list[list[float]] = []
    n = 0
    while True:
        target = t0 + n * every
        if target - t0 > until + 1e-9:
            return series
        await asyncio.sleep(max(0.0, target - loop.time()))
        async with session.get(url) as resp:
            stats = await resp.json()
        series.append([round(n * every, 3), stats["home_in_flight"]])
        n += 1


async def _drive(p: Params, api: str, downstream: str) -> tuple[LoadRun, list[list[float]], int]:
    # The no-timeout variant, on purpose.
    timeout_none = aiohttp.ClientTimeout(total=None)  # deadlines: ignore[DLN101]
    checkout_timeout = aiohttp.ClientTimeout(total=p.checkout_timeout)
    checkout_headers = {"x-request-timeout-ms": str(round(p.checkout_timeout * 1000))}
    load = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0), timeout=timeout_none)
    control = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))

    async def fire(kind: str, index: int) -> tuple[int | None, str | None]:
        try:
            if kind == "home":
                async with load.get(api + "/home") as resp:
                    await resp.read()
                    return resp.status, None
            async with load.get(
                api + "/checkout", timeout=checkout_timeout, headers=checkout_headers
            ) as resp:
                await resp.read()
                return resp.status, None
        except TimeoutError:
            return None, "timeout"
        except aiohttp.ClientError as exc:
            return None, type(exc).__name__

    try:
        async with control.get(api + "/_downstream", params={"url": downstream}) as resp:
            resp.raise_for_status()
        rates = {"home": p.home_rate, "checkout": p.checkout_rate}
        sampler = asyncio.create_task(_sample(control, api + "/_stats", p.sample_every, p.duration))
        run = await run_open_loop(
            rates,
            p.duration,
            fire,
            drain=p.checkout_timeout + 1.0,
            wait_for=("checkout",),
            keep_until=p.duration + 0.25,  # the last in-flight sample is taken first
        )
        series = await sampler
        async with control.get(downstream + "/_stats") as resp:
            down = await resp.json()
        return run, series, int(down["max_open"])
    finally:
        with contextlib.suppress(Exception):
            await load.close()
        await control.close()


def _summarise(run: LoadRun, series: list[list[float]], open_max: int) -> dict[str, Any]:
    checkouts = run.of("checkout")
    latencies = [s.latency * 1000.0 for s in checkouts if s.latency is not None]
    p99 = percentile(sorted(latencies), 0.99)
    homes = run.of("home")
    return {
        "home_in_flight_end": series[-1][1] if series else None,
        "home_in_flight_series": series,
        "checkout_ok": sum(1 for s in checkouts if s.ok),
        "checkout_failed": sum(1 for s in checkouts if not s.ok),
        "checkout_p99_ms": None if p99 is None else round(p99, 1),
        "downstream_open_max": open_max,
        "home_answered": sum(1 for s in homes if s.ok),
        "load": run.rate_report(),
    }


def run_variant(p: Params, variant: str) -> dict[str, Any]:
    """Start a fresh downstream and API for `variant`, load them, return its figures."""
    with Processes() as procs:
        down, api = procs.start_all(
            [
                ("cascade.downstream", ["--price-ms", str(p.price_ms)]),
                ("cascade.api", [
                    "--variant", variant,
                    "--pool-size", str(p.pool_size),
                    "--recs-timeout", str(p.recs_timeout),
                    "--home-deadline", str(p.home_deadline),
                    "--checkout-deadline", str(p.checkout_timeout),
                ]),
            ]
        )  # fmt: skip
        run, series, open_max = asyncio.run(_drive(p, api.url, down.url))
    return _summarise(run, series, open_max)


def pending_variants() -> dict[str, str]:
    """Variants that cannot run in this install, with why (modules not there yet)."""
    from ._deadlines import missing

    why = missing()
    return {"deadlines": why} if why else {}


def run(p: Params, progress: Progress) -> dict[str, Any]:
    """Run every variant; the JSON-ready result."""
    result: dict[str, Any] = {"params": _params_json(p), "variants": {}, "pending": {}}
    unavailable = pending_variants()
    for variant in p.variants:
        if variant in unavailable:
            result["pending"][variant] = unavailable[variant]
            progress.note(f"cascade {variant}: pending ({unavailable[variant]})")
            continue
        with progress.step(f"cascade {variant}", p.duration + p.checkout_timeout + 1.5):
            result["variants"][variant] = run_variant(p, variant)
    return result


def _params_json(p: Params) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in p.__dict__.items()}


_SHORT = {
    "no_timeout": "no timeout, one shared pool",
    "timeout": "timeout on recs (300 ms)",
    "bulkhead": "separate pool for recs",
    "deadlines": "deadlines",
}


def growth(series: list[list[float]]) -> float | None:
    """/home in flight gained per second over the second half of the run (None: too short)."""
    if len(series) < 3:
        return None
    half = series[len(series) // 2]
    dt = series[-1][0] - half[0]
    return (series[-1][1] - half[1]) / dt if dt else 0.0


def _in_flight(end: float | None, slope: float | None) -> str:
    if slope is None:
        return f"{end}"
    return f"{end:.0f}, growing {slope:.0f}/s" if slope > 2 else f"{end:.0f}, flat"


def tables(result: dict[str, Any]) -> list[report.Table]:
    """The chapter's table: each variant measured, and the chapter's row below it."""
    p = result["params"]
    table = report.Table(
        f"cascade: {p['home_rate']:g} /home + {p['checkout_rate']:g} /checkout per s for"
        f" {p['duration']:g} s, a pool of {p['pool_size']}, /checkout limited to"
        f" {p['checkout_timeout']:g} s",
        ["variant", "/home in flight", "/checkout ok", "failed", "p99", "downstream"],
    )
    for name, v in result["variants"].items():
        sent = v["checkout_ok"] + v["checkout_failed"]
        table.rows.append([
            _SHORT.get(name, name),
            _in_flight(v["home_in_flight_end"], growth(v["home_in_flight_series"])),
            f"{v['checkout_ok']} of {sent}",
            str(v["checkout_failed"]),
            report.ms(v["checkout_p99_ms"]),
            f"{v['downstream_open_max']} max",
        ])  # fmt: skip
        if name in chapter.CASCADE:
            ref = chapter.CASCADE[name]
            table.rows.append([
                "  the chapter (Node)", ref.in_flight_text,
                f"{ref.checkout_ok} of {ref.checkout_sent}",
                str(ref.checkout_sent - ref.checkout_ok), report.ms(ref.checkout_p99_ms),
                f"{chapter.CASCADE_DOWNSTREAM_OPEN} max" if name == "no_timeout" else "-",
            ])  # fmt: skip
    for name, why in result.get("pending", {}).items():
        table.rows.append([_SHORT.get(name, name), "pending", why[:12], "-", "-", "-"])
    rates = ", ".join(
        "{}: {:+.2f}% / {:+.2f}%".format(
            _SHORT.get(name, name).split(",")[0].split(" (")[0],
            v["load"]["home"]["error_pct"], v["load"]["checkout"]["error_pct"],
        )
        for name, v in result["variants"].items()
    )  # fmt: skip
    table.note = (
        "/home in flight after the load; p99: of /checkout, failed calls counted at the time"
        " they gave up; downstream: the most connections it had open. deadlines: a 1 s route"
        " deadline, a pool per dependency and a fallback for recs. Load achieved against"
        f" requested (/home / /checkout): {rates}."
    )
    table.verdict = verdict(result)
    return [table]


def verdict(result: dict[str, Any]) -> str:
    """The measurement beside the chapter's Part 3: in flight, its growth, checkouts."""
    p = result["params"]
    variants = result["variants"]
    compared = [n for n in chapter.CASCADE if n in variants]
    if not compared:
        return "differs: none of the chapter's variants ran"
    same = chapter.same_params(p, chapter.CASCADE_PARAMS)
    problems = []
    for name in compared:
        v = variants[name]
        ref = chapter.CASCADE[name]
        grew = (growth(v["home_in_flight_series"]) or 0.0) > 2
        if grew != ref.growing:
            problems.append(f"{_SHORT[name]}: /home in flight {'grew' if grew else 'stayed flat'}")
        healthy = v["checkout_failed"] == 0
        if healthy != (ref.checkout_ok == ref.checkout_sent):
            problems.append(f"{_SHORT[name]}: {v['checkout_failed']} checkouts failed")
        end = ref.in_flight
        if same and not problems and abs(v["home_in_flight_end"] - end) > max(5, 0.1 * end):
            problems.append(f"{_SHORT[name]}: {v['home_in_flight_end']} in flight, not ~{end}")
    if problems:
        return chapter.verdict(False, "; ".join(problems) + ".")
    ends = " / ".join(str(variants[n]["home_in_flight_end"]) for n in compared)
    chapter_ends = " / ".join(str(chapter.CASCADE[n].in_flight) for n in compared)
    numbers = (
        f"/home in flight {ends} against the chapter's {chapter_ends}"
        if same
        else "the same shape (other parameters than the chapter's: compare shapes only)"
    )
    healthy = [
        f"{variants[n]['checkout_p99_ms']:.0f}" for n in ("timeout", "bulkhead")
        if n in variants and variants[n]["checkout_p99_ms"] is not None
    ]  # fmt: skip
    p99 = (
        f" A healthy /checkout's p99 is {' and '.join(healthy)} ms here, 10 and 11 ms in the"
        f" chapter: both far below the {p['checkout_timeout']:g} s limit."
        if healthy
        else ""
    )
    return chapter.verdict(
        True,
        f"{numbers}. Without a timeout /home piles up and the healthy /checkout fails through"
        " the shared pool; a timeout keeps both flat and healthy; a separate pool saves"
        f" /checkout but not /home.{p99}",
    )


#: How each variant is drawn: the pairs that coincide (no timeout and the separate
#: pool both pile up; timeout and deadlines both stay flat) as a wide pale band under a
#: thin marked line, so both stay visible.
_STYLES = {
    "no_timeout": {"color": "tab:red", "linewidth": 7, "alpha": 0.35},
    "bulkhead": {"color": "tab:purple", "linewidth": 1.5, "linestyle": "--", "marker": "x"},
    "timeout": {"color": "tab:blue", "linewidth": 7, "alpha": 0.35},
    "deadlines": {"color": "tab:green", "linewidth": 1.5, "linestyle": ":", "marker": "o",
                  "markersize": 3},
}  # fmt: skip


def plot(result: dict[str, Any], path: str | Path) -> Path:
    """/home in flight over time per variant (left); /checkout ok and failed (right)."""
    plt = report.pyplot()
    variants = result["variants"]
    fig, (flight, checkout) = plt.subplots(
        1, 2, figsize=(12, 4.6), width_ratios=(3, 2), layout="constrained"
    )
    for name, v in variants.items():
        xs = [pt[0] for pt in v["home_in_flight_series"]]
        ys = [pt[1] for pt in v["home_in_flight_series"]]
        flight.plot(xs, ys, label=_SHORT.get(name, name), **_STYLES.get(name, {}))
    if chapter.same_params(result["params"], chapter.CASCADE_PARAMS):
        ends = [ref.in_flight for ref in chapter.CASCADE.values()]
        at = [result["params"]["duration"]] * len(ends)
        flight.scatter(at, ends, marker="D", s=30, facecolor="none", edgecolor="black",
                       zorder=3, label="the chapter, after 10 s")  # fmt: skip
    flight.set_xlabel("seconds since recommendations stopped answering")
    flight.set_ylabel("/home requests in flight")
    flight.set_title("/home: waiting piles up unless something bounds it")
    flight.grid(alpha=0.3)
    flight.legend(fontsize=8, loc="upper left")
    _plot_checkout(checkout, variants, result["params"])
    fig.suptitle("cascade: recommendations hang at t = 0; /checkout never calls them")
    return report.save_figure(fig, path)


def _plot_checkout(ax: Any, variants: dict[str, Any], p: dict[str, Any]) -> None:
    """The chapter's main point: the healthy route dies first when the pool is shared."""
    names = list(variants)
    ok = [variants[n]["checkout_ok"] for n in names]
    failed = [variants[n]["checkout_failed"] for n in names]
    ys = range(len(names))
    ax.barh(ys, ok, color="tab:green")
    ax.barh(ys, failed, left=ok, color="tab:red")
    for y, (name, good, bad) in enumerate(zip(names, ok, failed, strict=True)):
        x = (good + bad) * 1.02
        ax.text(x, y - 0.1, f"{good} of {good + bad} ok", va="center", fontsize=9)
        if name in chapter.CASCADE:
            ref = chapter.CASCADE[name]
            text = f"chapter: {ref.checkout_ok} of {ref.checkout_sent}"
            ax.text(x, y + 0.25, text, va="center", fontsize=7, color="grey")
    ax.set_yticks(list(ys))
    ax.set_yticklabels([_SHORT.get(n, n) for n in names], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, max((a + b for a, b in zip(ok, failed, strict=True)), default=1) * 1.4)
    ax.set_xlabel(
        f"requests ({p['checkout_rate']:g}/s, {p['checkout_timeout']:g} s limit):"
        " ok (green), failed (red)"
    )
    ax.set_title("/checkout, the healthy route")
