"""Queued jobs: a deadline that survives the queue, and a worker that honours it.

A job enqueued inside a request carries the request's deadline as an **absolute
wall-clock instant** (Unix time, field `FIELD`). The worker turns it back into a local
`Deadline`, drops the job if it is already expired (nobody waits for its result any
more), and otherwise runs it inside that deadline, so its outbound calls and SQL get
the remaining budget.

    # in the request handler
    queue.put(jobs.stamp({"user": 42}))             # {"user": 42, "deadline_at": 1.7e9}

    # in the worker
    with jobs.scope(payload, default=30, queue="emails"):
        send_email(payload)                         # deadlines.remaining() is what is left

A missing, malformed or absurd field runs the job under the worker's `default` limit,
never unbounded, and is counted. An expired job raises `JobExpired` before any work,
is counted and reported (`deadlines.JobDropped`); the queue integration marks it.

Clock skew: a wall-clock deadline is only as good as the clocks of the machine that
wrote it and the one that reads it. If the worker's clock is 300 ms ahead, every job
looks 300 ms closer to its deadline (and a job may be dropped 300 ms early); behind,
later. Keep clocks synchronised (NTP: a few ms) and never use this on the wire
between live services, where time *remaining* is sent instead. A store with its own
clock avoids the skew between machines (see `deadlines.pgjobs`).
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from types import TracebackType
from typing import Any, Literal, TypeVar

from . import _clock, _events, _scope, _validate
from ._deadline import Deadline
from ._errors import DeadlineExceeded

R = TypeVar("R")

__all__ = [
    "FIELD",
    "HEADER",
    "JobCounts",
    "JobExpired",
    "arun",
    "counts",
    "deadline_at",
    "deadline_of",
    "headers",
    "reset_counts",
    "run",
    "scope",
    "stamp",
]

#: Payload key holding the deadline: Unix time in seconds (float, ms precision).
FIELD = "deadline_at"
#: Message header with the same value as a decimal string, for brokers' headers.
HEADER = "x-deadline-at"

_DECIMAL = re.compile(r"[0-9]{1,11}(\.[0-9]{1,9})?")  # ASCII only: no sign, space, exponent

Problem = Literal["missing", "malformed", "absurd"]


class JobExpired(DeadlineExceeded):
    """The job's deadline passed before it started: it was dropped without doing any work.

    Attributes: `queue`, `late` (seconds past the deadline; negative when dropped for
    having less than `min_useful` left) and `deadline_at` (the stored Unix time).
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        queue: str = "default",
        late: float = 0.0,
        deadline_at: float | None = None,
    ) -> None:
        # `message` first and every attribute optional: a result backend (Celery's)
        # rebuilds the exception from its message alone.
        self.queue = queue
        self.late = late
        self.deadline_at = deadline_at
        how = f"{late * 1000:.0f} ms past its deadline" if late >= 0 else "too close to it"
        super().__init__(
            message or f"job on queue {queue!r} dropped before running: {how}",
            limit=0.0,
            elapsed=late,
        )


# Stamping, where the job is enqueued.


def deadline_at(*, deadline: Deadline | float | timedelta | None = None) -> float | None:
    """The deadline to store: the earliest of the current one and `deadline`, as Unix time.

    `deadline` is a `Deadline` or seconds from now. None when there is neither. The
    value is rounded down to the millisecond (rounding may only shrink a budget).
    """
    candidates: list[Deadline] = []
    current = _scope.current()
    if current is not None:
        candidates.append(current)
    if isinstance(deadline, Deadline):
        candidates.append(deadline)
    elif deadline is not None:
        candidates.append(Deadline.after(_validate.seconds(deadline, "deadline")))
    if not candidates:
        return None
    return math.floor(min(candidates).to_wall() * 1000.0) / 1000.0


def stamp(
    payload: Mapping[str, Any], *, deadline: Deadline | float | timedelta | None = None
) -> dict[str, Any]:
    """A copy of `payload` with the deadline under `FIELD` (see `deadline_at`).

    Without a current deadline or `deadline`, the copy has no field and the worker
    will use its default limit. A field already in `payload` is only ever shrunk.
    """
    result = dict(payload)
    at = deadline_at(deadline=deadline)
    if at is not None:
        earlier, problem = parse(result.get(FIELD))
        result[FIELD] = at if problem is not None or earlier is None else min(at, earlier)
    return result


