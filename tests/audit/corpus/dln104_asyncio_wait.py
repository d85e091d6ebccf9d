"""DLN104: asyncio.wait() returning with tasks still running, never cancelled."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

Query = Callable[[], Awaitable[Any]]


async def first_replica(replicas: list[Query]) -> Any:
    tasks = [asyncio.create_task(query()) for query in replicas]
    done, _pending = await asyncio.wait(  # expect: DLN104
        tasks, return_when=asyncio.FIRST_COMPLETED
    )
    return done.pop().result()


async def whatever_is_ready(tasks: list[asyncio.Task[Any]]) -> list[Any]:
    done, _ = await asyncio.wait(tasks, timeout=2.0)  # expect: DLN104
    return [task.result() for task in done]


async def fire_and_wait(tasks: list[asyncio.Task[Any]]) -> None:
    await asyncio.wait(tasks, timeout=1)  # expect: DLN104


async def first_replica_cancels(replicas: list[Query]) -> Any:
    tasks = [asyncio.create_task(query()) for query in replicas]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    return done.pop().result()


def _cancel_all(tasks: Iterable[asyncio.Task[Any]]) -> None:
    for task in tasks:
        task.cancel()


async def ready_within(tasks: list[asyncio.Task[Any]]) -> list[Any]:
    done, pending = await asyncio.wait(tasks, timeout=0.5)
    _cancel_all(pending)
    return [task.result() for task in done]


async def race_with_disconnect(work: asyncio.Task[Any], disconnected: asyncio.Task[Any]) -> Any:
    try:
        await asyncio.wait({work, disconnected}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        work.cancel()
        disconnected.cancel()
    return work.result()


async def drain(tasks: set[asyncio.Task[Any]], handle: Callable[[Any], None]) -> None:
    pending = set(tasks)
    while pending:
        done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            handle(task.result())


async def everything(tasks: list[asyncio.Task[Any]]) -> list[Any]:
    done, _pending = await asyncio.wait(tasks)
    return [task.result() for task in done]


async def caller_owns_the_rest(
    tasks: list[asyncio.Task[Any]],
) -> tuple[set[asyncio.Task[Any]], set[asyncio.Task[Any]]]:
    done, pending = await asyncio.wait(tasks, timeout=1)
    return done, pending
