"""A minimal discrete-event loop: a heap of timers, each a callback at an instant.

Hand-written rather than SimPy because the full request path measured several times
faster this way (docs/sim.md, "The engine"). Timers are small lists
``[when, seq, fn, arg]``: the sequence number makes ties fire in the order they were
scheduled (so a run is deterministic), and cancelling a timer only blanks its callback.

Most timers in this model are limits that never fire (a client's timeout, a request's
deadline: the request usually finishes first). Timers from one source with one delay
come in time order, so they can wait in a FIFO `Lane` instead of the heap: the heap
holds only each lane's first live timer, and cancelled ones are dropped from the front
of their lane in O(1). Firing order is exactly what one big heap would give.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable
from typing import Any

#: A scheduled callback; pass it to `Loop.cancel`.
Timer = list[Any]


class Lane:
    """A FIFO of timers in time order (one source, one delay), fed to the loop's heap."""

    __slots__ = ("timers",)

    def __init__(self) -> None:
        self.timers: deque[Timer] = deque()


class Loop:
    """Simulated time and the timers waiting in it."""

    __slots__ = ("_heap", "_seq", "events", "now")

    def __init__(self) -> None:
        self.now = 0.0
        self.events = 0
        self._heap: list[Timer] = []
        self._seq = 0

    def at(self, when: float, fn: Callable[[Any], object], arg: Any = None) -> Timer:
        """Call ``fn(arg)`` at simulated time `when` (not before `now`)."""
        self._seq += 1
        timer: Timer = [when if when > self.now else self.now, self._seq, fn, arg]
        heapq.heappush(self._heap, timer)
        return timer

    def after(self, delay: float, fn: Callable[[Any], object], arg: Any = None) -> Timer:
        """Call ``fn(arg)`` `delay` seconds from now."""
        return self.at(self.now + delay, fn, arg)

    def at_in(self, lane: Lane, when: float, fn: Callable[[Any], object], arg: Any) -> Timer:
        """Like `at`, queued in `lane` when that keeps the lane in time order."""
        timers = lane.timers
        if when < self.now:
            when = self.now
        if timers and when < timers[-1][0]:
            return self.at(when, fn, arg)  # out of order: the heap takes it
        self._seq += 1
        timer: Timer = [when, self._seq, fn, arg]
        timers.append(timer)
        if len(timers) == 1:
            heapq.heappush(self._heap, [when, self._seq, self._pump, lane])
        return timer

    def _pump(self, lane: Lane) -> None:
        """A lane's head is due: fire it and put the next live timer on the heap."""
        timers = lane.timers
        head = timers.popleft()
        while timers and timers[0][2] is None:
            timers.popleft()
        if timers:
            first = timers[0]
            heapq.heappush(self._heap, [first[0], first[1], self._pump, lane])
        fn = head[2]
        if fn is None:
            self.events -= 1  # the head was cancelled after its pump was scheduled
        else:
            fn(head[3])

    @staticmethod
    def cancel(timer: Timer | None) -> None:
        """Forget a timer (a no-op for None or a timer that already fired).

        Clearing the argument too breaks the owner -> timer -> owner cycle, so finished
        requests are freed by reference counting, without the cyclic collector.
        """
        if timer is not None:
            timer[2] = timer[3] = None

    def run(self, until: float) -> None:
        """Fire every timer due up to `until`, in order, then set the clock to `until`."""
        heap = self._heap
        pop = heapq.heappop
        fired = 0
        while heap and heap[0][0] <= until:
            when, _, fn, arg = pop(heap)
            if fn is None:
                continue
            self.now = when
            fired += 1
            fn(arg)
        self.events += fired
        self.now = until
