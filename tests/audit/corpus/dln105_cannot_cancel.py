"""DLN105: an asyncio timeout around work that the cancellation cannot stop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

import anyio


async def shielded(coro: Coroutine[Any, Any, int]) -> int:
    return await asyncio.wait_for(asyncio.shield(coro), timeout=1)  # expect: DLN105


async def in_executor(loop: asyncio.AbstractEventLoop, work: Callable[[], int]) -> int:
    return await asyncio.wait_for(loop.run_in_executor(None, work), 2.0)  # expect: DLN105


async def to_thread_in_scope(work: Callable[[], int]) -> int:
    async with asyncio.timeout(1):
        return await asyncio.to_thread(work)  # expect: DLN105


async def anyio_thread_in_scope(work: Callable[[], int]) -> int:
    with anyio.fail_after(1):
        return await anyio.to_thread.run_sync(work)  # expect: DLN105


async def coroutine_is_cancelled(coro: Coroutine[Any, Any, int]) -> int:
    return await asyncio.wait_for(coro, 1)


async def scope_around_a_coroutine(fetch: Callable[[], Coroutine[Any, Any, int]]) -> int:
    async with asyncio.timeout(1):
        return await fetch()


async def thread_without_timeout(work: Callable[[], int]) -> int:
    return await asyncio.to_thread(work)
