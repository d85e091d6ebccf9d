"""Hedged requests for the async client: one backup of a slow idempotent call, first wins.

Async only: a blocking call cannot be cancelled, so the loser could not be stopped.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from .. import _events, _scope
from .._dependency import Dependency
from ..retry import may_retry
from ._lib import anyio, httpx

Attempt = Callable[[httpx.Request], Awaitable[httpx.Response]]


def hedging(dependency: Dependency, attempt: Attempt) -> Attempt:
    """`attempt`, hedged by ``dependency.hedge`` for the requests that may be sent twice."""

    async def hedged(request: httpx.Request) -> httpx.Response:
        hedge = dependency.hedge
        if hedge is None or not hedgeable(request):
            return await attempt(request)
        delay = hedge.delay(_scope.remaining())
        if delay is None:
            return await attempt(request)
        return await _race(dependency, attempt, request, delay)

    return hedged


def hedgeable(request: httpx.Request) -> bool:
    """Idempotent (by method or an ``Idempotency-Key``), with a body that can be sent again."""
    return isinstance(request.stream, httpx.ByteStream) and may_retry(
        request.method, request_sent=True, idempotency_key="idempotency-key" in request.headers
    )


async def _race(
    dependency: Dependency, attempt: Attempt, request: httpx.Request, delay: float
) -> httpx.Response:
    """The first answer of `request` and, if it is not in after `delay`, of a backup.

    An error ends the race only when no other attempt is running: the primary's error
    is raised when both fail. The loser is cancelled; a second answer is closed.
    """
    hedge = dependency.hedge
    assert hedge is not None
    answers: list[httpx.Response] = []
    errors: dict[bool, Exception] = {}  # by whether the attempt was the backup
    backup_sent = anyio.Event()

    async def run(copy: httpx.Request | None, group: anyio.abc.TaskGroup) -> None:
        if copy is not None:  # the backup: only if the primary is still out by then
            await anyio.sleep(delay)
            if not hedge.allow():
                return
            backup_sent.set()
            if _events.active():
                _events.emit(_events.HedgeSent(dependency.name, delay))
        try:
            answer = await attempt(copy or request)
        except Exception as exc:
            errors[copy is not None] = exc
            if copy is None and not backup_sent.is_set():
                group.cancel_scope.cancel()  # no backup yet: none now
            return
        answers.append(answer)
        group.cancel_scope.cancel()

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(run, None, group)
            group.start_soon(run, _copy(request), group)
    except BaseException:
        await _close_all(answers)
        raise
    if answers:
        await _close_all(answers[1:])  # both answered at once: the first wins
        return answers[0]
    raise errors.get(False) or errors[True]


def _copy(request: httpx.Request) -> httpx.Request:
    """A second request like `request`, with its own headers (each attempt sets its own)."""
    return httpx.Request(
        request.method,
        request.url,
        headers=request.headers.copy(),
        stream=request.stream,
        extensions=dict(request.extensions),
    )


async def _close_all(answers: list[httpx.Response]) -> None:
    with anyio.CancelScope(shield=True):
        for answer in answers:
            await answer.aclose()
