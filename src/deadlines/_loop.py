"""`running()`: the running asyncio loop, without a system call on the hot path.

On CPython 3.11, ``asyncio.get_running_loop()`` (and ``asyncio.current_task()``, which
calls it) checks ``getpid()`` every time, to notice a fork: a system call, which on a
virtual machine costs more than the rest of a deadline scope. A request passes through
several of them. Here each thread remembers the loop it last found running; the loop is
still the running one exactly while its ``_thread_id`` is this thread (asyncio sets it
for the duration of ``run_forever``), and a fork clears the memory in the child.
Loops without ``_thread_id`` (uvloop) are asked every time.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref

_last = threading.local()


def running() -> asyncio.AbstractEventLoop | None:
    """The event loop running in this thread, or None (no loop, or trio)."""
    ref: weakref.ref[asyncio.AbstractEventLoop] | None = getattr(_last, "loop", None)
    if ref is not None:
        loop = ref()
        if loop is not None and getattr(loop, "_thread_id", None) == threading.get_ident():
            return loop
    loop = asyncio._get_running_loop()
    if loop is not None and getattr(loop, "_thread_id", None) is not None:
        _last.loop = weakref.ref(loop)
    return loop


def _forget() -> None:
    _last.__dict__.clear()


os.register_at_fork(after_in_child=_forget)
