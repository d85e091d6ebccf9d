"""The request's deadline in a context variable, and the scope that sets and enforces it.

`scope` only ever shrinks the deadline: entering takes the minimum of the current
deadline and the new one. Its async form cancels the body at the instant (asyncio,
or trio, including both under anyio) and raises `DeadlineExceeded`; its sync form sets
the deadline for the code inside, which checks it with `check()`.
"""

from __future__ import annotations

import asyncio
import contextvars
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from . import _alarms, _clock, _loop, _validate
from ._deadline import Deadline
from ._errors import DeadlineExceeded, Phase

P = ParamSpec("P")
R = TypeVar("R")


class Frame:
    """What the context holds: the deadline's instant and how it was made, for errors.

    The `Deadline` object itself is made only when somebody asks (`current()`): most
    requests never do, and the hot paths read `at`.
    """

    __slots__ = ("_deadline", "at", "budget", "cut", "started")

    def __init__(
        self, at: float, budget: float, started: float, deadline: Deadline | None = None
    ) -> None:
        self.at = at  # the clock instant of the deadline
        self.budget = budget  # seconds the binding scope was given when it was entered
        self.started = started  # clock reading when it was entered
        self._deadline = deadline
        # The outbound call this deadline cut short, noted by `CallBudget.finish`, so
        # the scope's `DeadlineExceeded` can say which dependency and phase it stopped.
        self.cut: Cut | None = None

    def remaining(self) -> float:
        """Seconds left before the deadline, never negative (`Deadline.remaining`)."""
        left = self.at - _clock.now()
        return left if left > 0.0 else 0.0

    @property
    def deadline(self) -> Deadline:
        """The deadline as a `Deadline` (the one the scope was given, if it was)."""
        deadline = self._deadline
        if deadline is None:
            deadline = self._deadline = Deadline._unchecked(self.at)
        return deadline


@dataclass(frozen=True, slots=True)
class Cut:
    """Where a call was when the deadline's cancellation reached it."""

    dependency: str
    phase: Phase | None
    request_sent: bool
    pool_wait: float | None


frame_var: contextvars.ContextVar[Frame | None] = contextvars.ContextVar(
    "deadlines.frame", default=None
)


def current() -> Deadline | None:
    """The deadline of the current request or scope, or None when there is none."""
    frame = frame_var.get()
    return None if frame is None else frame.deadline


def remaining() -> float:
    """Seconds left before the current deadline (never negative); `math.inf` without one."""
    frame = frame_var.get()
    return math.inf if frame is None else frame.remaining()


def check() -> None:
    """Raise `DeadlineExceeded` if the current deadline has passed.

    Sync code cannot be interrupted; call this between steps of long work.
    """
    frame = frame_var.get()
    if frame is not None and _clock.now() >= frame.at:
        raise exceeded(frame)


def carry(fn: Callable[P, R]) -> Callable[P, R]:
    """Wrap `fn` to run in a copy of the current context, deadline included.

    `asyncio.to_thread` copies the context by itself; `loop.run_in_executor`,
    `ThreadPoolExecutor.submit` and `threading.Thread` do not. Pass `carry(fn)` to them.
    """
    context = contextvars.copy_context()

    def carried(*args: P.args, **kwargs: P.kwargs) -> R:
        return context.copy().run(fn, *args, **kwargs)

    return carried


def exceeded(frame: Frame) -> DeadlineExceeded:
    elapsed = _clock.now() - frame.started
    cut = frame.cut
    if cut is None:
        return DeadlineExceeded(limit=frame.budget, elapsed=elapsed)
    return DeadlineExceeded(
        limit=frame.budget,
        elapsed=elapsed,
        phase=cut.phase,
        dependency=cut.dependency,
        request_sent=cut.request_sent,
        pool_wait=cut.pool_wait,
    )


