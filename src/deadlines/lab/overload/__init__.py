"""Experiment `overload`, beyond the chapter: keep goodput when more work arrives than fits.

One service process does fixed CPU work per request (`service`); its capacity C is
measured at the start (a short closed-loop run), so the loads are relative to what this
machine can do now. For each variant, a fresh service, and open-loop load from this
process at 0.5, 1, 2, 4 and 8 × C, `level_for` seconds each; then the spike ends and
the load returns to 0.5 × C for `recover_for` seconds. Each user request has a
`deadline` (1 s): an answer after it is worth nothing.

A variant is a set of switches joined by ``+``:

* ``timeouts``: the client gives each attempt `deadline` seconds (aiohttp's own timeout);
* ``deadlines``: the client runs each request in ``deadlines.scope(deadline)``, with
  `deadlines.aiohttp` (the budget goes out as ``x-request-timeout-ms``, retries stay
  inside it);
* ``retries``: up to `retries` more attempts after a failure (a timeout, a 5xx, a
  connection error): at once with ``timeouts``, with `deadlines.Retry` with ``deadlines``;
* ``budget``: a `deadlines.RetryBudget` (`retry_percent` of the calls) caps the retries;
* ``limit``: a `deadlines.AdaptiveLimit` caps the requests in flight;
* ``admission``, ``codel``: the service's flags: its middleware's `deadlines.Gate`
  (one request at work, the others queued) with `deadlines.Admission`, with
  `deadlines.CoDel` (and LIFO while a queue stands).

Per load level: goodput (answers within the deadline per second), wasted work (the
share of the service's work done for an answer that came too late or was never used),
p99 latency, refusals; and the time to recover full goodput after the spike.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..._tools.stats import percentile
from .. import _params, report
from ..harness import Processes
from ..load import LoadRun, Shot, run_open_loop
from ..progress import Progress

if TYPE_CHECKING:
    import aiohttp

SWITCHES = ("timeouts", "deadlines", "retries", "budget", "limit", "admission", "codel")
#: The four variants run by default.
VARIANTS = (
    "timeouts",
    "timeouts+retries",
    "deadlines+retries+budget+admission+codel",
    "deadlines+retries+budget+admission+codel+limit",
)
#: A bin of the recovery counts as full goodput from this share answered in time.
FULL = 0.9
#: The load after the spike, as a multiple of C.
AFTER = "after"
#: Slack for the load generator's own scheduling when it checks "within the deadline".
SLACK = 0.01


def switches(variant: str) -> frozenset[str]:
    """The switches of `variant`; raises `ValueError` for a name or mix that cannot run."""
    parts = [s.strip() for s in variant.split("+")]
    unknown = [s for s in parts if s not in SWITCHES]
    if unknown:
        raise ValueError(
            f"--variants: {variant!r} has {', '.join(unknown)}; switches are"
            f" {', '.join(SWITCHES)} joined by '+'"
        )
    found = frozenset(parts)
    if len(found & {"timeouts", "deadlines"}) != 1:
        raise ValueError(f"--variants: {variant!r} needs exactly one of timeouts, deadlines")
    if "budget" in found and "retries" not in found:
        raise ValueError(f"--variants: {variant!r}: budget caps retries: add retries")
    if found & {"budget", "limit"} and "deadlines" not in found:
        raise ValueError(f"--variants: {variant!r}: budget and limit need deadlines")
    return found


@dataclass(frozen=True)
class Params:
    """The experiment's knobs."""

    service_ms: float = 40.0
    loads: tuple[str, ...] = ("0.5", "1", "2", "4", "8")
    after_load: float = 0.5
    level_for: float = 4.0
    recover_for: float = 6.0
    deadline: float = 1.0
    retries: int = 3
    retry_percent: float = 0.2
    codel_target: float = 0.1
    codel_interval: float = 0.5
    rejection_budget: float = 0.2
    calibrate_for: float = 1.5
    window: float = 0.5
    variants: tuple[str, ...] = field(default=VARIANTS)

    def __post_init__(self) -> None:
        _params.check(
            self,
            at_most={"retries": (10, "ten"), "retry_percent": (1.0, "all the calls"),
                     "rejection_budget": (1.0, "all the requests"),
                     "service_ms": (1000.0, "a second"), "after_load": (100.0, "100 × C")},
            seconds=("level_for", "recover_for", "deadline", "codel_target",
                     "codel_interval", "calibrate_for", "window"),
        )  # fmt: skip
        if not self.variants:
            raise ValueError(f"--variants must name some of {', '.join(VARIANTS)}")
        for name in self.variants:
            switches(name)
        levels = self.levels()
        if not levels or len(set(levels)) != len(levels):
            raise ValueError(f"--loads must be distinct multiples of C, got {self.loads}")
        if self.codel_target >= self.codel_interval:
            raise ValueError("--codel-target must be shorter than --codel-interval")

    def levels(self) -> list[float]:
        """The load levels as multiples of C."""
        try:
            values = [float(x) for x in self.loads]
        except ValueError:
            raise ValueError(f"--loads must be numbers, got {self.loads}") from None
        if not all(math.isfinite(v) and 0 < v <= 100 for v in values):
            raise ValueError(f"--loads must be between 0 and 100 (× C), got {self.loads}")
        return values

    def drain(self, variant: str) -> float:
        """How long stragglers of `variant` may take after the last start."""
        tries = 1 + self.retries if {"timeouts", "retries"} <= switches(variant) else 1
        return tries * self.deadline + 0.5

    def run_for(self) -> float:
        """Seconds of load per variant."""
        return len(self.loads) * self.level_for + self.recover_for


