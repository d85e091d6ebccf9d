"""`Deadline`: an absolute instant on the monotonic clock."""

from __future__ import annotations

import math
import time
from datetime import timedelta
from functools import total_ordering
from typing import Any

from . import _clock, _validate


@total_ordering
class Deadline:
    """An immutable instant on the monotonic clock after which a result is useless.

    Build one with `Deadline.after(seconds)`; compare and combine with `<` and `min()`.
    A deadline is absolute: it does not move when it is passed around, and time spent
    anywhere (queues, pools, retries) counts against it.

        >>> d = Deadline.after(2.0)
        >>> 0 < d.remaining() <= 2.0
        True
    """

    __slots__ = ("_at",)

    def __init__(self, instant: float) -> None:
        """Wrap `instant`, a reading of the monotonic clock (see `Deadline.after`)."""
        if isinstance(instant, bool) or not isinstance(instant, int | float):
            raise TypeError(f"instant must be a float clock reading, not {instant!r}")
        if not math.isfinite(instant):
            raise ValueError(f"instant must be finite, got {instant}")
        self._at = float(instant)

    @classmethod
    def _unchecked(cls, instant: float) -> Deadline:
        """A deadline at `instant` without validation, for internal hot paths."""
        self = object.__new__(cls)
        self._at = instant
        return self

    @classmethod
    def after(cls, seconds: float | timedelta) -> Deadline:
        """The instant `seconds` from now; 0 gives an already expired deadline."""
        return cls(_clock.now() + _validate.seconds(seconds, "seconds"))

    @classmethod
    def from_wall(cls, epoch_seconds: float) -> Deadline:
        """The local deadline for a wall-clock instant (Unix time), e.g. a stored job's.

        Wall-clock deadlines are only as good as the clocks that wrote and read them:
        a skew of 300 ms between two machines moves the deadline by 300 ms. Use them
        only where a deadline must outlive a process, never on the wire.
        """
        if isinstance(epoch_seconds, bool) or not isinstance(epoch_seconds, int | float):
            raise TypeError(f"epoch_seconds must be a number, not {epoch_seconds!r}")
        if not math.isfinite(epoch_seconds):
            raise ValueError(f"epoch_seconds must be finite, got {epoch_seconds}")
        return cls(_clock.now() + (float(epoch_seconds) - time.time()))

    @property
    def instant(self) -> float:
        """The deadline as a reading of the monotonic clock."""
        return self._at

    @property
    def expired(self) -> bool:
        """Whether the instant has passed."""
        return _clock.now() >= self._at

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self._at - _clock.now())

    def remaining_ms(self) -> int:
        """Whole milliseconds left, rounded down, as sent on the wire."""
        return math.floor(self.remaining() * 1000.0)

    def to_wall(self) -> float:
        """This deadline as Unix time, for storing it (see `from_wall` for the caveat)."""
        return time.time() + (self._at - _clock.now())

    def shrink(self, seconds: float | timedelta) -> Deadline:
        """The earlier of this deadline and `seconds` from now."""
        return min(self, Deadline.after(seconds))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Deadline):
            return NotImplemented
        return self._at == other._at

    def __lt__(self, other: Any) -> bool:
        if not isinstance(other, Deadline):
            return NotImplemented
        return self._at < other._at

    def __hash__(self) -> int:
        return hash(("Deadline", self._at))

    def __repr__(self) -> str:
        return f"<Deadline in {self._at - _clock.now():.3f}s>"
