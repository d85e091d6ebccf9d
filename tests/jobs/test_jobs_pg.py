"""`deadlines.pgjobs`: a Postgres job table end to end (asyncpg, Postgres on loopback).

Each test gets its own table (unique name) and drops it. Without Postgres these tests
fail: a missing database is a broken environment, not a reason to skip.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

import deadlines
from deadlines import jobs
from deadlines.pgjobs import Job, JobTable, Worked
from testservers import Postgres

pytestmark = [pytest.mark.anyio, pytest.mark.postgres, pytest.mark.realtime]

Connect = Callable[[], Awaitable[Any]]


@pytest.fixture
def connect(pg_server: Postgres) -> Connect:
    """Opens a new asyncpg connection to the test database."""
    import asyncpg

    def opened() -> Awaitable[Any]:
        return asyncpg.connect(pg_server.url(), timeout=5, command_timeout=10)

    return opened


@pytest.fixture(autouse=True)
def fresh_counts() -> Iterator[None]:
    """Job counts start and end empty."""
    jobs.reset_counts()
    yield
    jobs.reset_counts()


@pytest.fixture
async def conn(connect: Connect) -> AsyncIterator[Any]:
    """A connection to the test database (fails when Postgres is down)."""
    connection = await connect()
    yield connection
    await connection.close()


@pytest.fixture
async def table(conn: Any) -> AsyncIterator[JobTable]:
    """A job table with a unique name, dropped after the test."""
    jobs_table = JobTable(f"deadline_jobs_{uuid.uuid4().hex[:12]}")
    await jobs_table.create(conn)
    yield jobs_table
    await jobs_table.drop(conn)


async def test_valid_job_runs_with_its_remaining_budget(conn: Any, table: JobTable) -> None:
    """A job enqueued inside a 3 s deadline runs with what is left; status done."""
    async with deadlines.scope(3.0):
        job_id = await table.enqueue(conn, {"to": "a@example.com"}, queue="mail")
    await asyncio.sleep(0.3)  # time in the queue counts
    seen: list[tuple[Any, float]] = []

    async def handler(job: Job) -> None:
        seen.append((job.payload, deadlines.remaining()))

    worked = await table.work(conn, handler, default=60, queue="mail", until_empty=True)
    assert worked == Worked(done=1)
    assert seen[0][0] == {"to": "a@example.com"}
    assert 2.0 < seen[0][1] < 2.75
    assert await table.status(conn, job_id) == ("done", None)
    assert jobs.counts("mail") == jobs.JobCounts(started=1)


async def test_expired_job_is_marked_not_run(conn: Any, table: JobTable) -> None:
    """A job whose deadline passed in the queue is marked expired, counted, reported."""
    events: list[deadlines.Event] = []
    unsubscribe = deadlines.observe(events.append)
    async with deadlines.scope(0.1):
        job_id = await table.enqueue(conn, {"n": 1})
    await asyncio.sleep(0.3)
    ran: list[Job] = []

    async def handler(job: Job) -> None:
        ran.append(job)

    try:
        worked = await table.work(conn, handler, default=60, until_empty=True)
    finally:
        unsubscribe()
    assert ran == [] and worked == Worked(expired=1)
    status, error = await table.status(conn, job_id)
    assert status == "expired" and error is not None and "dropped before running" in error
    assert jobs.counts() == jobs.JobCounts(dropped=1)
    dropped = [e for e in events if isinstance(e, deadlines.JobDropped)]
    assert len(dropped) == 1 and 0.15 < dropped[0].late < 1.5


async def test_missing_or_absurd_deadline_runs_under_the_default(
    conn: Any, table: JobTable
) -> None:
    """No deadline, or one centuries away, gives the worker's default limit, counted."""
    await table.enqueue(conn, {"n": "none"})
    await conn.execute(
        f"INSERT INTO \"{table.name}\" (payload, deadline_at) VALUES ('{{}}', '2999-01-01Z')"
    )
    await conn.execute(
        f"INSERT INTO \"{table.name}\" (payload, deadline_at) VALUES ('{{}}', '1970-01-02Z')"
    )
    lefts: list[float] = []

    async def handler(job: Job) -> None:
        lefts.append(deadlines.remaining())

    worked = await table.work(conn, handler, default=4, until_empty=True)
    assert worked == Worked(done=3)
    assert all(3.5 < left <= 4 for left in lefts)
    assert jobs.counts() == jobs.JobCounts(started=3, defaulted=3)


async def test_job_past_its_deadline_is_cancelled_server_side(conn: Any, table: JobTable) -> None:
    """A job whose query outlives its deadline is cancelled at the instant; status timeout."""
    async with deadlines.scope(0.4):
        job_id = await table.enqueue(conn, {"n": 1})
    started = time.monotonic()

    async def handler(job: Job) -> None:
        await job.connection.execute("SELECT pg_sleep(10)")

    worked = await table.work(conn, handler, default=60, until_empty=True)
    assert worked == Worked(timeout=1)
    assert time.monotonic() - started < 1.5
    status, error = await table.status(conn, job_id)
    assert status == "timeout" and error is not None and "deadline exceeded" in error
    assert jobs.counts() == jobs.JobCounts(started=1, exceeded=1)
    sleeping = await conn.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(10)'"
        " AND state = 'active'"
    )
    assert sleeping == 0