def quick() -> Params:
    """A short run for tests (under a minute)."""
    return Params(level_for=1.0, recover_for=2.5, calibrate_for=1.0)


def _variant_seconds(p: Params, variant: str) -> float:
    return p.run_for() + p.drain(variant) + 1.5


def expected_seconds(p: Params) -> float:
    """About how long `run` takes."""
    return p.calibrate_for + 2.0 + sum(_variant_seconds(p, v) for v in p.variants)


def check_processes(p: Params) -> None:
    """Raise `ValueError` if one variant would send more than the load process can."""
    # C is measured at run time; 1000 / service_ms is its bound on an idle core.
    rate = 1000.0 / p.service_ms
    requests = rate * (sum(p.levels()) * p.level_for + p.after_load * p.recover_for)
    _params.check_requests(requests, "--service-ms, --loads and --level-for")


def _kind(load: float) -> str:
    return f"x{load:g}"


def _service_args(p: Params, on: frozenset[str], iterations: int | None) -> list[str]:
    args = ["--service-ms", str(p.service_ms)]
    if iterations is not None:
        args += ["--iterations", str(iterations)]
    if "admission" in on:
        args += ["--admission", "--rejection-budget", str(p.rejection_budget)]
    if "codel" in on:
        args += ["--codel", "--codel-target", str(p.codel_target)]
        args += ["--codel-interval", str(p.codel_interval)]
    return args


async def _get(session: aiohttp.ClientSession, url: str, level: str) -> int:
    async with session.get(url, params={"level": level}) as resp:
        await resp.read()
        return resp.status


async def _stats(url: str) -> dict[str, Any]:
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=10)
    session = aiohttp.ClientSession(timeout=timeout)
    async with session as control, control.get(url + "/_stats") as resp:
        data: dict[str, Any] = await resp.json()
        return data


async def _calibrate(url: str, seconds: float) -> float:
    """Requests per second the service completes with two always waiting: C."""
    import aiohttp

    done = 0
    timeout = aiohttp.ClientTimeout(total=seconds + 5.0)  # a stuck service fails the run
    async with aiohttp.ClientSession(timeout=timeout) as session:
        end = time.monotonic() + seconds

        async def user() -> None:
            nonlocal done
            while time.monotonic() < end:
                if await _get(session, url + "/work", "calibrate") == 200:
                    done += 1

        started = time.monotonic()
        await asyncio.gather(user(), user())
        took = time.monotonic() - started
    return done / took


