"""Hedged requests for the aiohttp client: one backup of a slow idempotent call, first wins."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from .. import _events, _scope
from .._dependency import Dependency
from ..retry import may_retry
from ._aiohttp import twin_request
from ._lib import aiohttp

Attempt = Callable[[aiohttp.ClientRequest], Awaitable[aiohttp.ClientResponse]]


async def hedged(
    dependency: Dependency, attempt: Attempt, request: aiohttp.ClientRequest, replayable: bool
) -> aiohttp.ClientResponse:
    """`attempt(request)`, with a backup by ``dependency.hedge`` if it may be sent twice."""
    hedge = dependency.hedge
    idempotent = may_retry(
        request.method, request_sent=True, idempotency_key="idempotency-key" in request.headers
    )
    delay = None
    if hedge is not None and replayable and idempotent:
        delay = hedge.delay(_scope.remaining())
    if delay is None:
        return await attempt(request)
    return await _race(dependency, attempt, request, delay)


async def _race(
    dependency: Dependency, attempt: Attempt, request: aiohttp.ClientRequest, delay: float
) -> aiohttp.ClientResponse:
    """The first answer of `request` and, if it is not in after `delay`, of a backup.

    An error ends the race only when no other attempt is running: the primary's error
    is raised when both fail. The loser is cancelled; a second answer is released.
    """
    hedge = dependency.hedge
    assert hedge is not None
    primary = asyncio.ensure_future(attempt(request))
    running = {primary}
    try:
        await asyncio.wait(running, timeout=delay)
        if not primary.done() and hedge.allow():
            if _events.active():
                _events.emit(_events.HedgeSent(dependency.name, delay))
            running.add(asyncio.ensure_future(attempt(twin_request(request))))
            while True:
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(done, key=lambda each: each is not primary):
                    if task.exception() is None:
                        running.discard(task)
                        return task.result()
                if running <= done:
                    break  # both failed: the primary's error
        running.discard(primary)
        return await primary  # not hedged, or both failed
    finally:
        for task in running:
            task.cancel()
        for task in running:
            try:
                answer = await asyncio.shield(task)
            except BaseException:  # cancelled as it should be, or failed: nothing to free
                continue
            answer.release()  # answered as the other won
