"""Streams: three limits for a streamed answer (first item, idle gap, total), then close it.

One total timeout cannot tell a healthy long answer from a stuck one. A streamed call,
an LLM's tokens above all, needs three limits:

* `first` — time to the first item. A provider that has not started is queueing or
  down: give up now and fail over while the user is still waiting (`FirstItemTimeout`).
* `idle` — the longest gap between two items. A stream that goes silent mid-answer
  has stalled (`StreamIdleTimeout`).
* `total` — the whole stream, capped by the request's deadline. Only this catches a
  stream that trickles forever (`TotalTimeout`, or `DeadlineExceeded` when the
  request's deadline was the binding limit).

    async for chunk in streams.guard(client.chat.completions.create(..., stream=True),
                                     first=10, idle=15, total=120):
        ...

On any of them, when the consumer stops early (``break``, ``aclose()``) and when it is
cancelled, the underlying stream is **closed**, so the provider's connection ends and
no more tokens are paid for. Standard library only: the async form runs on asyncio and
trio (and anyio over either).
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import queue
import threading
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Iterable,
    Iterator,
    Mapping,
)
from datetime import timedelta
from typing import Any, Generic, Literal, TypeVar, overload

from . import _clock, _scope, _validate
from ._budget import CallBudget
from ._dependency import Dependency
from ._errors import FirstItemTimeout, HeadersTimeout, IdleTimeout, StreamIdleTimeout

T = TypeVar("T")

__all__ = [
    "FirstItemTimeout",
    "StreamIdleTimeout",
    "failover",
    "guard",
    "guard_sync",
]

_MIN_LIMIT = 1e-6  # a limit of "no time left": fails at the first wait

#: Longest wait for a stream's own close (a socket close is instant; a wedged one is not).
CLOSE_GRACE = 1.0

_Which = Literal["headers", "idle"]
Closer = Callable[[], object]


def _limits(
    name: str, first: float | timedelta, idle: float | timedelta, total: float | timedelta
) -> Dependency:
    first_s = _validate.seconds(first, "first", allow_zero=False)
    return Dependency(
        name,
        connect=first_s,  # a stream's connect phase is part of the wait for its first item
        headers=first_s,
        idle=_validate.seconds(idle, "idle", allow_zero=False),
        total=_validate.seconds(total, "total", allow_zero=False),
    )


def _timeout(budget: CallBudget, which: _Which) -> TimeoutError:
    """The error for `which` running out, with the stream's own classes for its caps."""
    exc = budget.timeout(which, request_sent=True)
    # Only the caps' own errors are renamed; TotalTimeout / DeadlineExceeded stay as they are.
    if type(exc) is HeadersTimeout:
        return FirstItemTimeout(limit=exc.limit, elapsed=exc.elapsed, dependency=exc.dependency)
    if type(exc) is IdleTimeout:
        return StreamIdleTimeout(limit=exc.limit, elapsed=exc.elapsed, dependency=exc.dependency)
    return exc


# The async form.


@overload
def guard(
    source: AsyncIterable[T],
    *,
    first: float | timedelta,
    idle: float | timedelta,
    total: float | timedelta,
    name: str = ...,
    close: Closer | None = ...,
) -> AsyncGenerator[T, None]: ...
@overload
def guard(
    source: Awaitable[AsyncIterable[T]],
    *,
    first: float | timedelta,
    idle: float | timedelta,
    total: float | timedelta,
    name: str = ...,
    close: Closer | None = ...,
) -> AsyncGenerator[T, None]: ...
def guard(
    source: AsyncIterable[T] | Awaitable[AsyncIterable[T]],
    *,
    first: float | timedelta,
    idle: float | timedelta,
    total: float | timedelta,
    name: str = "stream",
    close: Closer | None = None,
) -> AsyncGenerator[T, None]:
    """Yield the items of `source`, enforcing the first-item, idle and total limits.

    Args:
        source: An async iterable, or an awaitable that opens one (such as the
            coroutine returned by ``client.chat.completions.create(..., stream=True)``);
            then the time to open it counts toward `first`.
        first: Longest wait for the first item (`FirstItemTimeout`).
        idle: Longest wait for each later item (`StreamIdleTimeout`).
        total: The whole stream, capped by the current deadline (`TotalTimeout`, or
            `DeadlineExceeded` when the request's deadline was binding).
        name: The dependency's name in errors and metrics, e.g. ``"openai"``.
        close: Called (and awaited if it returns an awaitable) after the stream is
            closed, for an object that owns the connection, e.g. ``response.aclose``
            when `source` is ``response.aiter_lines()`` of an httpx response.

    The limits count from the first request for an item. Each wait is cancelled at its
    instant. On a timeout, an error, cancellation or an early stop, `source` is closed
    (``aclose()``, else ``close()``), then `close` is called, each bounded by
    `CLOSE_GRACE`. A bare ``break`` closes it when the generator is collected (at once
    in CPython under asyncio); ``async with contextlib.aclosing(guard(...))`` closes it
    as the block exits, everywhere (use it under trio).
    """
    try:
        limits = _limits(name, first, idle, total)
    except BaseException:
        if inspect.iscoroutine(source):
            source.close()  # never awaited: close it rather than leak a warning
        raise
    return _guarded(source, limits, close)