def calibrate(p: Params) -> dict[str, Any]:
    """Measure C on a service without protections: the figure every load is a multiple of."""
    with Processes() as procs:
        service = procs.start("overload.service", *_service_args(p, frozenset(), None))
        capacity = asyncio.run(_calibrate(service.url, p.calibrate_for))
    return {
        "capacity_per_s": round(capacity, 2),
        "iterations": service.info["iterations"],
        "ideal_per_s": round(1000.0 / p.service_ms, 2),
    }


async def _drive(p: Params, variant: str, url: str, capacity: float) -> dict[str, Any]:
    import aiohttp

    import deadlines.aiohttp

    on = switches(variant)
    levels = p.levels()
    rates = {_kind(x): x * capacity for x in levels}
    spans = {_kind(x): (i * p.level_for, (i + 1) * p.level_for) for i, x in enumerate(levels)}
    rates[AFTER] = p.after_load * capacity
    spans[AFTER] = (len(levels) * p.level_for, p.run_for())
    attempts = 1 + (p.retries if "retries" in on else 0)
    if "deadlines" in on:
        dependency = deadlines.Dependency(
            "service",
            pool_size=100_000,
            pool_wait=p.deadline,
            retry=deadlines.Retry(attempts=attempts) if attempts > 1 else None,
            retry_budget=deadlines.RetryBudget(percent=p.retry_percent, min_per_second=1.0)
            if "budget" in on
            else None,
            limit=deadlines.AdaptiveLimit() if "limit" in on else None,
        )
        session = deadlines.aiohttp.session(dependency)
    else:
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=p.deadline),
        )

    async def with_deadline(kind: str) -> tuple[int | None, str | None]:
        status = None
        try:
            async with deadlines.scope(p.deadline):
                status = await _get(session, url + "/work", kind)
        except (TimeoutError, deadlines.DeadlineExceeded):
            return None, "timeout"
        except deadlines.CallRefused as exc:
            return None, f"refused ({exc.reason})"
        except aiohttp.ClientError as exc:
            return None, type(exc).__name__
        return status, None if status is not None else "timeout"

    async def with_timeouts(kind: str) -> tuple[int | None, str | None]:
        outcome: tuple[int | None, str | None] = (None, None)
        for _ in range(attempts):
            try:
                outcome = await _get(session, url + "/work", kind), None
            except TimeoutError:
                outcome = None, "timeout"
            except aiohttp.ClientError as exc:
                outcome = None, type(exc).__name__
            if outcome[0] == 200:
                break
        return outcome

    async def fire(kind: str, index: int) -> tuple[int | None, str | None]:
        if "deadlines" in on:
            return await with_deadline(kind)
        return await with_timeouts(kind)

    try:
        run = await run_open_loop(rates, p.run_for(), fire, drain=p.drain(variant), spans=spans)
    finally:
        await session.close()
    stats = await _stats(url)
    return _summarise(p, run, stats, capacity)


def _in_time(shot: Shot, deadline: float) -> bool:
    return shot.ok and shot.latency is not None and shot.latency <= deadline + SLACK


