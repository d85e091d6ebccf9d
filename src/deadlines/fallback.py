"""Fallbacks for optional dependencies: on a timeout or a spent budget, use this instead.

An optional call (recommendations beside a product page) gets a tight limit and a
default, so that when it is slow the page renders without it instead of waiting:

    recs = await deadlines.fallback.call(lambda: fetch_recs(user), default=[], limit=0.3)

    @deadlines.fallback.returning([], limit=0.3)
    async def fetch_recs(user): ...

The default is returned when the call raises a `CallTimeout`, `DeadlineExceeded` or
`BudgetExhausted` (or what `on` names). Never caught, whatever `on` says:

* a cancellation (`asyncio.CancelledError`, trio's ``Cancelled``): a scope around
  this one fired, or the task is being stopped;
* `CallerLeft`: nobody is waiting for the answer, a default included;
* a `DeadlineExceeded` when the *request's* deadline has passed (not only this call's
  `limit`): no answer is useful any more, so the request must end.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar, cast

from . import _scope
from ._deadline import Deadline
from ._errors import CallerLeft, CallTimeout, DeadlineExceeded

__all__ = ["TIMEOUTS", "call", "call_sync", "returning"]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])

#: What a fallback replaces by default: a timed-out call or a spent budget.
TIMEOUTS: tuple[type[Exception], ...] = (CallTimeout, DeadlineExceeded)

OnFallback = Callable[[Exception], None]


def _check_on(on: tuple[type[Exception], ...]) -> tuple[type[Exception], ...]:
    if not isinstance(on, tuple) or not on:
        raise TypeError(f"on must be a non-empty tuple of exception types, not {on!r}")
    for kind in on:
        if not (isinstance(kind, type) and issubclass(kind, Exception)):
            raise TypeError(
                f"on may name only Exception subclasses, not {kind!r}: a fallback never"
                " catches a cancellation"
            )
    return on


def _falls_back(exc: Exception, on: tuple[type[Exception], ...], request: Deadline | None) -> bool:
    if isinstance(exc, CallerLeft) or not isinstance(exc, on):
        return False
    return not (isinstance(exc, DeadlineExceeded) and request is not None and request.expired)


async def call(
    fn: Callable[[], Awaitable[T]],
    *,
    default: T,
    limit: float | timedelta | None = None,
    on: tuple[type[Exception], ...] = TIMEOUTS,
    on_fallback: OnFallback | None = None,
) -> T:
    """Await ``fn()``; return `default` instead if it times out or the budget is spent.

    Args:
        fn: Makes the call, e.g. ``lambda: client.get("/recs")``.
        default: What to return instead.
        limit: Seconds the call may take (a `deadlines.scope` inside the request's).
        on: Exception types that mean "use the default" (Exception subclasses only).
        on_fallback: Called with the error when the default is used (log, count).
    """
    on = _check_on(on)
    request = _scope.current()
    try:
        if limit is None:
            return await fn()
        async with _scope.scope(limit):
            result = await fn()
        return result  # noqa: RET504 - mypy reads scope.__aexit__ as able to suppress
    except Exception as exc:
        if not _falls_back(exc, on, request):
            raise
        if on_fallback is not None:
            on_fallback(exc)
        return default


def call_sync(
    fn: Callable[[], T],
    *,
    default: T,
    limit: float | timedelta | None = None,
    on: tuple[type[Exception], ...] = TIMEOUTS,
    on_fallback: OnFallback | None = None,
) -> T:
    """The blocking twin of `call`. `limit` sets the deadline the call sees (see `check`)."""
    on = _check_on(on)
    request = _scope.current()
    try:
        if limit is None:
            return fn()
        with _scope.scope(limit):
            return fn()
    except Exception as exc:
        if not _falls_back(exc, on, request):
            raise
        if on_fallback is not None:
            on_fallback(exc)
        return default


def returning(
    default: Any,
    *,
    limit: float | timedelta | None = None,
    on: tuple[type[Exception], ...] = TIMEOUTS,
    on_fallback: OnFallback | None = None,
) -> Callable[[F], F]:
    """Decorate a function (async or not) to return `default` on a timeout; see `call`."""
    on = _check_on(on)

    def decorate(fn: F) -> F:
        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                return await call(
                    lambda: fn(*args, **kwargs),
                    default=default,
                    limit=limit,
                    on=on,
                    on_fallback=on_fallback,
                )

            return cast(F, async_wrapper)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return call_sync(
                lambda: fn(*args, **kwargs),
                default=default,
                limit=limit,
                on=on,
                on_fallback=on_fallback,
            )

        return cast(F, wrapper)

    return decorate
