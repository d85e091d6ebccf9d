"""A Postgres job table whose deadlines survive the queue (asyncpg).

Jobs are rows. `JobTable.enqueue` stores the current deadline in a ``timestamptz``
column; a worker loop (`JobTable.work`) claims one job at a time with
``FOR UPDATE SKIP LOCKED`` (so any number of workers share the table without
waiting on each other), marks a job whose deadline has passed ``expired`` without
running it, and runs the rest inside their deadline, cancelled at the instant.

    table = JobTable("email_jobs")
    await table.create(conn)
    async with deadlines.scope(2.0):
        await table.enqueue(conn, {"to": "a@example.com"})      # deadline_at = now + ~2 s

    async def send(job: Job) -> None:                          # in the worker
        await mailer.send(job.payload, timeout=deadlines.remaining())

    await table.work(conn, send, default=30)

No clock skew between machines: the deadline is written as ``clock_timestamp() +
remaining`` and read back as ``deadline_at - clock_timestamp()``, both on the
database's clock, so the app hosts' wall clocks never enter into it.

Every outcome is a status, so nothing is lost: ``queued`` → ``done`` | ``failed`` |
``timeout`` (started, then hit its deadline) | ``expired`` (dropped unrun). A worker
holds the job's row lock in a transaction while the job runs (bounded by the job's
deadline): if the worker dies the transaction aborts and the job is ``queued`` again,
so delivery is at-least-once. `Job.connection` is that transaction's connection: work
done through it commits together with the ``done`` status (and is rolled back, the
status still recorded, when the job fails).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from . import _clock, _scope, _validate, jobs
from ._deadline import Deadline
from ._errors import DeadlineExceeded

__all__ = ["Job", "JobTable", "Status", "Worked"]

Status = Literal["queued", "done", "failed", "timeout", "expired"]
Handler = Callable[["Job"], Awaitable[object]]

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_ERROR_CHARS = 2000  # an error text longer than this is cut: it is for humans, not storage


@dataclass(frozen=True, slots=True)
class Job:
    """A claimed job: its row, its local deadline, and the connection holding its lock."""

    id: int
    queue: str
    payload: Any
    deadline: Deadline
    attempts: int
    connection: Any


@dataclass(frozen=True, slots=True)
class Worked:
    """What one `JobTable.work` call did, by outcome."""

    done: int = 0
    failed: int = 0
    timeout: int = 0
    expired: int = 0

    @property
    def total(self) -> int:
        """Jobs taken from the table, whatever their outcome."""
        return self.done + self.failed + self.timeout + self.expired


class JobTable:
    """One Postgres table of jobs. `name` is a plain SQL identifier (letters, digits, _)."""

    def __init__(self, name: str = "deadline_jobs") -> None:
        if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name):
            raise ValueError(f"name must be a plain SQL identifier, got {name!r}")
        self.name = name
        self._table = f'"{name}"'

    async def create(self, conn: Any) -> None:
        """Create the table and its claim index if they do not exist."""
        await conn.execute(
            f"""
            CREATE TABLE IF NOT EXISTS {self._table} (
                id bigserial PRIMARY KEY,
                queue text NOT NULL DEFAULT 'default',
                payload jsonb,
                deadline_at timestamptz,
                status text NOT NULL DEFAULT 'queued'
                    CHECK (status IN ('queued', 'done', 'failed', 'timeout', 'expired')),
                attempts integer NOT NULL DEFAULT 0,
                enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp(),
                finished_at timestamptz,
                error text
            );
            CREATE INDEX IF NOT EXISTS "{self.name}_claim" ON {self._table} (queue, id)
                WHERE status = 'queued';
            """
        )

    async def drop(self, conn: Any) -> None:
        """Drop the table (and every job in it)."""
        await conn.execute(f"DROP TABLE IF EXISTS {self._table}")

    async def enqueue(
        self,
        conn: Any,
        payload: Any = None,
        *,
        queue: str = "default",
        deadline: Deadline | float | timedelta | None = None,
    ) -> int:
        """Add a job; returns its id. Its deadline: the current one ∧ `deadline`, or none.

        A job without a deadline runs under the worker's default limit.
        """
        left = _left(deadline)
        row_id: int = await conn.fetchval(
            f"""
            INSERT INTO {self._table} (queue, payload, deadline_at)
            VALUES ($1, $2::jsonb, clock_timestamp() + make_interval(secs => $3))
            RETURNING id
            """,
            queue,
            json.dumps(payload),
            left,
        )
        return row_id

    async def status(self, conn: Any, job_id: int) -> tuple[Status, str | None]:
        """A job's status and error text (None when there is none)."""
        row = await conn.fetchrow(f"SELECT status, error FROM {self._table} WHERE id = $1", job_id)
        if row is None:
            raise LookupError(f"no job {job_id} in {self.name}")
        return row["status"], row["error"]

    async def work(
        self,
        conn: Any,
        handler: Handler,
        *,
        default: float | timedelta,
        queue: str = "default",
        maximum: float | timedelta | None = None,
        min_useful: float | timedelta = 0.0,
        poll: float | timedelta = 0.2,
        until_empty: bool = False,
        max_jobs: int | None = None,
    ) -> Worked:
        """Claim and run jobs of `queue` one at a time on `conn`, until stopped.

        Args:
            conn: An asyncpg connection, used by this worker alone.
            handler: ``async def handler(job: Job)``; runs inside the job's deadline.
            default: Limit (seconds) for a job without a deadline, or an absurd one.
            maximum: Cap on any job's deadline.
            min_useful: Mark ``expired`` a job with this little time left (or less).
            poll: Sleep between looks at an empty queue.
            until_empty: Return when no job can be claimed (instead of polling).
            max_jobs: Return after this many jobs.

        Runs until cancelled otherwise. Each outcome is recorded in the row.
        """
        limits = (
            _validate.seconds(default, "default", allow_zero=False),
            None if maximum is None else _validate.seconds(maximum, "maximum", allow_zero=False),
            _validate.seconds(min_useful, "min_useful"),
        )
        pause = _validate.seconds(poll, "poll", allow_zero=False)
        if max_jobs is not None and max_jobs < 1:
            raise ValueError(f"max_jobs must be >= 1 or None, got {max_jobs}")
        outcomes: dict[Status, int] = {"done": 0, "failed": 0, "timeout": 0, "expired": 0}
        taken = 0
        while max_jobs is None or taken < max_jobs:
            outcome = await self._one(conn, handler, queue, *limits)
            if outcome is None:
                if until_empty:
                    break
                await asyncio.sleep(pause)
                continue
            outcomes[outcome] += 1
            taken += 1
        return Worked(
            outcomes["done"], outcomes["failed"], outcomes["timeout"], outcomes["expired"]
        )

    async def _one(
        self,
        conn: Any,
        handler: Handler,
        queue: str,
        default: float,
        maximum: float | None,
        min_useful: float,
    ) -> Status | None:
        """Claim one job and settle it; None when there was nothing to claim."""
        async with conn.transaction():
            row = await conn.fetchrow(
                f"""
                UPDATE {self._table} SET attempts = attempts + 1
                WHERE id = (
                    SELECT id FROM {self._table}
                    WHERE queue = $1 AND status = 'queued'
                    ORDER BY id LIMIT 1
                    FOR UPDATE SKIP LOCKED
                )
                RETURNING id, queue, payload, attempts,
                    extract(epoch FROM deadline_at)::float8 AS wall,
                    extract(epoch FROM deadline_at - clock_timestamp())::float8 AS left
                """,
                queue,
            )
            if row is None:
                return None
            deadline, problem = _deadline(row["left"], default, maximum)
            try:
                jobs.admit(queue, deadline, row["wall"], problem, min_useful)
            except jobs.JobExpired as exc:
                await self._settle(conn, row["id"], "expired", str(exc))
                return "expired"
            job = Job(
                row["id"],
                row["queue"],
                None if row["payload"] is None else json.loads(row["payload"]),
                deadline,
                row["attempts"],
                conn,
            )
            status, error = await _run(job, handler)
            if status == "timeout":
                jobs.count(queue, exceeded=1)
            await self._settle(conn, job.id, status, error)
            return status

    async def _settle(self, conn: Any, job_id: int, status: Status, error: str | None) -> None:
        await conn.execute(
            f"""
            UPDATE {self._table} SET status = $2, error = $3, finished_at = clock_timestamp()
            WHERE id = $1
            """,
            job_id,
            status,
            None if error is None else error[:_ERROR_CHARS],
        )