def _summarise(p: Params, run: LoadRun, stats: dict[str, Any], capacity: float) -> dict[str, Any]:
    limit = p.drain("timeouts+retries")
    levels = []
    steps = [(_kind(x), x, p.level_for) for x in p.levels()]
    in_time = [s for s in run.shots if _in_time(s, p.deadline)]
    for kind, load, seconds in [*steps, (AFTER, p.after_load, p.recover_for)]:
        shots = run.of(kind)
        good = sum(1 for s in shots if _in_time(s, p.deadline))
        start, end = run.spans[kind]
        # Goodput: answers in time per second while this level lasted (by answer time).
        answered = sum(1 for s in in_time if s.ended is not None and start <= s.ended < end)
        counts = stats["levels"].get(kind, {"arrived": 0, "served": 0, "unused": 0, "refused": 0})
        latencies = sorted((s.latency if s.latency is not None else limit) * 1000.0 for s in shots)
        served = counts["served"]
        levels.append(
            {
                "level": kind,
                "load": load,
                "offered_per_s": round(len(shots) / seconds, 2),
                "goodput_per_s": round(answered / seconds, 2),
                "goodput_pct_of_c": round(100.0 * answered / seconds / capacity, 1),
                "in_time_pct": round(100.0 * good / max(1, len(shots)), 1),
                "wasted_pct": round(100.0 * (served - good) / served, 1) if served else None,
                "p50_ms": _round(percentile(latencies, 0.5)),
                "p99_ms": _round(percentile(latencies, 0.99)),
                "sent": len(shots),
                "attempts": counts["arrived"],
                "served": served,
                "unused": counts["unused"],
                "refused": counts["refused"],
                "refused_why": counts.get("why", {}),
            }
        )
    return {
        "levels": levels,
        "recovery_s": _recovery(p, run),
        "series": _series(p, run),
        "queued_at_end": stats["queued"],
        "service_cpu_s": stats["cpu_s"],
        "work_cpu_s": stats["work_cpu_s"],
        "load": run.rate_report(),
    }


def _bins(p: Params, shots: list[Shot], start: float, end: float) -> list[list[float]]:
    """``[t, offered/s, goodput/s]`` per `window` by planned start, from `start` to `end`."""
    out = []
    n = max(1, round((end - start) / p.window))
    for i in range(n):
        lo = start + i * p.window
        chunk = [s for s in shots if lo <= s.planned < lo + p.window]
        good = sum(1 for s in chunk if _in_time(s, p.deadline))
        out.append([round(lo, 3), round(len(chunk) / p.window, 1), round(good / p.window, 1)])
    return out


def _series(p: Params, run: LoadRun) -> list[list[float]]:
    return _bins(p, run.shots, 0.0, p.run_for())


def _recovery(p: Params, run: LoadRun) -> float | None:
    """Seconds from the spike's end until every later bin is answered in time (>= FULL)."""
    start = len(p.levels()) * p.level_for
    bins = _bins(p, run.of(AFTER), start, p.run_for())
    full = [offered > 0 and good >= FULL * offered for _, offered, good in bins]
    if not full[-1]:
        return None
    first = len(full)
    while first > 0 and full[first - 1]:
        first -= 1
    return round(first * p.window, 3)


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def run_variant(p: Params, variant: str, capacity: dict[str, Any]) -> dict[str, Any]:
    """A fresh service for `variant` (the work calibrated for C), the load, its figures."""
    args = _service_args(p, switches(variant), capacity["iterations"])
    with Processes() as procs:
        service = procs.start("overload.service", *args)
        return asyncio.run(_drive(p, variant, service.url, capacity["capacity_per_s"]))


def run(p: Params, progress: Progress) -> dict[str, Any]:
    """Measure C, then run every variant; the JSON-ready result."""
    params = {k: (list(v) if isinstance(v, tuple) else v) for k, v in p.__dict__.items()}
    with progress.step("overload: measuring capacity C", p.calibrate_for + 2.0):
        capacity = calibrate(p)
    result: dict[str, Any] = {"params": params, "capacity": capacity, "variants": {}}
    for variant in p.variants:
        with progress.step(f"overload {variant}", _variant_seconds(p, variant)):
            result["variants"][variant] = run_variant(p, variant, capacity)
    return result


def _protected(result: dict[str, Any]) -> list[str]:
    """The variants with deadlines and a server-side protection."""
    return [
        v
        for v in result["variants"]
        if "deadlines" in switches(v) and switches(v) & {"admission", "codel"}
    ]


def _level(v: dict[str, Any], load: float) -> dict[str, Any] | None:
    return next((lv for lv in v["levels"] if lv["level"] == _kind(load)), None)


