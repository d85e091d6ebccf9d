"""`Gate`: the waiting room in front of a service's handlers.

The inbound middlewares (ASGI under asyncio, aiohttp.web) take one as ``gate=``. It
decides, for each request, whether it is worth starting, and when: `Admission` at
arrival and again when its turn comes, at most `limit` requests at work and the others
waiting in a bounded queue, `CoDel` on each request's time in the queue, newest first
while the queue stands. The middlewares keep only their framework's input and output:
the refusal's answer, and the caller leaving or the deadline passing while a request
waits (both cancel the waiting task, which leaves the queue at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque

from . import _clock, _events, _validate
from ._admission import Admission
from ._codel import CoDel
from ._events import GateReason, RequestOutcome, RequestRefused


class GateRefusal:
    """A request the gate did not let through: why, and what to answer.

    `status` is 504 for ``"late"`` (the middleware answers with its usual timeout
    body), 503 for the others (`body`, with a ``Retry-After`` of `retry_after`
    seconds); `outcome` is the request's outcome in the metrics, ``"late"`` or
    ``"shed"``.
    """

    __slots__ = ("reason", "retry_after")

    def __init__(self, reason: GateReason, retry_after: int) -> None:
        self.reason: GateReason = reason
        self.retry_after = retry_after

    @property
    def status(self) -> int:
        """The HTTP status to answer: 504 when late, else 503."""
        return 504 if self.reason == "late" else 503

    @property
    def outcome(self) -> RequestOutcome:
        """The request's outcome: ``"late"`` or ``"shed"``."""
        return "late" if self.reason == "late" else "shed"

    def body(self) -> bytes:
        """The 503's short JSON body: that the request was shed, and why."""
        return json.dumps(
            {"error": "overloaded", "reason": self.reason, "retry_after_s": self.retry_after},
            separators=(",", ":"),
        ).encode()

    def __repr__(self) -> str:
        return f"GateRefusal({self.reason!r}, retry_after={self.retry_after})"


class _Waiter:
    """A request in the queue: when it arrived, and the future its turn resolves."""

    __slots__ = ("arrived", "turn")

    def __init__(self, arrived: float, turn: asyncio.Future[GateReason | None]) -> None:
        self.arrived = arrived
        self.turn = turn


