"""`deadlines.jobs`: stamping a deadline on a job, and a worker that honours or drops it."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Iterator, Mapping
from datetime import timedelta
from typing import Any

import pytest

import deadlines
from deadlines import jobs
from deadlines.testing import FakeClock


@pytest.fixture(autouse=True)
def fresh_counts() -> Iterator[None]:
    """Each test starts and ends with no job counts."""
    jobs.reset_counts()
    yield
    jobs.reset_counts()


@pytest.fixture
def events() -> Iterator[list[deadlines.Event]]:
    """Events reported while the test runs."""
    seen: list[deadlines.Event] = []
    unsubscribe = deadlines.observe(seen.append)
    yield seen
    unsubscribe()


def test_stamp_stores_the_current_deadline_as_wall_time() -> None:
    """Inside a request, stamp() stores now + remaining as Unix time, floored to the ms."""
    payload = {"user": 42}
    with deadlines.scope(5.0):
        stamped = jobs.stamp(payload)
    assert payload == {"user": 42}  # the caller's dict is not changed
    assert stamped["user"] == 42
    assert time.time() + 4.9 <= stamped[jobs.FIELD] <= time.time() + 5.0
    assert stamped[jobs.FIELD] * 1000 == math.floor(stamped[jobs.FIELD] * 1000)
    json.dumps(stamped)  # travels as plain JSON


def test_stamp_only_shrinks() -> None:
    """An explicit deadline, the current one and an existing field: the earliest wins."""
    assert jobs.FIELD not in jobs.stamp({})  # no deadline anywhere: the worker's default
    with deadlines.scope(10):
        shorter = jobs.stamp({}, deadline=2.0)[jobs.FIELD]
        longer = jobs.stamp({}, deadline=timedelta(seconds=60))[jobs.FIELD]
        kept = jobs.stamp({jobs.FIELD: shorter}, deadline=30)[jobs.FIELD]
    assert shorter < time.time() + 2.0 < longer <= time.time() + 10
    assert kept == shorter


def test_headers_carry_the_same_instant() -> None:
    """headers() gives the deadline as a decimal string that deadline_of() reads back."""
    assert jobs.headers() == {}
    with deadlines.scope(3.0):
        hdrs = jobs.headers()
    assert set(hdrs) == {jobs.HEADER}
    assert hdrs[jobs.HEADER].count(".") == 1
    left = jobs.deadline_of({"X-Deadline-At": hdrs[jobs.HEADER]}, default=60).remaining()
    assert 2.5 < left <= 3.0


def test_valid_job_runs_with_its_remaining_budget() -> None:
    """A job taken from the queue runs inside what is left of the request's deadline."""
    with deadlines.scope(2.0):
        payload = json.loads(json.dumps(jobs.stamp({"n": 1})))
    time.sleep(0.2)  # time in the queue counts

    def work(job: Mapping[str, Any]) -> float:
        return deadlines.remaining()

    left = jobs.run(payload, work, default=60, queue="q")
    assert 1.5 < left < 1.85
    assert jobs.counts("q") == jobs.JobCounts(started=1)


def test_expired_job_is_dropped_counted_and_reported(events: list[deadlines.Event]) -> None:
    """A job past its deadline is not run: JobExpired, counted, JobDropped with lateness."""
    payload = {jobs.FIELD: time.time() - 1.5}
    ran: list[bool] = []
    with pytest.raises(jobs.JobExpired) as info:
        jobs.run(payload, lambda job: ran.append(True), default=60, queue="mail")
    assert ran == []
    assert info.value.queue == "mail" and 1.4 < info.value.late < 2.0
    assert info.value.deadline_at == payload[jobs.FIELD]
    assert isinstance(info.value, deadlines.DeadlineExceeded | TimeoutError)
    assert jobs.counts("mail") == jobs.JobCounts(dropped=1)
    dropped = [e for e in events if isinstance(e, deadlines.JobDropped)]
    assert len(dropped) == 1 and dropped[0].queue == "mail" and 1.4 < dropped[0].late < 2.0