def headers(*, deadline: Deadline | float | timedelta | None = None) -> dict[str, str]:
    """Message headers carrying the deadline (``{HEADER: "1700000000.250"}``), or ``{}``."""
    at = deadline_at(deadline=deadline)
    return {} if at is None else {HEADER: f"{at:.3f}"}


# Reading, in the worker.


def parse(value: object) -> tuple[float | None, Problem | None]:
    """The stored Unix time, or what is wrong with it."""
    if value is None:
        return None, "missing"
    if isinstance(value, bytes | bytearray):
        try:
            value = bytes(value).decode("ascii")
        except UnicodeDecodeError:
            return None, "malformed"
    if isinstance(value, str):
        if not _DECIMAL.fullmatch(value):
            return None, "malformed"
        number = float(value)
    elif isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
        if not math.isfinite(number):
            return None, "malformed"
    else:
        return None, "malformed"
    if abs(number - time.time()) > _validate.ABSURD_SECONDS:
        return None, "absurd"  # ms given as seconds, a relative time, a zero...
    return number, None


def _lookup(source: Mapping[str, Any]) -> object:
    if FIELD in source:
        return source[FIELD]
    for key, value in source.items():
        if isinstance(key, str) and key.lower() == HEADER:
            return value
    return None


def resolve(
    source: Mapping[str, Any], default: float, maximum: float | None
) -> tuple[Deadline, float | None, Problem | None]:
    wall, problem = parse(_lookup(source))
    deadline = Deadline.after(default) if wall is None else Deadline.from_wall(wall)
    if maximum is not None:
        deadline = deadline.shrink(maximum)
    return deadline, wall, problem


def deadline_of(
    source: Mapping[str, Any],
    *,
    default: float | timedelta,
    maximum: float | timedelta | None = None,
) -> Deadline:
    """The local deadline of a job from its payload or headers (`FIELD` or `HEADER`).

    A missing, malformed or absurd value (more than a year from now either way) gives
    `default` seconds from now: never unbounded. `maximum` caps any stored deadline.
    Pure: counts nothing (`scope` does).
    """
    limit = _validate.seconds(default, "default", allow_zero=False)
    cap = None if maximum is None else _validate.seconds(maximum, "maximum", allow_zero=False)
    return resolve(source, limit, cap)[0]


# Counting.


@dataclass(frozen=True, slots=True)
class JobCounts:
    """What the workers of one queue did with the jobs they took (since the last reset).

    `started`: ran inside their deadline; `dropped`: expired before starting (not run);
    `defaulted`: started under the default limit because their deadline field was
    missing, malformed or absurd; `exceeded`: started, then hit their deadline.
    """

    started: int = 0
    dropped: int = 0
    defaulted: int = 0
    exceeded: int = 0


_counts: dict[str, JobCounts] = {}
_counts_lock = threading.Lock()


def count(queue: str, **increments: int) -> None:
    with _counts_lock:
        old = _counts.get(queue, JobCounts())
        _counts[queue] = JobCounts(
            **{
                name: getattr(old, name) + increments.get(name, 0)
                for name in ("started", "dropped", "defaulted", "exceeded")
            }
        )


def counts(queue: str | None = None) -> JobCounts:
    """The counts for `queue`, or summed over every queue; in this process."""
    with _counts_lock:
        chosen = list(_counts.values()) if queue is None else [_counts.get(queue, JobCounts())]
    return JobCounts(
        started=sum(c.started for c in chosen),
        dropped=sum(c.dropped for c in chosen),
        defaulted=sum(c.defaulted for c in chosen),
        exceeded=sum(c.exceeded for c in chosen),
    )


def reset_counts() -> None:
    """Forget every count (for tests and for exporters that read then reset)."""
    with _counts_lock:
        _counts.clear()


