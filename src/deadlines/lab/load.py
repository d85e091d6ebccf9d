"""An open-loop load generator: requests leave on schedule, whatever the server does.

A closed loop (N users each waiting for their answer) slows down with the server and
hides a cascade. Here each request is started at its planned instant as its own task,
and a late start is caught up at once (never skipped), so the count is exact and the
achieved rate is reported beside the requested one.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

#: What a fired request reports: (HTTP status or None, error text or None).
Outcome = tuple[int | None, str | None]
Fire = Callable[[str, int], Awaitable[Outcome]]


@dataclass(slots=True)
class Shot:
    """One request: its stream, planned and actual start, end and outcome (times in s)."""

    kind: str
    index: int
    planned: float
    started: float = math.nan
    ended: float | None = None
    status: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """Answered with a 2xx status."""
        return self.status is not None and 200 <= self.status < 300

    @property
    def latency(self) -> float | None:
        """Seconds from start to end, None while still waiting."""
        return None if self.ended is None else self.ended - self.started


@dataclass
class LoadRun:
    """Every shot of one run, with times relative to the run's start."""

    rates: Mapping[str, float]
    duration: float
    shots: list[Shot] = field(default_factory=list)
    #: Each stream's ``(start, end)`` within the run.
    spans: dict[str, tuple[float, float]] = field(default_factory=dict)

    def of(self, kind: str) -> list[Shot]:
        """The shots of stream `kind`."""
        return [s for s in self.shots if s.kind == kind]

    def achieved_rate(self, kind: str) -> float:
        """Requests per second actually started for `kind`, over the planned span."""
        shots = self.of(kind)
        if len(shots) < 2:
            return float(len(shots)) / self.duration if self.duration else 0.0
        first = min(s.started for s in shots)
        last = max(s.started for s in shots)
        if last <= first:
            return math.inf
        return (len(shots) - 1) / (last - first)

    def max_lateness(self) -> float:
        """The latest any request started after its planned instant, in seconds."""
        return max((s.started - s.planned for s in self.shots), default=0.0)

    def rate_report(self) -> dict[str, Any]:
        """Requested vs achieved rate per stream, for the JSON."""
        out: dict[str, Any] = {}
        for kind, rate in self.rates.items():
            achieved = self.achieved_rate(kind)
            out[kind] = {
                "requested_per_s": rate,
                "achieved_per_s": round(achieved, 3),
                "error_pct": round(100.0 * (achieved - rate) / rate, 3) if rate else None,
                "sent": len(self.of(kind)),
            }
        out["max_start_lateness_ms"] = round(self.max_lateness() * 1000.0, 1)
        return out


def schedule(
    rates: Mapping[str, float],
    duration: float,
    spans: Mapping[str, tuple[float, float]] | None = None,
) -> list[tuple[float, str, int]]:
    """Evenly spaced start instants for each stream: ``(offset_s, kind, index)``, sorted.

    A stream runs from 0 to `duration`, or over its own ``(start, end)`` in `spans`
    (a load that steps up: one stream per step).
    """
    plan: list[tuple[float, str, int]] = []
    for kind, rate in rates.items():
        if rate < 0 or not math.isfinite(rate):
            raise ValueError(f"rate for {kind!r} must be a finite number >= 0, got {rate}")
        start, end = (spans or {}).get(kind, (0.0, duration))
        count = math.floor(rate * (end - start) + 1e-9)
        plan.extend((start + i / rate, kind, i) for i in range(count))
    plan.sort()
    return plan


async def run_open_loop(
    rates: Mapping[str, float],
    duration: float,
    fire: Fire,
    *,
    drain: float,
    wait_for: Collection[str] | None = None,
    keep_until: float = 0.0,
    on_tick: Callable[[float], None] | None = None,
    spans: Mapping[str, tuple[float, float]] | None = None,
) -> LoadRun:
    """Start `fire(kind, index)` on schedule for `duration` s; wait `drain` s for stragglers.

    The drain waits only for the streams in `wait_for` (all by default), and at least
    until `keep_until` s after the start. Requests still unanswered after it are
    cancelled (their connections closed) and keep ``ended=None``. Time zero is the first
    planned start; `on_tick(t)` is called as starts go out. `spans` gives a stream
    its own ``(start, end)`` within the run (see `schedule`).
    """
    run = LoadRun(dict(rates), duration)
    run.spans = {kind: (spans or {}).get(kind, (0.0, duration)) for kind in rates}
    loop = asyncio.get_running_loop()
    tasks: list[asyncio.Task[None]] = []
    t0 = loop.time()

    async def one(shot: Shot) -> None:
        try:
            shot.status, shot.error = await fire(shot.kind, shot.index)
        except Exception as exc:  # a failed request is a figure, not a crash
            shot.error = f"{type(exc).__name__}: {exc}"
        shot.ended = loop.time() - t0

    for offset, kind, index in schedule(rates, duration, spans):
        delay = t0 + offset - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        shot = Shot(kind, index, offset, started=loop.time() - t0)
        run.shots.append(shot)
        tasks.append(asyncio.create_task(one(shot)))
        if on_tick is not None:
            on_tick(shot.started)
    pending = [
        t
        for t, shot in zip(tasks, run.shots, strict=True)
        if not t.done() and (wait_for is None or shot.kind in wait_for)
    ]
    if pending:
        await asyncio.wait(pending, timeout=drain)
    hold = t0 + keep_until - loop.time()
    if hold > 0:
        await asyncio.sleep(hold)
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    return run
