"""`running()`: the running asyncio loop, without a system call on the hot path.

On CPython 3.11, ``asyncio.get_running_loop()`` (and ``asyncio.current_task()``, which
calls it) checks ``getpid()`` every time, to notice a fork: a system call, which on a
virtual machine costs more than the rest of a deadline scope. A request passes through
several of them. Here the loop last found running is remembered (in a global: it is
read faster than a thread-local); it is still the running one for the thread asking
exactly while its ``_thread_id`` is that thread (asyncio sets it for the duration of
``run_forever``), so threads with loops of their own are answered correctly, only
without the shortcut when they take turns. A fork clears the memory in the child.
Loops without ``_thread_id`` (uvloop) are asked every time.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import weakref
from collections.abc import Callable, MutableMapping
from typing import Any, TypeVar

T = TypeVar("T")

_recent: weakref.ref[asyncio.AbstractEventLoop] | None = None
_get_ident = threading.get_ident


def running() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, or None (no loop, or trio)."""
    global _recent
    ref = _recent
    if ref is not None:
        loop = ref()
        if loop is not None and getattr(loop, "_thread_id", None) == _get_ident():
            return loop
    loop = asyncio._get_running_loop()
    if loop is not None and getattr(loop, "_thread_id", None) is not None:
        _recent = weakref.ref(loop)
    return loop


#: The task running on `loop` (this thread's running loop), or None.
current_task: Callable[[asyncio.AbstractEventLoop], asyncio.Task[Any] | None]
if sys.version_info >= (3, 12):
    current_task = asyncio.current_task
else:
    # 3.11's `asyncio.current_task` is a Python function around a lookup in the table
    # that `asyncio.Task` keeps in C, and every request and call asks: ask the table
    # itself. (3.12 made `current_task` C.)
    current_task = asyncio.tasks._current_tasks.get  # type: ignore[attr-defined]


def forget_closed(
    registry: MutableMapping[asyncio.AbstractEventLoop, T], close: Callable[[T], None]
) -> None:
    """Drop the entries of closed loops from a per-loop registry, closing each.

    Per-loop state (a timer heap, a poller, a sweeper) refers back to its loop through
    its pending timer, so weak keys alone never free the loop: a registry calls this when
    it meets a loop it has not seen. It reads a snapshot, since threads running loops of
    their own share the registry; the loops still running are left alone.
    """
    for loop, entry in list(registry.items()):
        if loop.is_closed():
            registry.pop(loop, None)
            close(entry)


def _forget() -> None:
    global _recent
    _recent = None


os.register_at_fork(after_in_child=_forget)
