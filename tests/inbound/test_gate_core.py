"""`deadlines.Gate` on its own: turns, the queue, CoDel, LIFO, admission, on a fake clock."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest

import deadlines
from deadlines import Admission, CoDel, Gate, GateRefusal
from deadlines.testing import FakeClock

pytestmark = pytest.mark.anyio


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    """A fake clock installed for the test (the gate's delays and deadlines read it)."""
    with FakeClock() as fake:
        yield fake


async def _queue(
    gate: Gate, route: str, arrived: float, at: float
) -> asyncio.Task[GateRefusal | None]:
    """`gate.enter` as a task, run until it waits (or is answered)."""
    task = asyncio.ensure_future(gate.enter(route, arrived, at))
    await asyncio.sleep(0)
    return task


async def _burst(gate: Gate, clock: FakeClock, count: int) -> list[GateRefusal | None]:
    """One request at work and `count` queued behind it, each served in 40 ms: what
    each queued one got."""
    now = clock.now()
    assert await gate.enter("/r", now, now + 60) is None
    burst = [await _queue(gate, "/r", now, now + 60) for _ in range(count)]
    for _ in burst:
        clock.advance(0.04)
        gate.leave("/r", now)
        await asyncio.sleep(0)
    return [t.result() for t in burst]


def _learned(service_time: float) -> Admission:
    admission = Admission(min_samples=1, rejection_budget=1.0)
    admission.observe("/r", service_time)
    return admission


async def test_without_a_limit_only_admission_applies(clock: FakeClock) -> None:
    """No limit: no queue, every request starts at once; admission sheds a short budget."""
    gate = Gate(admission=_learned(0.5))
    now = clock.now()
    assert [await gate.enter("/r", now, now + 1.0) for _ in range(100)] == [None] * 100
    assert gate.busy == 0 and gate.waiting == 0
    refusal = await gate.enter("/r", now, now + 0.2)
    assert refusal is not None and refusal.reason == "admission" and refusal.status == 503
    assert refusal.outcome == "shed" and refusal.retry_after == 1


async def test_a_turn_passes_in_arrival_order(clock: FakeClock) -> None:
    """Beyond the limit requests wait; each `leave` hands the turn to the oldest."""
    gate = Gate(limit=1)
    now = clock.now()
    assert await gate.enter("/r", now, now + 5) is None
    waiting = [await _queue(gate, "/r", now, now + 5) for _ in range(3)]
    assert gate.busy == 1 and gate.waiting == 3 and not any(t.done() for t in waiting)
    order = []
    for _ in range(3):
        gate.leave("/r", now)
        await asyncio.sleep(0)
        done = [i for i, t in enumerate(waiting) if t.done() and i not in order]
        assert len(done) == 1 and waiting[done[0]].result() is None
        order += done
    assert order == [0, 1, 2]
    gate.leave("/r", now)
    assert gate.busy == 0 and gate.waiting == 0


async def test_a_cancelled_waiter_leaves_the_queue_at_once(clock: FakeClock) -> None:
    """The caller left or the deadline passed: the waiter is gone, no turn is taken."""
    gate = Gate(limit=1)
    now = clock.now()
    assert await gate.enter("/r", now, now + 5) is None
    first, second = await _queue(gate, "/r", now, now + 5), await _queue(gate, "/r", now, now + 5)
    first.cancel()
    await asyncio.sleep(0)
    assert first.cancelled() and gate.waiting == 1 and gate.busy == 1
    gate.leave("/r", now)
    await asyncio.sleep(0)
    assert second.result() is None and gate.busy == 1
    gate.leave("/r", now)
    assert gate.busy == 0


async def test_a_turn_handed_to_a_cancelled_waiter_goes_on(clock: FakeClock) -> None:
    """Cancelled after its turn came but before it ran: the turn goes to the next one."""
    gate = Gate(limit=1)
    now = clock.now()
    assert await gate.enter("/r", now, now + 5) is None
    first, second = await _queue(gate, "/r", now, now + 5), await _queue(gate, "/r", now, now + 5)
    gate.leave("/r", now)  # the turn is handed to `first`, which has not run yet
    first.cancel()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert first.cancelled() and second.result() is None
    assert gate.busy == 1 and gate.waiting == 0


async def test_a_full_queue_refuses_at_once(clock: FakeClock) -> None:
    """Bounded memory: one more than `queue` waiters is shed with reason "queue"."""
    gate = Gate(limit=1, queue=2)
    now = clock.now()
    assert await gate.enter("/r", now, now + 5) is None
    tasks = [await _queue(gate, "/r", now, now + 5) for _ in range(2)]
    refusal = await gate.enter("/r", now, now + 5)
    assert refusal is not None and refusal.reason == "queue" and gate.waiting == 2
    for task in tasks:
        task.cancel()
    await asyncio.sleep(0)
    assert gate.waiting == 0


async def test_late_when_the_deadline_passed_in_the_queue(clock: FakeClock) -> None:
    """A turn that comes after the deadline is refused late (504), and passed on."""
    gate = Gate(limit=1)
    now = clock.now()
    assert await gate.enter("/r", now, now + 5) is None
    late, next_one = (
        await _queue(gate, "/r", now, now + 0.1),
        await _queue(gate, "/r", now, now + 5),
    )
    clock.advance(0.2)
    gate.leave("/r", now)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    refusal = late.result()
    assert refusal is not None and refusal.reason == "late" and refusal.status == 504
    assert refusal.outcome == "late"
    assert next_one.result() is None and gate.busy == 1


async def test_admission_checks_again_at_the_start(clock: FakeClock) -> None:
    """Admitted on arrival, but when its turn comes less time is left than the work takes."""
    admission = _learned(0.3)
    gate = Gate(limit=1, admission=admission)
    now = clock.now()
    assert await gate.enter("/r", now, now + 5) is None
    waiter = await _queue(gate, "/r", now, now + 0.5)
    clock.advance(0.3)
    gate.leave("/r", now)  # learns a 0.3 s service time
    await asyncio.sleep(0)
    refusal = waiter.result()
    assert refusal is not None and refusal.reason == "admission"
    assert gate.busy == 0


async def test_codel_sheds_a_standing_queue_and_serves_newest_first(clock: FakeClock) -> None:
    """After an interval in which even the shortest wait was over the target, the oldest
    waiters beyond the target are shed and the newest is served (LIFO)."""
    codel = CoDel(target=0.05, interval=0.5)
    gate = Gate(limit=1, codel=codel)
    assert gate.lifo
    t0 = clock.now()
    assert await gate.enter("/r", t0, t0 + 60) is None
    clock.advance(0.45)
    old = [await _queue(gate, "/r", clock.now(), t0 + 60) for _ in range(3)]
    clock.advance(0.1)
    gate.leave("/r", t0)  # a new interval; the last one had an empty queue
    await asyncio.sleep(0)
    assert not codel.overloaded and old[0].result() is None  # served in order
    clock.advance(0.53)
    new = [await _queue(gate, "/r", clock.now(), t0 + 60) for _ in range(2)]
    clock.advance(0.02)
    gate.leave("/r", t0)  # the interval's shortest wait was 0.1 s: a standing queue
    await asyncio.sleep(0)
    assert codel.overloaded
    shed = [t.result() for t in old[1:]]
    assert all(r is not None and r.reason == "codel" for r in shed)
    assert new[1].result() is None  # the newest
    assert not new[0].done()
    new[0].cancel()
    await asyncio.sleep(0)
    assert gate.waiting == 0 and gate.busy == 1


async def test_codel_sheds_nothing_for_a_short_burst(clock: FakeClock) -> None:
    """A burst that drains within the interval: every request is served."""
    gate = Gate(limit=1, codel=CoDel(target=0.05, interval=0.5))
    assert await _burst(gate, clock, 5) == [None] * 5


async def test_the_rejection_budget_caps_arrival_refusals(clock: FakeClock) -> None:
    """Past the budget (a share of arrivals), requests are let through."""
    admission = Admission(min_samples=1, rejection_budget=0.2)
    admission.observe("/r", 1.0)
    gate = Gate(admission=admission)
    now = clock.now()
    results = [await gate.enter("/r", now, now + 0.5) for _ in range(100)]
    refused = sum(1 for r in results if r is not None)
    assert 10 <= refused <= 20


async def test_each_refusal_is_an_event(clock: FakeClock) -> None:
    """`RequestRefused(route, reason)` for every refusal, for the metrics."""
    seen: list[deadlines.Event] = []
    unsubscribe = deadlines.observe(seen.append)
    try:
        gate = Gate(limit=1, queue=1)
        now = clock.now()
        assert await gate.enter("/r", now, now + 5) is None
        waiter = await _queue(gate, "/r", now, now + 5)
        assert await gate.enter("/r", now, now + 5) is not None
        waiter.cancel()
        await asyncio.sleep(0)
    finally:
        unsubscribe()
    assert seen == [deadlines.RequestRefused("/r", "queue")]


def test_refusal_body_says_why() -> None:
    """The 503's JSON body names the reason and the retry delay."""
    body = json.loads(GateRefusal("codel", 2).body())
    assert body == {"error": "overloaded", "reason": "codel", "retry_after_s": 2}


def test_options_are_validated() -> None:
    """CoDel needs a queue, LIFO needs CoDel; limits and types are checked."""
    with pytest.raises(ValueError, match="codel needs a limit"):
        Gate(codel=CoDel())
    with pytest.raises(ValueError, match="lifo needs codel"):
        Gate(limit=2, lifo=True)
    with pytest.raises(ValueError, match="limit"):
        Gate(limit=0)
    with pytest.raises(TypeError, match="Admission"):
        Gate(admission=0.5)  # type: ignore[arg-type]
    assert not Gate(limit=2, codel=CoDel(), lifo=False).lifo


async def test_with_a_limit_refusals_stay_within_the_budget_and_the_route_recovers(
    clock: FakeClock,
) -> None:
    """A learned time above every caller's budget: the rejection budget still lets some
    through (the start is not tested again unbudgeted), and their shorter service times
    bring the estimate down until nothing is refused."""
    admission = Admission(min_samples=1, samples=8, rejection_budget=0.2)
    for _ in range(8):
        admission.observe("/r", 1.0)
    gate = Gate(limit=8, admission=admission)
    refused = []
    for _ in range(200):
        now = clock.now()
        refusal = await gate.enter("/r", now, now + 0.5)
        refused.append(refusal is not None)
        if refusal is None:
            clock.advance(0.1)
            gate.leave("/r", now)
    assert sum(refused[:100]) <= 20
    assert admission.expected("/r") == pytest.approx(0.1)
    assert not any(refused[100:])


async def test_the_recheck_at_the_turn_is_budgeted(clock: FakeClock) -> None:
    """Refusals when the turn comes draw on the same rejection budget as arrivals."""
    admission = Admission(min_samples=1, rejection_budget=0.2)
    admission.observe("/r", 0.3)
    gate = Gate(limit=1, admission=admission)
    refused = 0
    for _ in range(50):
        now = clock.now()
        assert await gate.enter("/r", now, now + 60) is None
        waiter = await _queue(gate, "/r", now, now + 0.5)
        clock.advance(0.3)
        gate.leave("/r", now)  # 0.3 s: 0.2 s is left to the waiter
        await asyncio.sleep(0)
        refusal = waiter.result()
        if refusal is None:
            gate.leave("/r", now)
        else:
            assert refusal.reason == "admission"
            refused += 1
    assert 1 <= refused <= 20


async def test_leave_learns_only_when_told(clock: FakeClock) -> None:
    """Work cut short (deadline, caller gone, error) is no service time to learn."""
    admission = Admission(min_samples=1)
    gate = Gate(limit=1, admission=admission)
    now = clock.now()
    assert await gate.enter("/r", now, now + 5) is None
    clock.advance(0.1)
    gate.leave("/r", now, learn=False)
    assert admission.expected("/r") is None and gate.busy == 0
    assert await gate.enter("/r", now, now + 5) is None
    gate.leave("/r", now)
    assert admission.expected("/r") == pytest.approx(0.1)


async def test_codel_forgets_an_overload_after_an_idle_interval(clock: FakeClock) -> None:
    """A standing queue, then a whole interval without any request: no queue stands any
    more, and a short burst after it sheds nothing."""
    codel = CoDel(target=0.05, interval=0.5)
    gate = Gate(limit=1, codel=codel)
    assert not codel.shed(0.1)  # an interval in which even the shortest wait was 0.1 s
    clock.advance(0.5)
    assert codel.shed(0.1) and codel.overloaded  # and the next one too
    clock.advance(0.5)
    clock.advance(1.2)  # idle
    assert await _burst(gate, clock, 3) == [None] * 3
    assert not codel.overloaded


async def test_an_arrival_past_its_deadline_is_late_whatever_the_gate(clock: FakeClock) -> None:
    """504 "late", neither admission's 503 nor let through by its budget, with or
    without a limit or admission."""
    now = clock.now()
    gates = [
        Gate(),
        Gate(limit=2),
        Gate(admission=_learned(0.1)),
        Gate(admission=Admission(rejection_budget=0.0)),
        Gate(limit=2, admission=_learned(0.1)),
    ]
    for gate in gates:
        for at in (now, now - 1.0):
            refusal = await gate.enter("/r", now, at)
            assert refusal is not None and refusal.reason == "late", gate
            assert refusal.status == 504 and gate.busy == 0


def test_limit_and_queue_are_read_only() -> None:
    """Changing `limit` at run time would corrupt the count of requests at work."""
    gate = Gate(limit=2, queue=5)
    assert (gate.limit, gate.queue) == (2, 5)
    with pytest.raises(AttributeError):
        gate.limit = 3  # type: ignore[misc]
    with pytest.raises(AttributeError):
        gate.queue = 3  # type: ignore[misc]
    assert Gate().limit is None