def tables(result: dict[str, Any]) -> list[report.Table]:
    """One table per variant (a row per load level), and the goals."""
    p = result["params"]
    cap = result["capacity"]
    out = []
    for name, v in result["variants"].items():
        table = report.Table(
            f"overload: {name}",
            ["load", "offered/s", "goodput/s", "% of C", "in time", "wasted", "p50",
             "p99", "attempts", "refused"],
        )  # fmt: skip
        for lv in v["levels"]:
            label = "after" if lv["level"] == AFTER else f"{lv['load']:g} × C"
            table.rows.append(
                [
                    label,
                    f"{lv['offered_per_s']:.1f}",
                    f"{lv['goodput_per_s']:.1f}",
                    f"{lv['goodput_pct_of_c']:.0f}%",
                    f"{lv['in_time_pct']:.0f}%",
                    "-" if lv["wasted_pct"] is None else f"{lv['wasted_pct']:.0f}%",
                    report.ms(lv["p50_ms"]),
                    report.ms(lv["p99_ms"]),
                    str(lv["attempts"]),
                    str(lv["refused"]),
                ]
            )
        recovery = v["recovery_s"]
        table.note = (
            "Recovery after the spike: "
            + (f"{recovery:g} s" if recovery is not None else f"not within {p['recover_for']:g} s")
            + f"; jobs still queued at the end: {v['queued_at_end']}."
            + f" Load achieved against requested: {_worst_rate(v)}."
        )
        out.append(table)
    out[0].title = (
        f"overload: C = {cap['capacity_per_s']:g} req/s measured (about"
        f" {1000.0 / cap['capacity_per_s']:.0f} ms per request), deadline {p['deadline']:g} s\n"
        + out[0].title
    )
    out[-1].note += (
        " goodput: answers within the deadline per second; in time: their share of the"
        " requests sent; wasted: the share of the service's work (requests served) not"
        " answered in time; p50/p99: to the user's last answer or failure; attempts:"
        " requests the service received (retries included); refused: answered 503/504"
        " without work."
    )
    out.append(goals(result))
    return out


def _worst_rate(v: dict[str, Any]) -> str:
    errors = [r["error_pct"] for k, r in v["load"].items() if isinstance(r, dict)]
    worst = min(errors, key=lambda e: -abs(e)) if errors else 0.0
    return f"{worst:+.1f}% at worst, starts up to {v['load']['max_start_lateness_ms']:g} ms late"


def goals(result: dict[str, Any]) -> report.Table:
    """The goals, each with what was measured: met or missed."""
    table = report.Table("overload: the goals", ["goal", "variant", "measured", "verdict"])
    variants = result["variants"]
    p = result["params"]
    for name in _protected(result):
        v = variants[name]
        at4 = _level(v, 4.0)
        if at4 is not None:
            wasted = at4["wasted_pct"] or 0.0  # None: no work done at all, none wasted
            ok = at4["goodput_pct_of_c"] >= 90.0 and wasted <= 5.0
            table.rows.append(["4×C: goodput ≥ 90% of C, wasted ≤ 5%", _short(name),
                               f"{at4['goodput_pct_of_c']:.0f}%, {wasted:.0f}%",
                               _met(ok)])  # fmt: skip
        rec = v["recovery_s"]
        table.rows.append(["full goodput ≤ 2 s after the spike", _short(name),
                           "never" if rec is None else f"{rec:g} s",
                           _met(rec is not None and rec <= 2.0)])  # fmt: skip
        base = variants.get("timeouts")
        low, base_low = _level(v, 0.5), None if base is None else _level(base, 0.5)
        if low is not None and base_low is not None and low["p50_ms"] and base_low["p50_ms"]:
            cost = 100.0 * (low["p50_ms"] / base_low["p50_ms"] - 1.0)
            ok = cost <= 2.0 and low["refused"] == 0
            table.rows.append(["0.5×C: p50 ≤ +2%, nothing refused", _short(name),
                               f"{cost:+.1f}%, {low['refused']} refused", _met(ok)])  # fmt: skip
    for name in ("timeouts", "timeouts+retries"):
        v = variants.get(name)
        if v is None:
            continue
        at4 = _level(v, 4.0)
        if at4 is not None:
            wasted = "-" if at4["wasted_pct"] is None else f"{at4['wasted_pct']:.0f}%"
            table.rows.append(["4×C without protection (expected to collapse)", name,
                               f"{at4['goodput_pct_of_c']:.0f}%, {wasted}", "shown"])  # fmt: skip
        rec = v["recovery_s"]
        table.rows.append(["recovers after the spike?", name,
                           f"not within {p['recover_for']:g} s" if rec is None else f"{rec:g} s",
                           "shown"])  # fmt: skip
    table.note = (
        "Variants: " + "; ".join(f"{_short(n)} = {n}" for n in variants if _short(n) != n) + "."
        if any(_short(n) != n for n in variants)
        else ""
    )
    table.note += _capacity_warning(result)
    return table


