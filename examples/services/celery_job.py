"""A Celery job that runs inside the deadline of the request that queued it.

    pip install 'deadlines[celery]' 'celery[redis]'
    python examples/services/celery_job.py         # starts a worker, queues jobs, prints

Starts a worker (solo pool, a queue of its own) on Redis at 127.0.0.1:6379 (database 12,
or ``REDIS_URL``), then queues two receipts, each inside a request's deadline: one the
worker reaches in time runs with what is left of it; one stuck behind a busy worker past
its deadline is revoked by Celery, never run. Prints what happened, stops the worker
and removes its keys.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

from celery import Celery
from celery.result import AsyncResult

import deadlines
import deadlines.celery

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/12")
QUEUE = os.environ.setdefault("RECEIPTS_QUEUE", f"receipts-{uuid.uuid4().hex[:8]}")

app = Celery("receipts", broker=REDIS_URL, backend=REDIS_URL)
app.conf.update(
    task_default_queue=QUEUE,
    result_expires=60,
    worker_hijack_root_logger=False,
    broker_connection_retry_on_startup=False,
)


@app.task(name="receipts.send", base=deadlines.celery.DeadlineTask)
def send_receipt(order: int) -> float:
    """Send a receipt; returns the seconds its deadline had left when it started."""
    return deadlines.remaining()


@app.task(name="receipts.busy", base=deadlines.celery.DeadlineTask)
def busy(seconds: float) -> None:
    """Keep the worker busy (a long job ahead in the queue)."""
    time.sleep(seconds)


def demo() -> list[AsyncResult]:
    """Queue the jobs, as a web request would, print what became of them; their results."""
    from celery.exceptions import TaskRevokedError

    deadlines.celery.install()  # stamp each job with the current deadline
    ready = send_receipt.delay(0)
    ready.get(timeout=30)  # the worker is up
    with deadlines.scope(2.0):  # a request with 2 s to answer queues a receipt
        in_time = send_receipt.delay(42)
    print(f"in time: ran with {in_time.get(timeout=10):.2f} s of its 2 s left", flush=True)
    ahead = busy.delay(1.0)
    with deadlines.scope(0.3):
        late = send_receipt.delay(43)  # behind 1 s of work, with 0.3 s to run
    try:
        late.get(timeout=10)
        print("late: ran (unexpected)")
    except TaskRevokedError:
        print(f"late: {late.state.lower()}, never run: its deadline passed in the queue")
    ahead.get(timeout=10)
    return [ready, in_time, ahead, late]


def main() -> None:
    """Start a worker process, run the demo, stop the worker by its PID, clean up."""
    if sys.argv[1:] == ["worker"]:
        quiet = ["--without-gossip", "--without-mingle", "--without-heartbeat"]
        app.worker_main(["worker", "--pool=solo", f"--queues={QUEUE}", "-l", "WARNING", *quiet])
        return
    worker = subprocess.Popen(
        [sys.executable, __file__, "worker"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    results: list[AsyncResult] = []
    try:
        results = demo()
    finally:
        worker.terminate()
        worker.wait(10)
        for result in results:
            result.forget()
        with app.connection_for_write() as connection:  # the queue's keys, not the database
            client = connection.default_channel.client
            client.delete(*client.keys(f"*{QUEUE}*"))
        app.close()


if __name__ == "__main__":
    main()
