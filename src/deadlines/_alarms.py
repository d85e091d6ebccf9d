"""`Timeout`: asyncio.Timeout's contract on one shared timer per event loop; the loop's
`LoopClock` runs any other `Alarm` the same way (the ASGI middleware's late arming).

``asyncio.timeout`` arms a `TimerHandle` of its own for every block and cancels it on
the way out. A service under load enters thousands of such blocks a second (one per
request, more per outbound call), nearly all of which end long before their deadline,
so it pays for a timer object, a heap push and a cancelled entry in the loop's heap
every time. Here every armed `Timeout` of a loop is an entry in one heap of ours, and
the loop holds a single timer: the one for the earliest live entry. Leaving a block
only marks its entry dead; dead entries are dropped when they reach the top, or all at
once when they outnumber the live ones, and the loop's timer, when it fires at an
instant whose entry has gone, simply re-arms itself for the earliest live one.
Precision is the loop's own: the same `call_at`, one timer.

The contract is asyncio's: the task is cancelled at `when`, and the block raises
`TimeoutError` when that cancellation (and no other) ended it.

`benchmarks/timers.py` measures this against ``asyncio.timeout_at``: the cost of a
block left long before its deadline, and how late 10,000 deadlines expiring together
are delivered.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import weakref
from heapq import heapify, heappop, heappush
from types import TracebackType
from typing import Any, Final, Protocol

from . import _loop

__all__ = ["Alarm", "LoopClock", "Timeout", "clock_for"]

_CREATED, _ENTERED, _EXPIRING, _EXPIRED, _EXITED = range(5)
_STATE_NAMES: Final = ("created", "active", "expiring", "expired", "finished")
# A loop timer may run up to the clock's resolution early (asyncio's own rule).
_RESOLUTION: Final = time.get_clock_info("monotonic").resolution
_SWEEP_AT: Final = 128  # dead entries from which they are swept in bulk (if > 3x live)

_order = itertools.count()  # ties in `when` keep arrival order; entries never compare alarms


class Alarm(Protocol):
    """What a `LoopClock` runs at its instant."""

    def fire(self) -> None:
        """Called once, from the loop, at (or just after) the instant armed for."""


class Timeout:
    """Cancel the current task at loop time `when` (None: never, until `reschedule`).

    Used as ``async with``, like ``asyncio.timeout_at``; `enter` and `leave` are the
    same steps without a coroutine, for callers that are context managers themselves.
    """

    __slots__ = ("_cancelling", "_clock", "_entry", "_state", "_task", "_when")

    def __init__(self, when: float | None) -> None:
        self._when = when
        self._state = _CREATED
        self._task: asyncio.Task[Any] | None = None
        self._cancelling = 0
        self._clock: LoopClock | None = None
        self._entry: list[Any] | None = None

    def when(self) -> float | None:
        """The loop time at which the task is cancelled, or None."""
        return self._when

    def expired(self) -> bool:
        """Whether this timeout fired (its cancellation is on its way or was delivered)."""
        return self._state == _EXPIRING or self._state == _EXPIRED

    def enter(self, loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any] | None = None) -> None:
        """Arm for `task`, by default the current task of `loop` (the running loop)."""
        if self._state != _CREATED:
            raise RuntimeError("a Timeout can be entered only once")
        if task is None:
            task = _loop.current_task(loop)
        if task is None:
            raise RuntimeError("a Timeout must be used inside a task")
        self._state = _ENTERED
        self._task = task
        self._cancelling = task.cancelling()
        clock = self._clock = clock_for(loop)
        if self._when is not None:
            self._entry = clock.arm(self._when, self)

    def reschedule(self, when: float | None) -> None:
        """Move the instant (None: never) while the block runs."""
        if self._state != _ENTERED:
            raise RuntimeError(f"cannot reschedule a {_STATE_NAMES[self._state]} Timeout")
        assert self._clock is not None
        if self._entry is not None:
            self._clock.disarm(self._entry)
            self._entry = None
        self._when = when
        if when is not None:
            self._entry = self._clock.arm(when, self)

    def leave(self, exc_type: type[BaseException] | None) -> bool:
        """Disarm; True when this timeout's own cancellation ended the block.

        True means the caller should raise its timeout error: the cancellation was ours,
        no other cancellation is pending, and it reached the block (``CancelledError``).
        """
        state = self._state
        if state == _ENTERED:
            self._state = _EXITED
            if self._entry is not None:
                assert self._clock is not None
                self._clock.disarm(self._entry)
                self._entry = None
            self._task = None
            return False
        if state != _EXPIRING:
            raise RuntimeError(f"cannot leave a {_STATE_NAMES[state]} Timeout")
        self._state = _EXPIRED
        task, self._task = self._task, None
        assert task is not None
        return task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError

    def fire(self) -> None:
        """Called by the loop clock at `when`: cancel the task (`Alarm`)."""
        self._entry = None
        self._state = _EXPIRING
        assert self._task is not None
        self._task.cancel()

    async def __aenter__(self) -> Timeout:
        loop = _loop.running()
        if loop is None:
            raise RuntimeError("a Timeout needs a running asyncio loop")
        self.enter(loop)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.leave(exc_type):
            raise TimeoutError from exc

    def __repr__(self) -> str:
        return f"<deadlines Timeout [{_STATE_NAMES[self._state]}] when={self._when}>"


class LoopClock:
    """The heap of armed alarms of one loop, and the loop timer for the earliest one.

    Entries are ``[when, order, alarm]`` lists; a dead entry (disarmed, or fired) has
    ``None`` for its alarm. Lists compare by (when, order), which is unique, so alarms
    are never compared. `live` counts the armed ones.
    """

    __slots__ = ("__weakref__", "_at", "_dead", "_handle", "_heap", "_loop", "live")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weak: the clocks dictionary is keyed by the loop and must not keep it alive.
        # (A pending `_handle`, and a live entry's task, still lead back to the loop:
        # `clock_for` drops those clocks once their loop is closed.)
        self._loop = weakref.ref(loop)
        self._heap: list[list[Any]] = []
        self.live = 0
        self._dead = 0  # entries left in the heap after their block ended
        self._handle: asyncio.Handle | None = None
        self._at = 0.0  # when `_handle` runs

    def arm(self, when: float, alarm: Alarm) -> list[Any]:
        """Run ``alarm.fire()`` at loop time `when`; the entry to `disarm` it with."""
        entry = [when, next(_order), alarm]
        heappush(self._heap, entry)
        self.live += 1
        if self._handle is None or when < self._at:
            self._schedule(when)
        return entry

    def disarm(self, entry: list[Any]) -> None:
        """Take back an entry `arm` gave that has not fired."""
        # Only marked: a dead entry leaves the heap when it reaches the top as the loop
        # timer runs, or in a bulk sweep once the dead outnumber the live 3:1 (amortized
        # O(1) per block; popping here would cost every block a heap walk).
        entry[2] = None
        self.live -= 1
        dead = self._dead = self._dead + 1
        if dead >= _SWEEP_AT and dead > 3 * self.live:
            self._heap = [e for e in self._heap if e[2] is not None]
            heapify(self._heap)
            self._dead = 0

    def _schedule(self, when: float) -> None:
        loop = self._loop()
        if loop is None:
            return
        if self._handle is not None:
            self._handle.cancel()
        self._at = when
        if when <= loop.time():  # as asyncio: before whatever the task does next
            self._handle = loop.call_soon(self._run)
        else:
            self._handle = loop.call_at(when, self._run)

    def _run(self) -> None:
        self._handle = None
        loop = self._loop()
        if loop is None:
            return
        due = loop.time() + _RESOLUTION
        while self._heap:
            heap = self._heap  # read anew each time: disarming may compact it
            entry = heap[0]
            alarm = entry[2]
            if alarm is None:
                heappop(heap)
                self._dead -= 1
                continue
            if entry[0] > due:
                self._schedule(entry[0])
                return
            heappop(heap)
            entry[2] = None
            self.live -= 1
            alarm.fire()

    def close(self) -> None:
        """The loop is closed: let go of its timer and of the tasks in the heap."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._heap = []
        self.live = self._dead = 0


# Weak keys alone do not free a loop: a clock's pending timer handle (and a live entry's
# task) refers to its loop, so an entry whose block was left before it fired would keep
# the loop for good. A loop not seen before therefore first clears out the clocks of
# closed loops. Until a new loop comes along, the last one seen stays referenced even
# once closed (by its entry and by `_recent`): one loop at most, and the fast path
# stays a single check.
_clocks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopClock] = (
    weakref.WeakKeyDictionary()
)
_clocks_lock = threading.Lock()
# The clock last asked for, by any thread: most processes run one loop. A global, as
# `_loop.running()` keeps its loop; threads with loops of their own that take turns
# go to the dictionary.
_recent: LoopClock | None = None


def clock_for(loop: asyncio.AbstractEventLoop) -> LoopClock:
    """The clock of `loop`, made on first use."""
    global _recent
    clock = _recent
    if clock is not None and clock._loop() is loop:
        return clock
    with _clocks_lock:
        clock = _clocks.get(loop)
        if clock is None:
            _loop.forget_closed(_clocks, LoopClock.close)
            clock = _clocks[loop] = LoopClock(loop)
    _recent = clock
    return clock
