"""Celery: a task's deadline survives the broker, and the worker honours it.

Two halves, both needed:

* **Publishing** — `install()` connects a ``before_task_publish`` handler that stamps
  every task message sent while a deadline is current (``task.delay()`` inside a
  request) with the header `deadlines.jobs.FIELD` (``deadline_at``, Unix time), and
  maps it to Celery's own ``expires`` (the earlier of the two wins). With ``expires``
  set, any Celery worker, even one that knows nothing of this library, revokes the
  task instead of running it once the deadline has passed.
* **Running** — tasks with ``base=DeadlineTask`` run inside their deadline
  (``deadlines.remaining()`` and every outbound integration see what is left). A task
  that arrives expired is dropped before doing any work (`deadlines.jobs.JobExpired`,
  stored as the task's failure); one without a valid header runs under
  `DeadlineTask.deadline_default`, never unbounded. Celery's own expiry revocations of
  stamped tasks are counted as drops and reported (`deadlines.JobDropped`) too.

    app = Celery("shop", broker="redis://127.0.0.1:6379/0")
    deadlines.celery.install()

    @app.task(base=deadlines.celery.DeadlineTask)
    def send_receipt(order_id): ...

Celery tasks are synchronous: the deadline is visible inside the task but cannot
interrupt it (use Celery's ``soft_time_limit`` with the prefork pool as a backstop).
Stamped deadlines are wall-clock instants; see the clock-skew caveat in
`deadlines.jobs`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, MutableMapping
from datetime import UTC, datetime
from typing import Any

from ._extras import missing

try:
    from celery import Task, signals
except ImportError as exc:  # pragma: no cover - exercised only without celery installed
    raise missing("deadlines.celery", "Celery", "celery") from exc

from . import jobs

__all__ = ["DeadlineTask", "install"]

_lock = threading.Lock()
_options: dict[str, bool] = {}  # installed publishing options; empty when not installed


def install(*, expires: bool = True) -> Callable[[], None]:
    """Stamp every task message published in this process with the current deadline.

    Messages published outside any deadline are left alone (an explicit ``deadline_at``
    header is kept and, with `expires`, mapped too). With `expires`, Celery's
    ``expires`` is set to the deadline when that is earlier than the task's own.
    Calling it again replaces the options. Returns a function that uninstalls it.
    """
    with _lock:
        _options.clear()
        _options["expires"] = bool(expires)
    signals.before_task_publish.connect(
        _on_publish, weak=False, dispatch_uid="deadlines.celery.publish"
    )

    def uninstall() -> None:
        with _lock:
            _options.clear()
        signals.before_task_publish.disconnect(dispatch_uid="deadlines.celery.publish")

    return uninstall


def _on_publish(headers: MutableMapping[str, Any] | None = None, **_: Any) -> None:
    """``before_task_publish``: put the deadline (and ``expires``) on the message headers."""
    if headers is None or not _options:
        return
    stamped = jobs.stamp({jobs.FIELD: headers[jobs.FIELD]} if jobs.FIELD in headers else {})
    at = stamped.get(jobs.FIELD)
    valid = jobs.parse(at)[1] is None
    if at is None or not valid:
        return  # no deadline anywhere, or a bad header the worker will count
    headers[jobs.FIELD] = at
    if _options.get("expires"):
        ours = datetime.fromtimestamp(at, tz=UTC)
        theirs = _parse_expires(headers.get("expires"))
        if theirs is None or ours < theirs:
            headers["expires"] = ours.isoformat()


def _parse_expires(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


class DeadlineTask(Task):  # type: ignore[misc]  # celery ships no type hints
    """A task base class that runs each task inside the deadline its message carries.

    Class attributes (override in a subclass or in ``@app.task(..., deadline_default=5)``):

    * ``deadline_default`` — seconds a task without a valid deadline header may take;
    * ``deadline_maximum`` — cap on any stamped deadline (None: the stamp is the cap);
    * ``deadline_min_useful`` — drop a task with this little time left (seconds).
    """

    deadline_default: float = 30.0
    deadline_maximum: float | None = None
    deadline_min_useful: float = 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task inside its deadline; `JobExpired` (the task fails) if too late."""
        request = self.request
        if request.called_directly or getattr(request, "is_eager", False):
            # Not from a queue: it runs in the caller's context, under the caller's deadline.
            return super().__call__(*args, **kwargs)
        with jobs.scope(
            {jobs.FIELD: getattr(request, jobs.FIELD, None)},
            default=self.deadline_default,
            queue=_queue_of(request),
            maximum=self.deadline_maximum,
            min_useful=self.deadline_min_useful,
        ):
            return super().__call__(*args, **kwargs)


def _queue_of(request: Any) -> str:
    """The queue a task came from (its routing key), for counts and events."""
    info = getattr(request, "delivery_info", None) or {}
    name = info.get("routing_key") if isinstance(info, dict) else None
    return str(name) if name else "celery"


def _on_revoked(
    sender: Any = None, request: Any = None, expired: bool | None = None, **_: Any
) -> None:
    """``task_revoked``: a stamped task that Celery expired was dropped; count it."""
    if not expired or not isinstance(sender, DeadlineTask) or request is None:
        return
    deadline, wall, problem = jobs.resolve(
        {jobs.FIELD: getattr(request, jobs.FIELD, None)}, sender.deadline_default, None
    )
    if problem is None:
        jobs.drop(_queue_of(request), deadline, wall)


signals.task_revoked.connect(_on_revoked, weak=False, dispatch_uid="deadlines.celery.revoked")