async def test_failed_job_is_recorded_and_its_writes_undone(conn: Any, table: JobTable) -> None:
    """A failing job is marked failed with its error; its own writes are rolled back."""
    job_id = await table.enqueue(conn, {"n": 1})
    done_id = await table.enqueue(conn, {"n": 2})

    async def handler(job: Job) -> None:
        await job.connection.execute(
            f'UPDATE "{table.name}" SET payload = \'{{"touched": true}}\' WHERE id = $1', job.id
        )
        if job.payload["n"] == 1:
            raise RuntimeError("mail server said no")

    worked = await table.work(conn, handler, default=5, until_empty=True)
    assert worked == Worked(done=1, failed=1)
    assert await table.status(conn, job_id) == ("failed", "RuntimeError: mail server said no")
    payloads = {
        row["id"]: json.loads(row["payload"])
        for row in await conn.fetch(f'SELECT id, payload FROM "{table.name}"')
    }
    assert payloads == {job_id: {"n": 1}, done_id: {"touched": True}}


async def test_two_workers_share_the_table_with_skip_locked(
    conn: Any, table: JobTable, connect: Connect
) -> None:
    """Two concurrent workers claim with SKIP LOCKED: every job runs once, both do work."""
    async with deadlines.scope(20):
        ids = [await table.enqueue(conn, {"n": n}) for n in range(12)]
    runs: dict[str, list[int]] = {"a": [], "b": []}

    def handler_for(name: str) -> Any:
        async def handler(job: Job) -> None:
            runs[name].append(job.id)
            await asyncio.sleep(0.05)  # holding the row lock: the other worker skips it

        return handler

    first, second = await connect(), await connect()
    try:
        results = await asyncio.gather(
            table.work(first, handler_for("a"), default=5, until_empty=True),
            table.work(second, handler_for("b"), default=5, until_empty=True),
        )
    finally:
        await first.close()
        await second.close()
    assert sorted(runs["a"] + runs["b"]) == ids  # each job exactly once
    assert runs["a"] and runs["b"]  # neither worker waited on the other's lock
    assert sum(r.done for r in results) == 12
    statuses = await conn.fetch(f'SELECT DISTINCT status FROM "{table.name}"')
    assert [row["status"] for row in statuses] == ["done"]


async def test_a_locked_job_is_skipped_not_waited_for(
    conn: Any, table: JobTable, connect: Connect
) -> None:
    """While worker A holds job 1, worker B claims job 2 at once (A waits for B's proof)."""
    await table.enqueue(conn, {"n": 1})
    second_id = await table.enqueue(conn, {"n": 2})
    a_started, b_ran = asyncio.Event(), asyncio.Event()

    async def handler_a(job: Job) -> None:
        a_started.set()
        await b_ran.wait()  # never returns if B is blocked on A's row lock

    async def handler_b(job: Job) -> None:
        assert job.id == second_id
        b_ran.set()

    a_conn, b_conn = await connect(), await connect()
    try:
        a = asyncio.create_task(table.work(a_conn, handler_a, default=5, max_jobs=1))
        await asyncio.wait_for(a_started.wait(), timeout=5)
        b = await asyncio.wait_for(table.work(b_conn, handler_b, default=5, max_jobs=1), 5)
        assert b == Worked(done=1)
        assert await asyncio.wait_for(a, timeout=5) == Worked(done=1)
    finally:
        await a_conn.close()
        await b_conn.close()


async def test_worker_polls_until_cancelled(conn: Any, table: JobTable, connect: Connect) -> None:
    """A polling worker picks up a job enqueued later, and stops cleanly when cancelled."""
    got: list[int] = []

    async def handler(job: Job) -> None:
        got.append(job.id)

    worker = asyncio.create_task(table.work(conn, handler, default=5, poll=0.05))
    await asyncio.sleep(0.15)
    other = await connect()
    try:
        job_id = await table.enqueue(other, None)
        # Settled once the worker's transaction commits, a moment after the handler
        # returned: cancelled before that, the claim rolls back and the job stays queued.
        for _ in range(100):
            if await table.status(other, job_id) == ("done", None):
                break
            await asyncio.sleep(0.02)
    finally:
        await other.close()
    worker.cancel()
    with pytest.raises(asyncio.CancelledError):
        await worker
    assert got == [job_id]
    assert await table.status(conn, job_id) == ("done", None)


def test_table_names_are_checked() -> None:
    """Only plain identifiers are accepted as table names (no SQL injection)."""
    with pytest.raises(ValueError, match="plain SQL identifier"):
        JobTable('jobs"; DROP TABLE x; --')
