"""The few pieces where the async and blocking halves differ, each written twice by hand.

The pool and the transport are written once, async (`_async/`), and the blocking half
(`_sync/`) is generated from them by ``scripts/unasync.py``, which renames ``AsyncX`` to
``X``. What cannot be renamed lives here as a pair:

* `AsyncGate` / `Gate`: the dependency's bulkhead, at most `size` calls in flight, the
  wait for a place bounded by the pool limit and measured;
* `AsyncWindow` / `Window`: bounds an HTTP/2 wait by cancelling (async); blocking code
  cannot be cancelled, and its shared reads end by their socket timeouts instead;
* `AsyncShield` / `Shield`: protects a close from cancellation (async); nothing to do
  in blocking code;
* `async_trace` / `sync_trace`: the trace hook that refreshes the deadline header.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Literal

from .. import _clock
from ._call import Call
from ._lib import anyio


class AsyncGate:
    """The dependency's pool: at most `size` calls in flight, waits bounded and measured."""

    def __init__(self, size: int) -> None:
        self._semaphore = anyio.Semaphore(size)

    async def acquire(self, call: Call) -> None:
        """Take a place, waiting at most the pool limit (`PoolTimeout` or the binding one)."""
        try:
            self._semaphore.acquire_nowait()
        except anyio.WouldBlock:
            start = _clock.now()
            try:
                with anyio.move_on_after(call.budget.limit("pool")) as waited:
                    await self._semaphore.acquire()
            finally:
                call.budget.pool_wait = _clock.now() - start
            if waited.cancelled_caught:
                raise call.error() from None
        else:
            call.budget.pool_wait = 0.0  # a free place: no wait at all

    def release(self) -> None:
        """Give the place back."""
        self._semaphore.release()


class Gate:
    """The blocking twin of `AsyncGate`."""

    def __init__(self, size: int) -> None:
        self._semaphore = threading.BoundedSemaphore(size)

    def acquire(self, call: Call) -> None:
        """Take a place, waiting at most the pool limit (`PoolTimeout` or the binding one)."""
        if self._semaphore.acquire(blocking=False):
            call.budget.pool_wait = 0.0  # a free place: no wait at all
            return
        start = _clock.now()
        acquired = self._semaphore.acquire(timeout=call.budget.limit("pool"))
        call.budget.pool_wait = _clock.now() - start
        if not acquired:
            raise call.error()

    def release(self) -> None:
        """Give the place back."""
        self._semaphore.release()


class AsyncWindow:
    """A cancel scope ending `seconds` from now (None: no window), made the call's own.

    While it is the call's (`Call.scope`), each phase that begins moves its end to that
    phase's limit. `__exit__` swallows only its own cancellation: the caller then raises
    the call's error.
    """

    __slots__ = ("_call", "_scope")

    def __init__(self, call: Call, seconds: float | None) -> None:
        self._call = call
        self._scope = (
            None if seconds is None else anyio.CancelScope(deadline=anyio.current_time() + seconds)
        )

    def __enter__(self) -> AsyncWindow:
        if self._scope is not None:
            self._call.scope = self._scope.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if self._scope is None:
            return False
        self._call.scope = None
        return bool(self._scope.__exit__(exc_type, exc, tb))


class Window:
    """The blocking twin of `AsyncWindow`: nothing to cancel, socket timeouts bound each wait."""

    __slots__ = ()

    def __init__(self, call: Call, seconds: float | None) -> None:
        pass

    def __enter__(self) -> Window:
        return self

    def __exit__(self, *exc_info: object) -> Literal[False]:
        return False


class AsyncShield:
    """Shield a block from cancellation (an anyio scope: asyncio's and trio's alike).

    On asyncio a `Task.cancel` from outside still interrupts a shielded await, so the
    code shielded here does its bookkeeping before its first await.
    """

    __slots__ = ("_scope",)

    def __init__(self) -> None:
        self._scope = anyio.CancelScope(shield=True)

    def __enter__(self) -> AsyncShield:
        self._scope.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        return bool(self._scope.__exit__(exc_type, exc, tb))


class Shield:
    """The blocking twin of `AsyncShield`: blocking code is never cancelled."""

    __slots__ = ()

    def __enter__(self) -> Shield:
        return self

    def __exit__(self, *exc_info: object) -> Literal[False]:
        return False


def async_trace(call: Call, user_trace: Any) -> Callable[..., Any]:
    """A trace hook for `call`, passing every event on to the caller's own hook, if any."""

    async def trace(name: str, info: Mapping[str, Any]) -> None:
        call.on_send(name, info)
        if user_trace is not None:
            await user_trace(name, info)

    return trace


def sync_trace(call: Call, user_trace: Any) -> Callable[..., Any]:
    """The blocking twin of `async_trace`."""

    def trace(name: str, info: Mapping[str, Any]) -> None:
        call.on_send(name, info)
        if user_trace is not None:
            user_trace(name, info)

    return trace