async def _guarded(
    source: AsyncIterable[T] | Awaitable[AsyncIterable[T]],
    limits: Dependency,
    close: Closer | None,
) -> AsyncGenerator[T, None]:
    opened = source if isinstance(source, AsyncIterable) else None
    iterator: AsyncIterator[T] | None = None
    try:
        budget = CallBudget(limits)
        budget.request_sent = True  # a stream's request is on its way or answered
        with budget:
            if opened is None:
                assert not isinstance(source, AsyncIterable)
                opened = await _within(budget, "headers", source)
            iterator = aiter(opened)
            which: _Which = "headers"
            while True:
                try:
                    item = await _within(budget, which, anext(iterator))
                except StopAsyncIteration:
                    return
                yield item
                which = "idle"
    finally:
        if inspect.iscoroutine(source) and opened is None:
            source.close()  # cancelled or failed before it ran: no "never awaited" warning
        await _close_all(iterator, opened, close)


async def _within(budget: CallBudget, which: _Which, awaitable: Awaitable[T]) -> T:
    """Await `awaitable`, cancelled when `which`'s limit (or the stream's end) passes."""
    limit = budget.limit(which)
    if limit <= 0.0:
        if inspect.iscoroutine(awaitable):
            awaitable.close()
        raise _timeout(budget, which)
    canceller = _scope.Canceller.start(limit)
    try:
        result = await awaitable
    except BaseException as exc:
        if canceller.stop(type(exc), exc):
            raise _timeout(budget, which) from None
        raise
    canceller.stop(None, None)
    return result


async def _close_all(iterator: object, opened: object, close: Closer | None) -> None:
    """Close the iterator, then the stream it came from, then call `close`.

    Each step is bounded by `CLOSE_GRACE` and runs even inside a cancelled scope.
    """
    for obj in (iterator, opened) if iterator is not opened else (iterator,):
        method = getattr(obj, "aclose", None) or getattr(obj, "close", None)
        if callable(method):
            await _shielded(_call(method))
    if close is not None:
        await _shielded(_call(close))


async def _call(fn: Closer) -> None:
    result = fn()
    if inspect.isawaitable(result):
        await result


async def _shielded(coro: Awaitable[None]) -> None:
    """Run a cleanup step to the end even inside a cancelled scope, for `CLOSE_GRACE` at most.

    Under trio a cancelled scope cancels every later checkpoint, so closing needs a
    shield; asyncio delivers a cancellation once, so a plain bounded wait is enough.
    """
    trio = _scope.running_trio()
    if trio is not None:
        with trio.move_on_after(CLOSE_GRACE) as cleanup:
            cleanup.shield = True
            await coro
        return
    try:
        async with asyncio.timeout(CLOSE_GRACE):
            await coro
    except TimeoutError:
        return  # a close that hangs is abandoned; the error being raised matters more


# Fail-over: the same request to the next provider when the first one does not start.


async def failover(
    providers: Mapping[str, Callable[[], AsyncIterable[T] | Awaitable[AsyncIterable[T]]]],
    *,
    first: float | timedelta,
    idle: float | timedelta,
    total: float | timedelta,
    on: tuple[type[BaseException], ...] = (FirstItemTimeout,),
) -> AsyncGenerator[T, None]:
    """Stream from the first provider that starts in time, trying each one in turn.

    `providers` maps a name (used in errors and metrics) to an opener, e.g.
    ``{"primary": lambda: a.chat.completions.create(..., stream=True), "backup": ...}``.
    Each is given `first` to deliver its first item. When one fails with an error in
    `on` before any item was yielded, its stream is closed and the next one gets the
    same request; once an item was yielded there is no fail-over (the user has seen
    part of an answer). `total` covers all attempts together and is capped by the
    deadline, so the fail-over happens only while somebody still waits. The last
    failure is raised when no provider is left.
    """
    if not providers:
        raise ValueError("failover needs at least one provider")
    names = list(providers)
    limits = _limits(names[0], first, idle, total)  # validate the numbers before any call
    end = _clock.now() + limits.total
    for index, name in enumerate(names):
        started = False
        stream: AsyncGenerator[T, None] | None = None
        try:
            left = max(end - _clock.now(), _MIN_LIMIT)
            stream = guard(providers[name](), first=first, idle=idle, total=left, name=name)
            async for item in stream:
                started = True
                yield item
            return
        except on:
            if started or index == len(names) - 1:
                raise
        finally:
            if stream is not None:
                await stream.aclose()