async def _run(job: Job, handler: Handler) -> tuple[Status, str | None]:
    """Run the handler inside the job's deadline and a savepoint; the outcome to record."""
    try:
        # A savepoint (a failure undoes only the job's work), then the job's deadline.
        async with job.connection.transaction(), _scope.scope(deadline=job.deadline):
            await handler(job)
    except DeadlineExceeded as exc:
        return "timeout", str(exc)
    except Exception as exc:  # the job's own failure is recorded, the worker goes on
        return "failed", f"{type(exc).__name__}: {exc}"
    return "done", None


def _left(deadline: Deadline | float | timedelta | None) -> float | None:
    """Seconds left for a new job: the current deadline ∧ `deadline`, or None."""
    candidates = []
    current = _scope.current()
    if current is not None:
        candidates.append(current.remaining())
    if isinstance(deadline, Deadline):
        candidates.append(deadline.remaining())
    elif deadline is not None:
        candidates.append(_validate.seconds(deadline, "deadline"))
    return min(candidates) if candidates else None


def _deadline(
    left: float | None, default: float, maximum: float | None
) -> tuple[Deadline, jobs.Problem | None]:
    """The local deadline from the seconds the database says are left."""
    problem: jobs.Problem | None = None
    if left is None:
        problem = "missing"
    elif abs(left) > _validate.ABSURD_SECONDS:
        problem = "absurd"  # a year either way: a unit mistake, not a deadline
    deadline = Deadline.after(default) if left is None or problem else Deadline(_clock.now() + left)
    return (deadline if maximum is None else deadline.shrink(maximum)), problem
