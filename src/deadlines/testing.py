"""Test helpers: a fake monotonic clock that makes deadline logic exact.

`FakeClock` replaces the clock every `Deadline` reads. `FakeClock.run(main())` runs a
coroutine on an asyncio event loop driven by that clock, with *autojump*: whenever
every task is waiting on a timer, the clock jumps straight to the next timer, so a test
of a 30-second timeout finishes in milliseconds and measures exactly 30 s.

    clock = FakeClock()
    async def main():
        async with deadlines.scope(30):
            await asyncio.sleep(60)
    with pytest.raises(deadlines.DeadlineExceeded):
        clock.run(main())
    assert clock.now() == 30

Real I/O still works on the fake loop; while a socket is being waited on, the clock
jumps only after `autojump_threshold` seconds of real time with nothing ready.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from datetime import timedelta
from types import TracebackType
from typing import Any, TypeVar

from . import _clock, _validate

T = TypeVar("T")

__all__ = ["FakeClock"]


class FakeClock:
    """A monotonic clock that moves only when told to, or by autojump on its own loop.

    Use it as a context manager (or `install()` / `uninstall()`) to make `Deadline`,
    `deadlines.scope` and `CallBudget` read it.
    """

    def __init__(self, start: float = 1000.0, *, autojump_threshold: float = 0.0) -> None:
        self._now = float(start)
        self.autojump_threshold = _validate.seconds(autojump_threshold, "autojump_threshold")
        self._previous: Any = None

    def now(self) -> float:
        """The fake time, in seconds."""
        return self._now

    def advance(self, seconds: float | timedelta) -> None:
        """Move the clock forward by `seconds` (never backward)."""
        self._now += _validate.seconds(seconds, "seconds")

    def install(self) -> None:
        """Make this the clock that deadlines read."""
        if self._previous is not None:
            raise RuntimeError("this FakeClock is already installed")
        self._previous = _clock.install(self.now)

    def uninstall(self) -> None:
        """Restore the clock that was there before `install`."""
        if self._previous is None:
            raise RuntimeError("this FakeClock is not installed")
        _clock.install(self._previous)
        self._previous = None

    def __enter__(self) -> FakeClock:
        self.install()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.uninstall()

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        """An asyncio event loop whose time is this clock, with autojump."""
        return _FakeClockLoop(self)

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        """Run `main` on a fake-clock event loop with this clock installed."""
        installed = self._previous is None
        if installed:
            self.install()
        try:
            with asyncio.Runner(loop_factory=self.new_event_loop) as runner:
                return runner.run(main)
        finally:
            if installed:
                self.uninstall()


class _AutojumpSelector(selectors.DefaultSelector):
    """A selector that, instead of sleeping until the next timer, moves the clock there."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[tuple[Any, int]]:
        if timeout is None:  # no timer pending: only real I/O can wake the loop
            return list(super().select(None))
        if timeout <= 0:
            return list(super().select(0))
        ready = list(super().select(min(timeout, self._clock.autojump_threshold)))
        if not ready:  # every task waits on a timer: jump to the earliest one
            self._clock._now += timeout
        return ready


class _FakeClockLoop(asyncio.SelectorEventLoop):
    """An event loop that reads a `FakeClock` and lets its selector jump the clock."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(_AutojumpSelector(clock))
        self._fake_clock = clock
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._fake_clock.now()