@pytest.mark.parametrize(
    "value",
    [
        None,
        "soon",
        "-5",
        "1e9",
        " 1700000000",
        "1700000000.5.1",
        "١٧٠٠٠٠٠٠٠٠",
        b"\xff",
        True,
        math.nan,
        math.inf,
        [1, 2],
        0,
        30,
        time.time() * 1000,
    ],
    ids=repr,
)
def test_bad_deadline_fields_run_under_the_default(value: object) -> None:
    """Missing, malformed or absurd fields run the job under the default limit, counted."""
    payload = {} if value is None else {jobs.FIELD: value}
    left = jobs.run(payload, lambda job: deadlines.remaining(), default=7, queue="q")
    assert 6.5 < left <= 7.0
    assert jobs.counts("q") == jobs.JobCounts(started=1, defaulted=1)


def test_maximum_caps_a_stored_deadline() -> None:
    """A job cannot ask for more than the worker's `maximum`."""
    payload = {jobs.FIELD: time.time() + 3600}
    assert 9 < jobs.deadline_of(payload, default=5, maximum=10).remaining() <= 10
    assert 3500 < jobs.deadline_of(payload, default=5).remaining() <= 3600


def test_min_useful_drops_a_job_that_cannot_finish() -> None:
    """A job with less than `min_useful` left is dropped too (negative lateness)."""
    payload = {jobs.FIELD: time.time() + 0.5}
    with pytest.raises(jobs.JobExpired) as info, jobs.scope(payload, default=5, min_useful=1.0):
        pytest.fail("the body must not run")
    assert -0.6 < info.value.late < 0
    assert "too close" in str(info.value)
    assert jobs.counts().dropped == 1


def test_async_job_is_cancelled_at_its_deadline() -> None:
    """An async job running past its deadline is cancelled at the instant and counted."""
    clock = FakeClock()

    async def work(job: Mapping[str, Any]) -> None:
        await asyncio.sleep(60)

    async def main() -> None:
        with deadlines.scope(2.5):
            payload = jobs.stamp({})
        await jobs.arun(payload, work, default=60, queue="a")

    with pytest.raises(deadlines.DeadlineExceeded):
        clock.run(main())
    assert clock.now() == pytest.approx(1002.5, abs=0.01)
    assert jobs.counts("a") == jobs.JobCounts(started=1, exceeded=1)


def test_async_job_finishing_in_time_returns_its_result() -> None:
    """arun returns the job's result and counts only the start."""

    async def work(job: Mapping[str, Any]) -> int:
        await asyncio.sleep(0.1)
        return int(job["n"]) * 2

    result = FakeClock().run(jobs.arun({"n": 21, jobs.FIELD: time.time() + 9}, work, default=5))
    assert result == 42
    assert jobs.counts() == jobs.JobCounts(started=1)


def test_sync_job_overrunning_is_counted_as_exceeded() -> None:
    """A sync job cannot be interrupted, but one that overran its deadline is counted."""
    with jobs.scope({jobs.FIELD: time.time() + 0.05}, default=5, queue="s"):
        time.sleep(0.1)
        with pytest.raises(deadlines.DeadlineExceeded):
            deadlines.check()
    assert jobs.counts("s") == jobs.JobCounts(started=1, exceeded=1)


def test_clock_skew_moves_the_deadline() -> None:
    """The caveat, measured: a writer whose clock is 300 ms behind gives 300 ms less."""
    with deadlines.scope(2.0):
        honest = jobs.stamp({})[jobs.FIELD]
    behind = {jobs.FIELD: honest - 0.3}
    gap = jobs.deadline_of({jobs.FIELD: honest}, default=9).instant
    gap -= jobs.deadline_of(behind, default=9).instant
    assert gap == pytest.approx(0.3, abs=0.01)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"default": 0}, "default must be > 0 seconds"),
        ({"default": math.inf}, "default must be finite"),
        ({"default": 1, "maximum": -1}, "maximum must be > 0 seconds"),
        ({"default": 1, "queue": ""}, "queue must be a non-empty string"),
    ],
)
def test_worker_options_are_validated(kwargs: dict[str, Any], message: str) -> None:
    """A worker's own limits must be positive and finite: there is no unbounded job."""
    with pytest.raises(ValueError, match=message):
        jobs.scope({}, **kwargs)


def test_core_modules_need_only_the_standard_library() -> None:
    """`deadlines.jobs` and `deadlines.streams` import nothing outside the standard library."""
    import subprocess
    import sys

    code = (
        "import sys; before = set(sys.modules); import deadlines.jobs, deadlines.streams; "
        "new = set(sys.modules) - before; std = sys.stdlib_module_names; "
        "print(sorted(m for m in new if m.split('.')[0] not in std | {'deadlines'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