def drop(queue: str, deadline: Deadline, wall: float | None) -> JobExpired:
    """Count and report a job dropped before running; the error for the queue to mark it."""
    late = _clock.now() - deadline.instant
    count(queue, dropped=1)
    if _events.active():
        _events.emit(_events.JobDropped(queue, late))
    return JobExpired(queue=queue, late=late, deadline_at=wall)


def admit(
    queue: str, deadline: Deadline, wall: float | None, problem: Problem | None, min_useful: float
) -> None:
    """Raise `JobExpired` for a job that cannot run any more, else count it as started."""
    if deadline.remaining() <= min_useful:
        raise drop(queue, deadline, wall)
    count(queue, started=1, defaulted=int(problem is not None))


# Running.


class scope:
    """Run a job inside its deadline; raise `JobExpired` before the body if it expired.

        with jobs.scope(payload, default=30, queue="emails") as deadline:
            ...                      # sync: sets the deadline (outbound calls honour it)
        async with jobs.scope(payload, default=30, queue="emails"):
            ...                      # async: also cancelled at the instant

    Args:
        source: The job's payload or message headers (`FIELD` or `HEADER`).
        default: Limit in seconds when the field is missing, malformed or absurd.
        queue: Label for counts and `JobDropped` events.
        maximum: Cap on any stored deadline (a job cannot ask for more than this).
        min_useful: Drop a job with this little time left or less (it cannot finish).
    """

    __slots__ = ("_inner", "_problem", "_queue", "_wall", "deadline", "min_useful")

    def __init__(
        self,
        source: Mapping[str, Any],
        *,
        default: float | timedelta,
        queue: str = "default",
        maximum: float | timedelta | None = None,
        min_useful: float | timedelta = 0.0,
    ) -> None:
        if not isinstance(queue, str) or not queue:
            raise ValueError(f"queue must be a non-empty string, got {queue!r}")
        limit = _validate.seconds(default, "default", allow_zero=False)
        cap = None if maximum is None else _validate.seconds(maximum, "maximum", allow_zero=False)
        self.min_useful = _validate.seconds(min_useful, "min_useful")
        self._queue = queue
        #: The job's local deadline, fixed when the job is taken (before the scope is entered).
        self.deadline, self._wall, self._problem = resolve(source, limit, cap)
        self._inner = _scope.scope(deadline=self.deadline)

    def _admit(self) -> None:
        admit(self._queue, self.deadline, self._wall, self._problem, self.min_useful)

    def _exited(self, exc: BaseException | None) -> None:
        if isinstance(exc, DeadlineExceeded) or self.deadline.expired:
            count(self._queue, exceeded=1)

    def __enter__(self) -> Deadline:
        self._admit()
        self._inner.__enter__()
        return self.deadline

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._inner.__exit__(exc_type, exc, tb)
        self._exited(exc)

    async def __aenter__(self) -> Deadline:
        self._admit()
        await self._inner.__aenter__()
        return self.deadline

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self._inner.__aexit__(exc_type, exc, tb)
        except DeadlineExceeded as raised:  # the job's own deadline fired
            self._exited(raised)
            raise
        self._exited(exc)


def run(
    payload: Mapping[str, Any],
    fn: Callable[[Mapping[str, Any]], R],
    *,
    default: float | timedelta,
    queue: str = "default",
    maximum: float | timedelta | None = None,
    min_useful: float | timedelta = 0.0,
) -> R:
    """Call ``fn(payload)`` inside the job's deadline (see `scope`); `JobExpired` if too late.

    Sync code cannot be interrupted: `fn` sees the deadline (``deadlines.remaining()``,
    ``deadlines.check()``) and so do the outbound integrations it calls.
    """
    with scope(payload, default=default, queue=queue, maximum=maximum, min_useful=min_useful):
        return fn(payload)


async def arun(
    payload: Mapping[str, Any],
    fn: Callable[[Mapping[str, Any]], Awaitable[R]],
    *,
    default: float | timedelta,
    queue: str = "default",
    maximum: float | timedelta | None = None,
    min_useful: float | timedelta = 0.0,
) -> R:
    """Await ``fn(payload)`` inside the job's deadline, cancelled at the instant (see `scope`)."""
    async with scope(payload, default=default, queue=queue, maximum=maximum, min_useful=min_useful):
        return await fn(payload)
