"""`Window`: counters over the last few seconds, in a fixed ring of buckets (bounded memory).

Used by the retry budget, the adaptive throttle, the hedge cap and the rejection budget:
each asks "how many of these, and of those, in the last `window` seconds?".
"""

from __future__ import annotations

from . import _clock


class Window:
    """`counters` running totals over the last `span` seconds, `buckets` slots wide.

    Not locked: its owners hold their own lock around it.
    """

    __slots__ = ("_epoch", "_slots", "_totals", "_width")

    def __init__(self, span: float, counters: int, buckets: int = 10) -> None:
        self._width = span / buckets
        self._slots = [[0] * counters for _ in range(buckets)]
        self._totals = [0] * counters
        self._epoch = int(_clock.now() // self._width)

    def _advance(self) -> int:
        """Drop the buckets that fell out of the window; the current bucket's index."""
        epoch = int(_clock.now() // self._width)
        slots = self._slots
        steps = epoch - self._epoch
        if steps > 0:
            totals = self._totals
            for step in range(1, min(steps, len(slots)) + 1):
                slot = slots[(self._epoch + step) % len(slots)]
                for i, value in enumerate(slot):
                    totals[i] -= value
                    slot[i] = 0
            self._epoch = epoch
        return self._epoch % len(slots)

    def add(self, counter: int, amount: int = 1) -> None:
        """Count `amount` more of `counter`, now."""
        self._slots[self._advance()][counter] += amount
        self._totals[counter] += amount

    def totals(self) -> list[int]:
        """Each counter's total over the window (a copy)."""
        self._advance()
        return list(self._totals)
