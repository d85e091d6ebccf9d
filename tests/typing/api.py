"""Never executed: type-checked by mypy in CI to pin the public surface's types."""

from __future__ import annotations

import math
from datetime import timedelta

import deadlines
from deadlines import CallBudget, Deadline, Dependency, Retry, wire


async def surface() -> None:
    d: Deadline = Deadline.after(1.5)
    d2: Deadline = Deadline.after(timedelta(seconds=1))
    left: float = d.remaining()
    ms: int = d2.remaining_ms()
    wall: float = d.to_wall()
    back: Deadline = Deadline.from_wall(wall)
    earliest: Deadline = min(d, back)
    now: Deadline | None = deadlines.current()
    rest: float = deadlines.remaining()
    assert rest <= math.inf and left >= 0 and ms >= 0 and earliest and now is None
    async with deadlines.scope(2.0) as inner:
        maybe: Deadline | None = inner
        assert maybe is not None
    with deadlines.scope(deadline=d):
        deadlines.check()
    dep = Dependency("pricing", connect=timedelta(seconds=1), total=0.5, retry=Retry())
    budget = CallBudget(dep)
    seconds: float = budget.limit("headers")
    err: TimeoutError = budget.timeout("connect", request_sent=False)
    header: str = budget.header_ms()
    assert seconds and err and header
    value: float = wire.inbound_budget({"x-request-timeout-ms": "100"}, default=1, maximum=2)
    parsed: float | None = wire.parse_grpc_timeout(b"100m")
    assert value and parsed
    unsubscribe = deadlines.observe(lambda event: None)
    unsubscribe()
    fn = deadlines.carry(len)
    n: int = fn("abc")
    assert n


def overload() -> None:
    dep = Dependency(
        "pricing",
        retry=Retry(),
        retry_budget=deadlines.RetryBudget(percent=0.1, min_per_second=1, window=10),
        throttle=deadlines.Throttle(k=2.0, window=timedelta(minutes=2)),
        limit=deadlines.AdaptiveLimit(initial=10, max_limit=50),
        hedge=deadlines.Hedge(quantile=0.95, percent=0.05, min_per_second=1.0),
    )
    assert dep.limit is not None
    now: int = dep.limit.limit
    estimate = deadlines.LatencyEstimate(128)
    estimate.add(0.1)
    p95: float | None = estimate.quantile(0.95)
    admission = deadlines.Admission(rejection_budget=0.2)
    decision: deadlines.Decision = admission.decide("/quote", 0.5)
    admission.observe("/quote", timedelta(milliseconds=120))
    retry_after: int = admission.retry_after("/quote")
    shed: bool = deadlines.CoDel(target=0.005, interval=0.1).shed(0.02)
    try:
        CallBudget(dep)
    except deadlines.CallRefused as exc:
        reason: str = exc.reason
        assert reason
    assert now and p95 and decision and retry_after and shed


async def gate() -> None:
    """The inbound gate and its refusals."""
    gate = deadlines.Gate(
        limit=4,
        queue=100,
        admission=deadlines.Admission(),
        codel=deadlines.CoDel(target=0.05, interval=0.5),
        lifo=True,
    )
    refusal: deadlines.GateRefusal | None = await gate.enter("/quote", 0.0, 1.0)
    if refusal is not None:
        reason: deadlines.GateReason = refusal.reason
        status: int = refusal.status
        body: bytes = refusal.body()
        assert reason and status and body and refusal.retry_after
    else:
        gate.leave("/quote", 0.0)
    event = deadlines.RequestRefused("/quote", "codel")
    assert event.reason and gate.busy >= 0 and gate.waiting >= 0
