"""Retries inside the budget: a retry never outlives the request's deadline.

The rule, for a `deadlines.Retry` policy (``Dependency(retry=Retry(...))``):

* at most ``policy.attempts`` attempts; each attempt is one call with its own
  `deadlines.CallBudget`, so its timeout is min(the dependency's caps, time left);
* a failure *before* the request was sent (pool, connect) is retried for any method;
  *after* it was sent only for idempotent methods (`deadlines.IDEMPOTENT_METHODS`) or a
  request carrying an ``Idempotency-Key`` header — and only if its body can be sent again;
* a retry happens only when the time left exceeds the expected attempt time plus the
  backoff sleep; a deadline error (the budget is spent) is never retried;
* backoff sleeps end early at the deadline;
* with a `deadlines.RetryBudget` (``Dependency(retry_budget=...)``), a retry also needs
  the budget's leave: retries stay within a share of the dependency's calls, whatever
  each call's policy allows.

`deadlines.httpx` and `deadlines.aiohttp` apply it when ``dependency.retry`` is set; use
`run_async` / `run_sync` for any other call. For tenacity or stamina, the same rule as
their stop, wait and retry conditions: `tenacity_options`, `stamina_context` (install
``deadlines[retry]``). Pass any of them ``dependency=`` (the `deadlines.Dependency` the
calls go to) for its retry budget and ``min_useful``.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from . import _events, _scope, _validate
from ._dependency import IDEMPOTENT_METHODS, Dependency, Retry
from ._errors import CallTimeout, DeadlineExceeded
from ._extras import missing

__all__ = [
    "may_retry",
    "request_sent",
    "run_async",
    "run_sync",
    "stamina_context",
    "stamina_hook",
    "stop_at_deadline",
    "tenacity_options",
    "wait_until_deadline",
]

T = TypeVar("T")
SentOf = Callable[[BaseException], "bool | None"]


def request_sent(exc: BaseException) -> bool | None:
    """Whether `exc` may have reached the server; None when it must not be retried at all.

    A deadline error (`DeadlineExceeded`, `BudgetExhausted`) means the budget is spent:
    None. A `CallTimeout` knows its phase. Anything else is not a transient failure
    this module can judge: None (clients pass their own classifier for their errors).
    """
    if isinstance(exc, DeadlineExceeded):
        return None
    if isinstance(exc, CallTimeout):
        return exc.request_sent
    return None


def may_retry(method: str, *, request_sent: bool, idempotency_key: bool = False) -> bool:
    """Whether a request that failed may be sent again, by its method and phase."""
    return not request_sent or method.upper() in IDEMPOTENT_METHODS or idempotency_key


def _backoff(policy: Retry, retry_number: int, min_attempt: float) -> float | None:
    """The sleep before retry `retry_number`, or None when it would not fit the deadline."""
    delay = policy.backoff_for(retry_number, random.random())
    if _scope.remaining() <= max(policy.expected, min_attempt) + delay:
        return None
    return delay


class _Rule:
    """What one retried call may do; shared by the async and blocking loops."""

    def __init__(
        self,
        policy: Retry,
        method: str,
        idempotency_key: bool,
        replayable: bool,
        min_attempt: float | timedelta | None,
        classify: SentOf,
        dependency: Dependency | None,
    ) -> None:
        if not isinstance(policy, Retry):
            raise TypeError(f"policy must be a deadlines.Retry, not {policy!r}")
        if dependency is not None and not isinstance(dependency, Dependency):
            raise TypeError(f"dependency must be a deadlines.Dependency, not {dependency!r}")
        self.budget = None if dependency is None else dependency.retry_budget
        self.name = "" if dependency is None else dependency.name
        if min_attempt is None:
            min_attempt = 0.0 if dependency is None else dependency.min_useful
        self.policy = policy
        self.method = method
        self.idempotency_key = idempotency_key
        self.replayable = replayable
        self.min_attempt = _validate.seconds(min_attempt, "min_attempt")
        self.classify = classify

    def after_error(self, exc: BaseException, number: int) -> float | None:
        """The sleep before retrying after `exc` on attempt `number`, or None to give up."""
        sent = self.classify(exc)
        if sent is None or number >= self.policy.attempts:
            return None
        if sent and not (self.replayable and self._idempotent()):
            return None
        return _backoff(self.policy, number, self.min_attempt)

    def after_result(self, number: int) -> float | None:
        """The sleep before retrying a retryable result (a 503, say), or None."""
        if number >= self.policy.attempts or not (self.replayable and self._idempotent()):
            return None
        return _backoff(self.policy, number, self.min_attempt)

    def start(self) -> None:
        """A call begins: it counts toward the retry budget."""
        if self.budget is not None:
            self.budget.deposit()

    def granted(self) -> bool:
        """Whether the retry budget allows the retry the rule wants (and takes it)."""
        if self.budget is None or self.budget.withdraw():
            return True
        if _events.active():
            _events.emit(_events.AttemptRefused(self.name, "retry_budget"))
        return False

    def _idempotent(self) -> bool:
        return may_retry(self.method, request_sent=True, idempotency_key=self.idempotency_key)


def _sleep_for(delay: float) -> float:
    """The backoff, cut short at the deadline."""
    return max(0.0, min(delay, _scope.remaining()))


async def _async_sleep(seconds: float) -> None:
    trio = _scope.running_trio()
    if trio is not None:
        await trio.sleep(seconds)
    else:
        await asyncio.sleep(seconds)


async def run_async(
    attempt: Callable[[], Awaitable[T]],
    *,
    policy: Retry,
    method: str = "GET",
    idempotency_key: bool = False,
    replayable: bool = True,
    min_attempt: float | timedelta | None = None,
    request_sent: SentOf = request_sent,
    retry_response: Callable[[T], bool] | None = None,
    discard: Callable[[T], Awaitable[None]] | None = None,
    dependency: Dependency | None = None,
) -> T:
    """Await ``attempt()`` until it succeeds or the rule says stop; re-raise the last error.

    Args:
        attempt: Makes one attempt (one call with its own budget).
        policy: Attempts, backoff and expected attempt time.
        method: With `idempotency_key`, decides whether a request that was sent may
            be retried (an idempotent method may).
        idempotency_key: Whether the request carries an ``Idempotency-Key``, which
            makes any method retryable once sent.
        replayable: False when the request body cannot be sent twice (a generator).
        min_attempt: Do not retry with less time left than this plus the backoff;
            default: `dependency`'s ``min_useful`` (0 without one).
        request_sent: Classifies an error: True/False whether the request was sent,
            None when it is not retryable. Defaults to the taxonomy's errors.
        retry_response: Whether a result should be retried (a 503, say); the last
            result is returned when no retry is left.
        discard: Releases a result that is being retried (closes a response).
        dependency: The `deadlines.Dependency` the calls go to. With its
            ``retry_budget``, the call counts toward it and each retry needs its leave
            (refused: the last error is raised, the last result returned, and
            `deadlines.AttemptRefused` reported under its name).

    Cancellation is never retried and cuts a backoff sleep short.
    """
    rule = _Rule(
        policy,
        method,
        idempotency_key,
        replayable,
        min_attempt,
        request_sent,
        dependency,
    )
    rule.start()
    number = 1
    while True:
        try:
            result = await attempt()
        except Exception as exc:
            delay = rule.after_error(exc, number)
            if delay is None or not rule.granted():
                raise
        else:
            if retry_response is None or not retry_response(result):
                return result
            delay = rule.after_result(number)
            if delay is None or not rule.granted():
                return result
            if discard is not None:
                await discard(result)
        await _async_sleep(_sleep_for(delay))
        number += 1


def run_sync(
    attempt: Callable[[], T],
    *,
    policy: Retry,
    method: str = "GET",
    idempotency_key: bool = False,
    replayable: bool = True,
    min_attempt: float | timedelta | None = None,
    request_sent: SentOf = request_sent,
    retry_response: Callable[[T], bool] | None = None,
    discard: Callable[[T], None] | None = None,
    dependency: Dependency | None = None,
) -> T:
    """The blocking twin of `run_async`, with the same arguments and rule."""
    rule = _Rule(
        policy,
        method,
        idempotency_key,
        replayable,
        min_attempt,
        request_sent,
        dependency,
    )
    rule.start()
    number = 1
    while True:
        try:
            result = attempt()
        except Exception as exc:
            delay = rule.after_error(exc, number)
            if delay is None or not rule.granted():
                raise
        else:
            if retry_response is None or not retry_response(result):
                return result
            delay = rule.after_result(number)
            if delay is None or not rule.granted():
                return result
            if discard is not None:
                discard(result)
        time.sleep(_sleep_for(delay))
        number += 1


# tenacity and stamina: the same rule as their conditions.


def _require(name: str) -> Any:
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise missing("deadlines.retry", name, "retry") from exc


def stop_at_deadline(*, expected: float | timedelta = 0.0) -> Any:
    """A tenacity stop condition: stop when the next attempt would not fit the deadline.

    Stops when the time left is at most `expected` plus the upcoming sleep. Combine it:
    ``stop=tenacity.stop_after_attempt(3) | deadlines.retry.stop_at_deadline()``.

    It applies no retry budget: a budget counts every call, and a stop condition never
    sees a call whose first attempt succeeds. ``tenacity_options(policy,
    dependency=...)`` applies both.
    """
    tenacity = _require("tenacity")
    need = _validate.seconds(expected, "expected")

    base: Any = tenacity.stop.stop_base

    class StopAtDeadline(base):  # type: ignore[misc]
        """Stop when ``deadlines.remaining()`` <= expected + the upcoming sleep."""

        def __call__(self, retry_state: Any) -> bool:
            return bool(_scope.remaining() <= need + (retry_state.upcoming_sleep or 0.0))

    return StopAtDeadline()


def wait_until_deadline(wait: Any) -> Any:
    """A tenacity wait that never sleeps past the deadline: `wait`, cut at the time left."""
    tenacity = _require("tenacity")

    base: Any = tenacity.wait.wait_base

    class WaitUntilDeadline(base):  # type: ignore[misc]
        """`wait`, but at most ``deadlines.remaining()``."""

        def __call__(self, retry_state: Any) -> float:
            return float(min(wait(retry_state), _scope.remaining()))

    return WaitUntilDeadline()


def tenacity_options(
    policy: Retry,
    *,
    method: str = "GET",
    idempotency_key: bool = False,
    request_sent: SentOf = request_sent,
    dependency: Dependency | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``tenacity.retry`` / ``AsyncRetrying`` applying `policy`.

        async for attempt in tenacity.AsyncRetrying(**tenacity_options(policy, method="POST")):
            with attempt:
                await charge()

    Retries what the rule allows, stops after ``policy.attempts`` or when the next
    attempt would not fit the deadline, sleeps `policy`'s backoff cut at the deadline,
    and re-raises the last error.

    With `dependency` (the `deadlines.Dependency` the calls go to), its
    ``retry_budget`` applies as in `run_async`: each call counts toward it (the
    options' ``before``), each retry needs its leave (their ``stop``; refused: the last
    error is re-raised and `deadlines.AttemptRefused` reported), and no retry starts
    with less than its ``min_useful`` left. Replacing ``before`` or ``stop`` drops it.
    """
    tenacity = _require("tenacity")
    rule = _Rule(policy, method, idempotency_key, True, None, request_sent, dependency)

    def retryable(exc: BaseException) -> bool:
        sent = rule.classify(exc)
        return sent is not None and (not sent or rule._idempotent())

    def backoff(retry_state: Any) -> float:
        return policy.backoff_for(retry_state.attempt_number, random.random())

    stop = tenacity.stop_after_attempt(policy.attempts) | stop_at_deadline(
        expected=max(policy.expected, rule.min_attempt)
    )
    options = {
        "retry": tenacity.retry_if_exception(retryable),
        "stop": stop,
        "wait": wait_until_deadline(backoff),
        "reraise": True,
    }
    if rule.budget is not None:
        options.update(_budget_options(tenacity, rule, stop))
    return options


