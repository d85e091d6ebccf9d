"""DLN103: concurrent.futures waits that stop the waiter but leave the thread working."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor, wait
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any


def render_recommendations(executor: Executor, load: Callable[[str], list[str]], user: str) -> Any:
    future = executor.submit(load, user)
    try:
        return future.result(timeout=0.3)  # expect: DLN103
    except FutureTimeout:
        future.cancel()  # returns False: the call is already running
        return []


def positional_timeout(future: concurrent.futures.Future[int]) -> int:
    return future.result(2.0)  # expect: DLN103


def first_batch(executor: Executor, jobs: list[Callable[[], int]]) -> list[int]:
    futures = [executor.submit(job) for job in jobs]
    done, _not_done = wait(futures, timeout=2.0)  # expect: DLN103
    return [f.result() for f in done]


def stream_results(futures: list[concurrent.futures.Future[int]]) -> list[int]:
    ready = concurrent.futures.as_completed(futures, timeout=5)  # expect: DLN103
    return [f.result() for f in ready]


def waits_for_all(futures: list[concurrent.futures.Future[int]]) -> list[int]:
    concurrent.futures.wait(futures)
    return [f.result() for f in futures]


def from_another_thread(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, int]) -> int:
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return future.result(timeout=1.0)  # cancelled below: the coroutine stops
    except FutureTimeout:
        future.cancel()
        raise


def from_another_thread_leaks(
    loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, int]
) -> int:
    future = asyncio.run_coroutine_threadsafe(coro, loop)
    return future.result(timeout=1.0)  # expect: DLN103


async def asyncio_wait_for_cancels(coro: Coroutine[Any, Any, int]) -> int:
    return await asyncio.wait_for(coro, timeout=1.0)
