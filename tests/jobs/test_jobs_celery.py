"""Celery end to end: a real worker process, a Redis broker, deadlines across the queue.

The worker runs `celery_deadline_app` with the solo pool on its own queue, on the
session's Redis (`redis_url`, a dedicated database), which it is given through
`DEADLINES_TEST_REDIS`; it is stopped by PID and its keys removed at the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

import deadlines
from deadlines import jobs

pytestmark = [pytest.mark.redis, pytest.mark.realtime]

HERE = Path(__file__).parent
QUEUE = f"deadlines-test-{uuid.uuid4().hex[:12]}"
os.environ["DEADLINES_TEST_QUEUE"] = QUEUE

import celery_deadline_app as tasks  # noqa: E402  (reads the environment above)

import deadlines.celery  # noqa: E402


@pytest.fixture(scope="module")
def redis_db(redis_url: str) -> Iterator[Any]:
    """The dedicated Redis database, our app's broker and backend; cleans our keys."""
    import redis

    tasks.app.conf.update(broker_url=redis_url, result_backend=redis_url)
    client = redis.Redis.from_url(redis_url, socket_timeout=5, socket_connect_timeout=2)
    client.ping()
    before = set(client.keys("*"))
    yield client
    ours = [key for key in client.keys("*") if key not in before]
    if ours:
        client.delete(*ours)
    client.close()


@pytest.fixture(scope="module")
def worker(redis_url: str, redis_db: Any) -> Iterator[subprocess.Popen[bytes]]:
    """A real Celery worker process (solo pool) on the test queue, killed by PID after."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), *sys.path])}
    env["DEADLINES_TEST_REDIS"] = redis_url
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "celery_deadline_app",
            "worker",
            "--pool=solo",
            "--concurrency=1",
            f"--queues={QUEUE}",
            f"--hostname={QUEUE}@localhost",
            "--without-gossip",
            "--without-mingle",
            "--without-heartbeat",
            "--loglevel=WARNING",
        ],
        cwd=HERE,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        # Ready when it answers a task (bounded: fail, never hang).
        tasks.counts.delay().get(timeout=30)
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        if process.stderr is not None:
            process.stderr.close()
        tasks.app.close()


@pytest.fixture
def stamping() -> Iterator[None]:
    """Publishing stamps deadlines (and Celery's expires) while the test runs."""
    uninstall = deadlines.celery.install()
    yield
    uninstall()


def worker_counts() -> jobs.JobCounts:
    return jobs.JobCounts(**tasks.counts.delay().get(timeout=10))


def test_published_task_carries_deadline_and_expires(redis_db: Any, stamping: None) -> None:
    """Inside a deadline, the message gets `deadline_at` and an earlier Celery `expires`."""
    from celery import signals

    seen: dict[str, Any] = {}

    def capture(headers: dict[str, Any] | None = None, **_: Any) -> None:
        seen.update(headers or {})

    signals.before_task_publish.connect(capture, weak=False, dispatch_uid="test-capture")
    try:
        with deadlines.scope(4.0):
            expected = time.time() + 4.0
            # Published for real, to a queue no worker reads (its key is removed after).
            tasks.remaining.apply_async(queue=f"{QUEUE}-unread", expires=3600)
    finally:
        signals.before_task_publish.disconnect(dispatch_uid="test-capture")
    assert expected - 0.2 < seen[jobs.FIELD] <= expected
    expires = datetime.fromisoformat(seen["expires"]).timestamp()
    assert expires == pytest.approx(seen[jobs.FIELD], abs=0.001)


def test_nothing_is_stamped_outside_a_deadline(redis_db: Any, stamping: None) -> None:
    """Without a current deadline the message is left as it was (the worker uses its default)."""
    from celery import signals

    seen: dict[str, Any] = {}

    def capture(headers: dict[str, Any] | None = None, **_: Any) -> None:
        seen.update(headers or {})

    signals.before_task_publish.connect(capture, weak=False, dispatch_uid="test-capture")
    try:
        tasks.remaining.apply_async(queue=f"{QUEUE}-unread")
    finally:
        signals.before_task_publish.disconnect(dispatch_uid="test-capture")
    assert jobs.FIELD not in seen and seen["expires"] is None


def test_valid_task_runs_with_its_remaining_budget(worker: Any, stamping: None) -> None:
    """A task sent inside a 5 s deadline sees what is left of it in the worker."""
    before = worker_counts()
    with deadlines.scope(5.0):
        result = tasks.remaining.delay()
    left = result.get(timeout=10)
    assert 2.0 < left < 5.0
    after = worker_counts()
    assert after.started == before.started + 1 and after.defaulted == before.defaulted


def test_task_without_deadline_runs_under_the_default(worker: Any, stamping: None) -> None:
    """Sent outside any deadline, a task runs under its default limit (3 s), counted."""
    before = worker_counts()
    assert 2.0 < tasks.remaining.delay().get(timeout=10) <= 3.0
    assert worker_counts().defaulted == before.defaulted + 1


@pytest.mark.parametrize("header", ["soon", "-1", 1e15, "1700000000000"])
def test_bad_deadline_header_runs_under_the_default(worker: Any, header: object) -> None:
    """A malformed or absurd `deadline_at` header gives the default limit, counted."""
    before = worker_counts()
    result = tasks.remaining.apply_async(headers={jobs.FIELD: header})
    assert 2.0 < result.get(timeout=10) <= 3.0
    assert worker_counts().defaulted == before.defaulted + 1


def test_task_expired_in_the_queue_is_revoked_by_celery(worker: Any, stamping: None) -> None:
    """Stuck behind a busy worker past its deadline: Celery revokes it, we count the drop."""
    from celery.exceptions import TaskRevokedError

    before = worker_counts()
    busy = tasks.block.delay(1.0)
    with deadlines.scope(0.3):
        late = tasks.remaining.delay()
    with pytest.raises(TaskRevokedError):
        late.get(timeout=10)
    assert late.state == "REVOKED"  # marked, not lost
    busy.get(timeout=10)
    after = worker_counts()
    assert after.dropped == before.dropped + 1 and after.started == before.started + 1


def test_task_expired_without_expires_is_dropped_by_the_worker(worker: Any) -> None:
    """With only the header (no Celery expires), the task base class drops it: JobExpired."""
    before = worker_counts()
    result = tasks.remaining.apply_async(headers={jobs.FIELD: time.time() - 2})
    with pytest.raises(jobs.JobExpired):
        result.get(timeout=10)
    assert result.state == "FAILURE"  # marked, not lost
    after = worker_counts()
    assert after.dropped == before.dropped + 1 and after.started == before.started


def test_called_directly_runs_under_the_callers_deadline() -> None:
    """Called as a function (not from a queue), a task just runs under the caller's deadline."""
    jobs.reset_counts()
    with deadlines.scope(2.0):
        assert 1.5 < tasks.remaining() <= 2.0
    assert tasks.remaining() == float("inf")
    assert jobs.counts() == jobs.JobCounts()