def _capacity_warning(result: dict[str, Any]) -> str:
    """A warning when some level answered well over C: C was measured low (the machine
    was busier while C was measured than later), so every share of C reads high."""
    over = [
        (name, lv["load"], lv["goodput_pct_of_c"])
        for name, v in result["variants"].items()
        for lv in v["levels"]
        if lv["goodput_pct_of_c"] > 110.0
    ]
    if not over:
        return ""
    name, load, pct = max(over, key=lambda o: o[2])
    return (
        f" Warning: goodput reached {pct:.0f}% of C ({_short(name)}, {load:g} × C): C was"
        " measured low, as on a machine busier then than during the run; shares of C, and"
        " the verdicts on them, read high. Run on a quieter machine."
    )


def _short(name: str) -> str:
    on = switches(name)
    if "deadlines" not in on:
        return name
    if not on & {"admission", "codel"}:
        return name
    return "protected" + ("+limit" if "limit" in on else "")


def _met(ok: bool) -> str:
    return "met" if ok else "missed"


def plot(result: dict[str, Any], path: str | Path) -> Path:
    """Goodput per load level (left) and goodput over time (right), one line per variant."""
    plt = report.pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    cap = result["capacity"]["capacity_per_s"]
    p = result["params"]
    for name, v in result["variants"].items():
        steps = [lv for lv in v["levels"] if lv["level"] != AFTER]
        left.plot([lv["load"] for lv in steps], [lv["goodput_per_s"] for lv in steps],
                  marker="o", label=_short(name))  # fmt: skip
        series = v["series"]
        right.plot([pt[0] for pt in series], [pt[2] for pt in series], label=_short(name))
    left.axhline(cap, color="grey", linestyle=":", label="C (measured)")
    left.set_xscale("log", base=2)
    loads = [float(x) for x in p["loads"]]
    left.set_xticks(loads, [f"{x:g}" for x in loads])
    left.set_xlabel("offered load, × C")
    left.set_ylabel("goodput, answers in time per s")
    left.set_ylim(bottom=0)
    left.legend(fontsize=8)
    right.axhline(cap, color="grey", linestyle=":", label="C (measured)")
    right.axvline(len(p["loads"]) * p["level_for"], color="grey", linestyle="--")
    right.annotate("the spike ends", (len(p["loads"]) * p["level_for"], 1.0),
                   xycoords=("data", "axes fraction"), xytext=(3, -12),
                   textcoords="offset points", fontsize=7, color="grey")  # fmt: skip
    right.set_ylim(bottom=0)
    right.set_xlabel("seconds (requests by send time; the load steps up every level)")
    right.set_ylabel("answered in time, per s sent")
    right.legend(fontsize=8)
    fig.suptitle(f"overload: goodput against load, deadline {p['deadline']:g} s")
    return report.save_figure(fig, path)
