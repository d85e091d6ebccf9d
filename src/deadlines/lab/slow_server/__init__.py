"""Experiment `slow-server` (the chapter's simulation, real processes): slow is worse than down.

N backend processes sit behind a balancer that runs inside the load generator. At
`slow_at` one backend becomes `slow_factor` times slower but stays healthy. For each
policy: p50/p99 latency over time and each backend's queue.

Policies: ``round_robin``, ``least_outstanding`` (fewest requests in flight from this
balancer), and either one with ``+deadlines``: each request carries its budget
(`x-request-timeout-ms`), the client stops at it (`deadlines.scope`), and the backends
drop work whose deadline passed or whose client left.

`deadlines lab slow-server --sim` runs its simulated twin instead
(`deadlines.sim.lab_slow_server`, same parameters, same JSON plus ``"simulated": true``);
`tables` and `plot` mark such a result as simulated.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import deadlines

from ..._tools.stats import percentile
from .. import _params, chapter, report
from ..harness import Processes
from ..load import LoadRun, run_open_loop
from ..progress import Progress

if TYPE_CHECKING:
    import aiohttp  # imported where the processes run: the simulated twin needs none

POLICIES = ("round_robin", "least_outstanding", "round_robin+deadlines")
_KNOWN = {"round_robin", "least_outstanding"}


@dataclass(frozen=True)
class Params:
    """The experiment's knobs."""

    servers: int = 3
    rate: float = 90.0
    run_for: float = 7.0
    service_ms: float = 20.0
    slow_factor: float = 5.0
    slow_at: float = 1.0
    request_deadline: float = 1.0
    client_timeout: float = 3.0
    window: float = 0.5
    sample_every: float = 0.25
    policies: tuple[str, ...] = field(default=POLICIES)

    def __post_init__(self) -> None:
        known = [*_KNOWN, *(f"{k}+deadlines" for k in sorted(_KNOWN))]
        _params.check(
            self,
            known=known,
            names_field="policies",
            # deadlines.sim's own limits, for --sim; `check_processes` for real ones.
            at_most={"rate": (1e7, "the simulator's limit"),
                     "servers": (10_000, "the simulator's limit"),
                     "service_ms": (_params.HOUR * 1000, "an hour")},
            seconds=("run_for", "slow_at", "request_deadline", "client_timeout", "window",
                     "sample_every"),
        )  # fmt: skip
        if self.servers < 2:
            raise ValueError("--servers must be at least 2 (one of them becomes slow)")


#: Backend processes the lab starts at most (each is a Python process).
MOST_SERVERS = 32


def check_processes(p: Params) -> None:
    """Raise `ValueError` if `p` is more than the real processes can run (`--sim` can)."""
    if p.servers > MOST_SERVERS:
        raise ValueError(
            f"--servers must be at most {MOST_SERVERS} (each is a process; --sim has no"
            f" such limit), got {p.servers}"
        )
    _params.check_requests(p.rate * p.run_for, "--rate over --run-for")


def quick() -> Params:
    """A short run for tests."""
    return Params(run_for=3.0, client_timeout=1.5, request_deadline=0.5, window=0.5)


def _policy_seconds(p: Params) -> float:
    return p.run_for + p.client_timeout + 1.5


def expected_seconds(p: Params) -> float:
    """About how long `run` takes."""
    return len(p.policies) * _policy_seconds(p)


class Balancer:
    """Picks a backend: round robin, or the one with the fewest requests outstanding."""

    def __init__(self, urls: list[str], policy: str) -> None:
        """Balance over `urls` with `policy` (``+deadlines`` is ignored here)."""
        self.urls = urls
        self.least = policy.startswith("least_outstanding")
        self.outstanding = [0] * len(urls)
        self._next = itertools.cycle(range(len(urls)))

    def pick(self) -> int:
        """The index of the backend for the next request."""
        start = next(self._next)  # rotate ties so an idle pool is shared evenly
        if not self.least:
            return start
        n = len(self.urls)
        return min(((start + i) % n for i in range(n)), key=lambda i: self.outstanding[i])


async def _sample_queues(
    session: aiohttp.ClientSession, urls: list[str], every: float, until: float
) -> list[list[list[float]]]:
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    series: list[list[list[float]]] = [[] for _ in urls]
    n = 0
    while n * every <= until + 1e-9:
        await asyncio.sleep(max(0.0, t0 + n * every - loop.time()))
        stats = await asyncio.gather(*(_stats(session, u) for u in urls))
        for i, s in enumerate(stats):
            series[i].append([round(n * every, 3), s["queued"] + s["busy"]])
        n += 1
    return series