def _budget_options(tenacity: Any, rule: _Rule, stop: Any) -> dict[str, Any]:
    """tenacity's ``before`` and ``stop`` that apply `rule`'s retry budget around `stop`."""

    def before(retry_state: Any) -> None:
        if retry_state.attempt_number == 1:
            rule.start()

    base: Any = tenacity.stop.stop_base

    class StopOrBudget(base):  # type: ignore[misc]
        """`stop`, else stop when the retry budget refuses the retry."""

        def __call__(self, retry_state: Any) -> bool:
            # Asked only once a retry is wanted; the budget is asked only if `stop` allows it.
            return bool(stop(retry_state)) or not rule.granted()

    return {"before": before, "stop": StopOrBudget()}


def stamina_hook(
    policy: Retry,
    *,
    method: str = "GET",
    idempotency_key: bool = False,
    request_sent: SentOf = request_sent,
    dependency: Dependency | None = None,
) -> Callable[[Exception], bool | float]:
    """A stamina backoff hook (its ``on=``) applying `policy` inside the deadline.

    Returns False when the error must not be retried or the next attempt would not fit
    the deadline, else `policy`'s backoff for this retry. It counts the failures it has
    seen, so make one per call (`stamina_context` does).

    With `dependency`, its ``retry_budget`` applies as in `run_async`: making the hook
    counts the call, and each retry needs the budget's leave (refused: False, so
    stamina re-raises the error, and `deadlines.AttemptRefused` is reported); no retry
    starts with less than its ``min_useful`` left.
    """
    rule = _Rule(policy, method, idempotency_key, True, None, request_sent, dependency)
    rule.start()
    failures = 0

    def hook(exc: Exception) -> bool | float:
        nonlocal failures
        failures += 1
        delay = rule.after_error(exc, failures)
        if delay is None or not rule.granted():
            return False
        return _sleep_for(delay)

    return hook


def stamina_context(
    policy: Retry,
    *,
    method: str = "GET",
    idempotency_key: bool = False,
    request_sent: SentOf = request_sent,
    dependency: Dependency | None = None,
) -> Any:
    """``stamina.retry_context`` applying `policy`, bounded by the deadline.

        for attempt in deadlines.retry.stamina_context(policy, method="GET"):
            with attempt:
                fetch()

    Works with ``async for`` too, as stamina's own does. With `dependency`, its
    ``retry_budget`` applies (see `stamina_hook`): call it once per call.
    """
    stamina = _require("stamina")
    left = _scope.remaining()
    return stamina.retry_context(
        on=stamina_hook(
            policy,
            method=method,
            idempotency_key=idempotency_key,
            request_sent=request_sent,
            dependency=dependency,
        ),
        attempts=policy.attempts,
        timeout=None if left == float("inf") else left,
    )