# The sync form.


def guard_sync(
    source: Iterable[T],
    *,
    first: float | timedelta,
    idle: float | timedelta,
    total: float | timedelta,
    name: str = "stream",
    close: Closer | None = None,
) -> Generator[T, None, None]:
    """Yield the items of a blocking iterable, enforcing the first, idle and total limits.

    Python cannot interrupt a blocked read in the calling thread, so the items are
    pulled by one helper thread per stream (one item at a time, no read-ahead, the
    context copied in) while the caller waits with the limit. What that buys, and
    what it does not:

    * The **caller** gets `FirstItemTimeout` / `StreamIdleTimeout` / `TotalTimeout` /
      `DeadlineExceeded` at the instant, however the source blocks.
    * The **source** is stopped only as well as `close` can stop it: pass a callable
      that breaks the blocked read from another thread (``response.close`` of an httpx
      or requests stream closes its connection). Without one the helper thread stays
      blocked until the source returns, then exits; give the source its own read
      timeout (e.g. ``httpx.Timeout(read=idle)``) so that is bounded too.
    * After the helper has stopped, an iterator with ``close()`` (a generator) is closed.

    The thread is a daemon: a source that never returns cannot block interpreter exit.
    """
    limits = _limits(name, first, idle, total)
    return _guarded_sync(source, limits, close)


def _guarded_sync(
    source: Iterable[T], limits: Dependency, close: Closer | None
) -> Generator[T, None, None]:
    pump: _Pump[T] | None = None
    try:
        budget = CallBudget(limits)
        budget.request_sent = True
        with budget:
            pump = _Pump(source, limits.name)
            which: _Which = "headers"
            while True:
                limit = budget.limit(which)
                if limit <= 0.0:
                    raise _timeout(budget, which)
                outcome = pump.next(limit)
                if outcome is None:
                    raise _timeout(budget, which)
                kind, value = outcome
                if kind == "end":
                    return
                if kind == "error":
                    raise value
                yield value
                which = "idle"
    finally:
        if pump is not None:
            pump.stop(close)
        elif close is not None:
            close()


class _Pump(Generic[T]):
    """Pulls one item at a time from a blocking iterable on its own daemon thread."""

    def __init__(self, source: Iterable[T], name: str) -> None:
        self._source = source
        self._asks: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._results: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        context = contextvars.copy_context()
        self._thread = threading.Thread(
            target=context.run, args=(self._run,), name=f"deadlines-stream-{name}", daemon=True
        )
        self._started = False

    def next(self, timeout: float) -> tuple[str, Any] | None:
        """Ask for one item; None when it did not come within `timeout` seconds."""
        if not self._started:
            self._started = True
            self._thread.start()
        self._asks.put(True)
        try:
            return self._results.get(timeout=timeout)
        except queue.Empty:
            return None

    def _run(self) -> None:
        iterator: Iterator[T] | None = None
        try:
            iterator = iter(self._source)
            while self._asks.get():
                try:
                    item = next(iterator)
                except StopIteration:
                    self._results.put(("end", None))
                    return
                self._results.put(("item", item))
        except BaseException as exc:  # handed to the caller, raised there (if it still waits)
            self._results.put(("error", exc))
        finally:
            # Closed here, on the thread that used it: a generator cannot be closed from
            # another thread while it is blocked inside `next`.
            closer = getattr(iterator, "close", None)
            if callable(closer):
                closer()

    def stop(self, close: Closer | None) -> None:
        """Tell the thread to stop and break its read with `close`; never wait for it.

        The caller's error must not wait for a source that does not stop: the thread
        closes the iterator and exits as soon as its current read returns.
        """
        self._asks.put(False)
        try:
            if close is not None:
                close()
        finally:
            if not self._started:  # never iterated: close the source here
                closer = getattr(self._source, "close", None)
                if callable(closer):
                    closer()