async def _stats(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(url + "/_stats") as resp:
        data: dict[str, Any] = await resp.json()
        return data


async def _drive(p: Params, policy: str, urls: list[str]) -> dict[str, Any]:
    import aiohttp

    with_deadlines = policy.endswith("+deadlines")
    balancer = Balancer(urls, policy)
    picked: dict[int, int] = {}
    load = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0),
        timeout=aiohttp.ClientTimeout(total=None if with_deadlines else p.client_timeout),
    )
    control = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
    header = {"x-request-timeout-ms": str(round(p.request_deadline * 1000))}

    async def fire(kind: str, index: int) -> tuple[int | None, str | None]:
        i = balancer.pick()
        picked[index] = i
        balancer.outstanding[i] += 1
        try:
            if with_deadlines:
                async with deadlines.scope(p.request_deadline):
                    return await _get(load, urls[i] + "/work", header)
            return await _get(load, urls[i] + "/work", None)
        except (TimeoutError, deadlines.DeadlineExceeded):
            return None, "timeout"
        except aiohttp.ClientError as exc:
            return None, type(exc).__name__
        finally:
            balancer.outstanding[i] -= 1

    async def slow_down() -> None:
        await asyncio.sleep(p.slow_at)
        async with control.post(f"{urls[1]}/_slow?factor={p.slow_factor:g}") as resp:
            resp.raise_for_status()

    try:
        slower = asyncio.create_task(slow_down())
        sampler = asyncio.create_task(_sample_queues(control, urls, p.sample_every, p.run_for))
        run = await run_open_loop(
            {"req": p.rate}, p.run_for, fire, drain=max(p.client_timeout, p.request_deadline) + 0.5
        )
        await slower
        queues = await sampler
        final = await asyncio.gather(*(_stats(control, u) for u in urls))
    finally:
        with contextlib.suppress(Exception):
            await load.close()
        await control.close()
    return _summarise(p, run, picked, queues, final)


async def _get(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str] | None
) -> tuple[int | None, str | None]:
    async with session.get(url, headers=headers) as resp:
        await resp.read()
        return resp.status, None