class Gate:
    """The waiting room in front of the handlers: who starts, when, and who is refused.

        gate = deadlines.Gate(limit=8, admission=deadlines.Admission(),
                              codel=deadlines.CoDel(target=0.05, interval=0.5))
        app = DeadlineMiddleware(app, default=2.0, maximum=10.0, gate=gate)

    Args:
        limit: The most requests at work at once; beyond it requests wait in a queue.
            None (the default): no limit and no queue; only `admission` applies.
        queue: The most requests waiting; one more is refused at once (``"queue"``).
        admission: Refuses, at arrival and again when the request's turn comes, a
            request with less time left than its route's usual service time (learned
            here from each handler's start to its end). An arrival already past its
            deadline is refused ``"late"`` (504), with or without admission.
        codel: Sheds requests that waited too long (from arrival to their turn) while
            a queue stands. Needs a `limit`: without one nothing waits.
        lifo: While `codel` sees a standing queue, serve the newest request first: its
            caller is the likeliest to be still waiting (Facebook's adaptive LIFO).
            Needs `codel`; None (the default): on when `codel` is given.

    A request refused never reaches the handler. A waiting request whose caller leaves,
    or whose deadline passes, is cancelled by its middleware and leaves the queue at
    once (under ASGI, one with ``Expect: 100-continue`` notices its caller leaving only
    at its turn: reading would send the ``100 Continue``). Memory is bounded: at most
    `queue` waiters (each may hold up to the ASGI middleware's `read_ahead` of body),
    and the learned service times of `Admission.max_routes` routes.

    Admission learns per route label, not per method (``GET`` and ``POST`` on one path
    share an estimate), and only from work that ended with an answer. Its refusals,
    on arrival and at the turn after a wait, stay within its rejection budget.

    One gate serves one event loop (asyncio): it is not thread-safe, and its waiters
    are futures of the loop they were made on. Give each worker process or loop its own.
    A handler that blocks the loop from its first instruction (CPU work, no ``await``)
    hides from the gate the requests that arrive meanwhile: let the loop turn first.
    """

    __slots__ = ("_busy", "_limit", "_queue", "_waiting", "admission", "codel", "lifo")

    def __init__(
        self,
        *,
        limit: int | None = None,
        queue: int = 1000,
        admission: Admission | None = None,
        codel: CoDel | None = None,
        lifo: bool | None = None,
    ) -> None:
        self._limit = None if limit is None else _validate.count(limit, "limit")
        self._queue = _validate.count(queue, "queue", high=1_000_000)
        if admission is not None and not isinstance(admission, Admission):
            raise TypeError(f"admission must be a deadlines.Admission, not {admission!r}")
        if codel is not None and not isinstance(codel, CoDel):
            raise TypeError(f"codel must be a deadlines.CoDel, not {codel!r}")
        if codel is not None and limit is None:
            raise ValueError("codel needs a limit: without one no request waits in a queue")
        if lifo and codel is None:
            raise ValueError("lifo needs codel: it serves newest first while codel sees a queue")
        self.admission = admission
        self.codel = codel
        self.lifo = codel is not None if lifo is None else lifo
        self._busy = 0  # requests at work (or handed a turn they have not taken yet)
        self._waiting: deque[_Waiter] = deque()

    @property
    def limit(self) -> int | None:
        """The most requests at work at once; None: no limit (read-only)."""
        return self._limit

    @property
    def queue(self) -> int:
        """The most requests waiting (read-only)."""
        return self._queue

    @property
    def busy(self) -> int:
        """How many requests are at work (with a `limit`; else always 0)."""
        return self._busy

    @property
    def waiting(self) -> int:
        """How many requests wait in the queue."""
        return len(self._waiting)

    async def enter(self, route: str, arrived: float, at: float) -> GateRefusal | None:
        """Let a request on `route` (arrived at `arrived`, due at `at`, both on the
        deadline's clock) through: None once its work may start, else why not.

        After None, call `leave` when the work ends, whatever the outcome. Cancelled
        while it waits (the caller left, the deadline passed), the request leaves the
        queue, and a turn it was handed goes to the next one.
        """
        left = at - _clock.now()
        if left <= 0.0:  # not worth starting, whatever the budgets
            return self._refuse("late", route)
        admission = self.admission
        if admission is not None and admission.decide(route, left) != "admit":
            return self._refuse("admission", route)
        limit = self._limit
        if limit is None:
            return None
        if self._busy < limit and not self._waiting:
            # No wait: the arrival's tests just ran (admission again would refuse
            # outside its budget), only CoDel's turn to see the (zero) queue delay.
            self._busy += 1
            reason = self._shed(arrived)
        elif len(self._waiting) >= self._queue:
            return self._refuse("queue", route)
        else:
            reason = await self._wait(arrived)
            if reason is not None:  # shed from the queue: it held no turn
                return self._refuse(reason, route)
            reason = self._check_start(route, at)
        if reason is not None:
            self._release()
            return self._refuse(reason, route)
        return None

    def leave(self, route: str, started: float, *, learn: bool = True) -> None:
        """The work of a request let through (at `started`) ended: give its turn to the
        next request and, when `learn` (the work ended normally, with an answer), learn
        its service time. Work cut short (its deadline, its caller leaving, an error)
        says nothing of the route's service time: pass ``learn=False``."""
        if learn and self.admission is not None:
            self.admission.observe(route, max(0.0, _clock.now() - started))
        if self._limit is not None:
            self._release()

    async def _wait(self, arrived: float) -> GateReason | None:
        """Queue until a turn comes (None: it holds one) or CoDel sheds the request."""
        waiter = _Waiter(arrived, asyncio.get_running_loop().create_future())
        self._waiting.append(waiter)
        try:
            return await waiter.turn
        except BaseException:
            turn = waiter.turn
            if turn.done() and not turn.cancelled():
                if turn.result() is None:
                    self._release()  # handed a turn it will not take: the next one's
            else:
                with contextlib.suppress(ValueError):  # `_release` may have dropped it
                    self._waiting.remove(waiter)
            raise

    def _check_start(self, route: str, at: float) -> GateReason | None:
        """At the turn after a wait: late, or too little time left for the route (a
        refusal the rejection budget allows)."""
        left = at - _clock.now()
        if left <= 0.0:
            return "late"
        admission = self.admission
        if admission is not None and admission.recheck(route, left) != "admit":
            return "admission"
        return None

    def _shed(self, arrived: float) -> GateReason | None:
        codel = self.codel
        if codel is not None and codel.shed(_clock.now() - arrived):
            return "codel"
        return None

    def _release(self) -> None:
        """A turn is free: hand it on, first shedding the oldest waiters CoDel refuses.

        The oldest waiter's delay is what CoDel measures (a queue stands while even the
        oldest left waited more than the target); while it stands and `lifo` is set,
        the newest waiter gets the turn.
        """
        self._busy -= 1
        waiting, limit, codel = self._waiting, self._limit, self.codel
        assert limit is not None
        while waiting and self._busy < limit:
            oldest = waiting[0]
            if oldest.turn.done():  # cancelled: its task is on its way out
                waiting.popleft()
                continue
            reason = self._shed(oldest.arrived)
            if reason is not None:
                waiting.popleft()
                oldest.turn.set_result(reason)
                continue
            newest_first = self.lifo and codel is not None and codel.overloaded
            waiter = waiting.pop() if newest_first else waiting.popleft()
            if waiter.turn.done():
                continue
            self._busy += 1
            waiter.turn.set_result(None)

    def _refuse(self, reason: GateReason, route: str) -> GateRefusal:
        if _events.observers:
            _events.emit(RequestRefused(route, reason))
        admission = self.admission
        return GateRefusal(reason, 1 if admission is None else admission.retry_after(route))

    def __repr__(self) -> str:
        return (
            f"Gate(limit={self._limit}, busy={self._busy}, waiting={len(self._waiting)},"
            f" lifo={self.lifo})"
        )