class scope:
    """Run a block under a deadline: `seconds` from entry, or an absolute `deadline`.

    The effective deadline is the earliest of the current one, `seconds` from entry and
    `deadline`; with neither given, the block inherits the current deadline. As
    `async with` the body is cancelled at the instant and `DeadlineExceeded` is raised
    out of the scope whose deadline fired; a cancellation from elsewhere passes through
    untouched. As `with` it only sets the deadline (see `check`).

        async with deadlines.scope(2.0):
            await fetch_price()       # cancelled when the 2 s are up

    Tasks created inside the scope, and `asyncio.to_thread`, inherit its deadline.
    """

    __slots__ = ("_budget", "_canceller", "_deadline", "_entered", "_frame", "_timeout", "_token")

    def __init__(
        self, seconds: float | timedelta | None = None, *, deadline: Deadline | None = None
    ) -> None:
        self._budget = None if seconds is None else _validate.seconds(seconds, "seconds")
        if deadline is not None and not isinstance(deadline, Deadline):
            raise TypeError(f"deadline must be a Deadline, not {deadline!r}")
        self._deadline = deadline
        self._entered = False
        self._frame: Frame | None = None
        self._token: contextvars.Token[Frame | None] | None = None
        self._timeout: _alarms.Timeout | None = None  # the asyncio canceller, inline
        self._canceller: Canceller | None = None  # trio's

    @property
    def deadline(self) -> Deadline | None:
        """The effective deadline inside the block (None before entry or without one)."""
        return None if self._frame is None else self._frame.deadline

    def _enter(self) -> Deadline | None:
        if self._entered:
            raise RuntimeError("a deadlines.scope can be entered only once")
        self._entered = True
        frame = frame_var.get()
        budget, given = self._budget, self._deadline
        if budget is not None or given is not None:
            start = _clock.now()
            if budget is not None:
                at = start + budget
                if frame is None or at < frame.at:
                    frame = Frame(at, budget, start)
            if given is not None and (frame is None or given._at < frame.at):
                frame = Frame(given._at, max(0.0, given._at - start), start, given)
        self._frame = frame
        self._token = frame_var.set(frame)
        return None if frame is None else frame.deadline

    def _exit(self) -> None:
        if self._token is not None:
            frame_var.reset(self._token)
            self._token = None

    def __enter__(self) -> Deadline | None:
        return self._enter()

    def __exit__(self, *exc_info: object) -> None:
        self._exit()

    async def __aenter__(self) -> Deadline | None:
        deadline = self._enter()
        if deadline is not None:
            assert self._frame is not None
            # What remains, not the frame's start: the binding frame may be an outer one
            # entered long ago (a sync scope arms no timer of its own).
            left = self._frame.remaining()
            try:
                loop = _loop.running()
                if loop is not None:  # the common case, inline
                    timeout = _alarms.Timeout(loop.time() + left)
                    timeout.enter(loop)
                    self._timeout = timeout
                else:
                    self._canceller = Canceller.start(left)
            except BaseException:
                self._exit()
                raise
        return deadline

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        token, self._token = self._token, None
        assert token is not None
        timeout, canceller = self._timeout, self._canceller
        try:
            if timeout is not None:
                fired = timeout.leave(exc_type)
            elif canceller is not None:
                fired = canceller.stop(exc_type, exc)
            else:  # no deadline: nothing was armed
                fired = False
        finally:
            frame_var.reset(token)
        if fired:
            assert self._frame is not None
            raise exceeded(self._frame) from None
        return False


class Canceller:
    """Cancels the current task at an instant: asyncio's Timeout or a trio CancelScope."""

    __slots__ = ("cancel_scope", "timeout")

    def __init__(self) -> None:
        self.timeout: _alarms.Timeout | None = None
        self.cancel_scope: Any = None

    @classmethod
    def start(cls, seconds: float) -> Canceller:
        """Arm a canceller `seconds` from now in the running task."""
        self = cls()
        loop = _loop.running()
        if loop is not None:
            self.timeout = _alarms.Timeout(loop.time() + seconds)
            self.timeout.enter(loop)
            return self
        trio = running_trio()
        if trio is None:
            raise RuntimeError("deadlines.scope needs a running asyncio or trio event loop")
        self.cancel_scope = trio.CancelScope(deadline=trio.current_time() + seconds)
        self.cancel_scope.__enter__()
        return self

    def stop(self, exc_type: type[BaseException] | None, exc: BaseException | None) -> bool:
        """Disarm; True when this canceller's own cancellation ended the body."""
        if self.cancel_scope is not None:
            self.cancel_scope.__exit__(exc_type, exc, None if exc is None else exc.__traceback__)
            return bool(self.cancel_scope.cancelled_caught)
        assert self.timeout is not None
        return self.timeout.leave(exc_type)


def running_trio() -> Any:
    """The trio module if the current task runs under trio, else None (no import)."""
    trio = sys.modules.get("trio")
    if trio is None or asyncio._get_running_loop() is not None:
        return None
    try:
        trio.lowlevel.current_task()
    except RuntimeError:
        return None
    return trio