def _summarise(
    p: Params,
    run: LoadRun,
    picked: dict[int, int],
    queues: list[list[list[float]]],
    final: list[dict[str, Any]],
) -> dict[str, Any]:
    limit = max(p.client_timeout, p.request_deadline)

    def latency_ms(shot: Any) -> float:
        # A request still unanswered at the end waited at least the whole limit.
        return (shot.latency if shot.latency is not None else limit) * 1000.0

    shots = run.of("req")
    series = []
    t = 0.0
    while t < p.run_for - 1e-9:
        window = sorted(latency_ms(s) for s in shots if t <= s.planned < t + p.window)
        series.append(
            [round(t, 3), _round(percentile(window, 0.5)), _round(percentile(window, 0.99))]
        )
        t += p.window
    after = sorted(latency_ms(s) for s in shots if s.planned >= p.slow_at)
    ok_after = [s for s in shots if s.planned >= p.slow_at and s.ok]
    slow = [s for s in shots if picked.get(s.index) == 1]
    return {
        "latency_series": series,
        "queue_series": queues,
        "ok": sum(1 for s in shots if s.ok),
        "failed": sum(1 for s in shots if not s.ok),
        "p50_ms_after_slowdown": _round(percentile(after, 0.5)),
        "p99_ms_after_slowdown": _round(percentile(after, 0.99)),
        "ok_pct_after_slowdown": _round(
            100.0 * len(ok_after) / max(1, sum(1 for s in shots if s.planned >= p.slow_at))
        ),
        "share_sent_to_slow_pct": _round(100.0 * len(slow) / max(1, len(shots))),
        "queue_max": [max((pt[1] for pt in q), default=0) for q in queues],
        "served": [f["served"] for f in final],
        "wasted": [f["wasted"] for f in final],
        "dropped": [f["dropped"] for f in final],
        "load": run.rate_report(),
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def run_policy(p: Params, policy: str) -> dict[str, Any]:
    """Fresh backends for `policy`, the load, and its figures."""
    shed = ["--shed"] if policy.endswith("+deadlines") else []
    with Processes() as procs:
        backends = procs.start_all(
            [("slow_server.backend", ["--service-ms", str(p.service_ms), *shed])] * p.servers
        )
        return asyncio.run(_drive(p, policy, [b.url for b in backends]))


def run(p: Params, progress: Progress) -> dict[str, Any]:
    """Run every policy; the JSON-ready result."""
    params = {k: (list(v) if isinstance(v, tuple) else v) for k, v in p.__dict__.items()}
    result: dict[str, Any] = {"params": params, "slow_server": 1, "policies": {}}
    for policy in p.policies:
        with progress.step(f"slow-server {policy}", _policy_seconds(p)):
            result["policies"][policy] = run_policy(p, policy)
    return result


def tables(result: dict[str, Any]) -> list[report.Table]:
    """One row per policy."""
    p = result["params"]
    simulated = bool(result.get("simulated"))
    table = report.Table(
        f"slow-server{' (simulated)' if simulated else ''}: {p['servers']} backends, "
        f"{p['rate']:g} req/s; backend 1 becomes "
        f"{p['slow_factor']:g}× slower at {p['slow_at']:g} s but stays healthy",
        ["policy", "p50 after", "p99 after", "ok after", "to slow", "queue max",
         "for nobody", "shed"],
    )  # fmt: skip
    for name, v in result["policies"].items():
        table.rows.append(
            [
                name,
                report.ms(v["p50_ms_after_slowdown"]),
                report.ms(v["p99_ms_after_slowdown"]),
                f"{v['ok_pct_after_slowdown']:.1f}%",
                f"{v['share_sent_to_slow_pct']:.0f}%",
                " / ".join(str(q) for q in v["queue_max"]),
                str(sum(v["wasted"])),
                str(sum(v["dropped"])),
            ]
        )
    table.rows.append(["the chapter", "-", "-", "-", "-", "grows", "-", "-"])
    rates = ", ".join(
        f"{name} {v['load']['req']['error_pct']:+.2f}%" for name, v in result["policies"].items()
    )
    table.note = (
        "After the slowdown: p50, p99 and the share answered; 'to slow': the share sent to"
        " the slow backend; queue max per backend; 'for nobody': requests a backend served"
        " after the client had left; 'shed': dropped by deadlines. Latencies count failures"
        f" at the time they failed. Load achieved against requested: {rates}."
    )
    table.verdict = verdict(result)
    if simulated:
        table.note += (
            f" Simulated by deadlines.sim (seed {result.get('seed')}): no process was "
            "started, and no time is spent on the wire."
        )
    return [table]


def verdict(result: dict[str, Any]) -> str:
    """The measurement beside the chapter's prediction (it gives no figures)."""
    policies = result["policies"]
    slow = result["slow_server"]
    rr = policies.get("round_robin")
    if rr is None:
        return chapter.verdict(False, "round robin, the chapter's case, did not run.")
    queues = rr["queue_max"]
    others = max((q for i, q in enumerate(queues) if i != slow), default=0)
    grew = queues[slow] >= 3 * max(others, 1)
    text = (
        f"{chapter.SLOW_SERVER}. Here round robin sent the slow backend"
        f" {rr['share_sent_to_slow_pct']:.0f}% of the requests; its queue reached"
        f" {queues[slow]} (the others {others}) and p99 {report.ms(rr['p99_ms_after_slowdown'])}"
    )
    lo = policies.get("least_outstanding")
    if lo is not None:
        text += (
            f"; least outstanding sent it {lo['share_sent_to_slow_pct']:.0f}%, p99"
            f" {report.ms(lo['p99_ms_after_slowdown'])}"
        )
    return chapter.verdict(grew, text + ".")


def plot(result: dict[str, Any], path: str | Path) -> Path:
    """Per policy: p50/p99 over time (top) and each backend's queue (bottom)."""
    plt = report.pyplot()
    names = list(result["policies"])
    fig, axes = plt.subplots(2, len(names), figsize=(4.5 * len(names), 6), sharex=True,
                             sharey="row", squeeze=False)  # fmt: skip
    slow_at = result["params"]["slow_at"]
    for col, name in enumerate(names):
        v = result["policies"][name]
        top, bottom = axes[0][col], axes[1][col]
        xs = [pt[0] for pt in v["latency_series"]]
        top.plot(xs, [pt[1] for pt in v["latency_series"]], marker=".", label="p50")
        top.plot(xs, [pt[2] for pt in v["latency_series"]], marker=".", label="p99")
        top.set_title(name)
        top.set_ylabel("latency, ms")
        top.axvline(slow_at, color="grey", linestyle=":")
        top.legend(fontsize=8, loc="center right")
        for i, series in enumerate(v["queue_series"]):
            label = f"backend {i}" + (" (slow)" if i == result["slow_server"] else "")
            bottom.plot([pt[0] for pt in series], [pt[1] for pt in series], label=label)
        bottom.axvline(slow_at, color="grey", linestyle=":")
        bottom.annotate(f"backend {result['slow_server']} slows down", (slow_at, 1.0),
                        xycoords=("data", "axes fraction"), xytext=(3, -12),
                        textcoords="offset points", fontsize=7, color="grey")  # fmt: skip
        bottom.set_xlabel("seconds")
        bottom.set_ylabel("queue (waiting + in service)")
        bottom.legend(fontsize=8)
    simulated = " (simulated)" if result.get("simulated") else ""
    fig.suptitle(f"slow-server{simulated}: one backend becomes slower but stays healthy")
    return report.save_figure(fig, path)
