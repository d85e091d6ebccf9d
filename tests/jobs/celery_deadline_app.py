"""The Celery app the job tests run in a real worker process (and publish from).

Broker and result backend: the tests' Redis, whose URL (with a dedicated database) comes
from `DEADLINES_TEST_REDIS` in the worker; the test process sets it on `app.conf` once it
has chosen the server. The queue name comes from the environment so each run has its own.
"""

from __future__ import annotations

import dataclasses
import os
import time

from celery import Celery

import deadlines
from deadlines import jobs
from deadlines.celery import DeadlineTask

REDIS_URL = os.environ.get("DEADLINES_TEST_REDIS")
QUEUE = os.environ.get("DEADLINES_TEST_QUEUE", "deadlines-test")

app = Celery("celery_deadline_app", broker=REDIS_URL, backend=REDIS_URL)
app.conf.update(
    task_default_queue=QUEUE,
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    result_expires=300,
    worker_prefetch_multiplier=1,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=False,
    broker_connection_max_retries=1,
    broker_transport_options={"socket_timeout": 5, "socket_connect_timeout": 2},
    redis_socket_timeout=5,
    redis_socket_connect_timeout=2,
)


class ShortDefault(DeadlineTask):  # type: ignore[misc]
    """Tasks of the tests: a short default so a defaulted task is easy to recognise."""

    deadline_default = 3.0


@app.task(base=ShortDefault)
def remaining() -> float:
    """The budget the task sees when it starts (inf without a deadline)."""
    return deadlines.remaining()


@app.task(base=ShortDefault)
def block(seconds: float) -> None:
    """Keep the (solo) worker busy, so that what is queued behind waits."""
    time.sleep(seconds)


@app.task
def counts() -> dict[str, int]:
    """The worker's job counts for the test queue."""
    return dataclasses.asdict(jobs.counts(QUEUE))
