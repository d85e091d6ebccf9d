"""`Middleware`: the aiohttp client middleware that bounds each request by a dependency."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from .. import _loop, retry
from .._dependency import Dependency
from ..wire import HEADER
from ._aiohttp import start_idle_timer
from ._call import Call, current, translate
from ._content import Content
from ._hedge import hedged
from ._lib import aiohttp
from ._response import Response

_SWITCHING_PROTOCOLS = 101  # a WebSocket's handshake: the call ends at the upgrade


class Middleware:
    """Bounds each request of an `aiohttp.ClientSession` by `dependency` and the deadline.

    aiohttp's public seam: pass it first in the session's ``middlewares``, so that the
    rest of the chain runs inside it. For every request it makes a call of the
    dependency (`BudgetExhausted` below ``min_useful``), sends the time left onward,
    keeps one timer over the phases up to the response head, bounds each body read by
    the idle gap and the call's end, raises what runs out as ours and aiohttp's own
    timeout, retries by the dependency's rule, and hedges an idempotent request by its
    `deadlines.Hedge`.

    With the session's connector ours (`deadlines.aiohttp.session`), every phase has its
    own limit: pool, connect, headers. With a connector of the user's, the middleware
    cannot see the phases: the head is awaited within the call's total and the
    deadline, and the time left is sent as the request starts. With a response class
    other than `Response` the call is reported when its head arrives.

    `eager` starts the timer as the request enters the middleware, for sessions whose
    inner middlewares or trace hooks can wait before a connection is asked for;
    otherwise it starts only when something can wait (the pool, a connect).
    """

    def __init__(self, dependency: Dependency, *, own_connector: bool, eager: bool) -> None:
        if not isinstance(dependency, Dependency):
            raise TypeError(f"dependency must be a deadlines.Dependency, not {dependency!r}")
        self.dependency = dependency
        self._own_connector = own_connector
        self._eager = eager or not own_connector
        # Known once (a Dependency is frozen): most requests go straight to one attempt.
        self._plain = dependency.retry is None and dependency.hedge is None

    def __call__(
        self, request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> Coroutine[Any, Any, aiohttp.ClientResponse]:
        # Returns the attempt's coroutine rather than being one: one coroutine less.
        if self._plain:
            return self._attempt(request, handler)
        if self.dependency.retry is None:
            return self._one(request, handler)
        return self._with_retries(request, handler)

    def _one(
        self, request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> Coroutine[Any, Any, aiohttp.ClientResponse]:
        """One attempt, hedged by the dependency's `Hedge` if it has one."""
        if self.dependency.hedge is None:
            return self._attempt(request, handler)
        return hedged(
            self.dependency,
            lambda each: self._attempt(each, handler),
            request,
            _replayable(request),
        )

    async def _with_retries(
        self, request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        policy = self.dependency.retry
        assert policy is not None
        return await retry.run_async(
            lambda: self._one(request, handler),
            policy=policy,
            method=request.method,
            idempotency_key="idempotency-key" in request.headers,
            replayable=_replayable(request),
            request_sent=_request_sent,
            retry_response=lambda response: response.status in policy.statuses,
            discard=_release,
            dependency=self.dependency,
        )

    async def _attempt(
        self, request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        # `_loop.running()` first: 3.11's get_running_loop() makes a getpid() system call.
        loop = _loop.running() or asyncio.get_running_loop()
        call = Call(self.dependency, loop)  # BudgetExhausted: nothing was sent
        call.__enter__()
        token = current.set(call)
        try:
            if not self._own_connector:  # the phases are out of sight: the head in the total
                request.headers[HEADER] = call.header_ms()
                call.request_sent = True
                call.arm("total")
            elif self._eager:
                call.arm("pool")
            # The guard, started by `arm`, is left here as ``async with`` would (two
            # coroutines less per call): the head has arrived, or the call failed.
            try:
                response = await handler(request)
            except BaseException as exc:
                guard = call.guard
                if guard is not None and guard.leave(type(exc)):
                    raise call.error() from exc
                if (
                    isinstance(exc, TimeoutError)
                    and (error := translate(call, guard, exc)) is not exc
                ):
                    raise error from exc
                raise
            if call.guard is not None:
                call.guard.leave(None)
            call.answered(response.status)
        except BaseException as exc:
            call.finish(exc)
            raise
        finally:
            current.reset(token)
            call.guard = None
        if response.status == _SWITCHING_PROTOCOLS:  # a WebSocket's: its frames are its own
            call.finish()
            return response
        # The body's reads bounded; the call's end reported when the response is released.
        if isinstance(response, Response):
            response._deadlines_call = call
        else:
            call.finish()  # a response class that cannot report its end: at the head
        raw = response.content
        if not raw.is_eof():  # a body already whole (most small ones) has no read to bound
            response.content = Content(raw, call, response)  # type: ignore[assignment]
            start_idle_timer(response, call.dependency.idle)
        return response


def _request_sent(exc: BaseException) -> bool | None:
    """For retries: whether `exc` may have reached the server (None: do not retry)."""
    if isinstance(exc, aiohttp.ClientConnectorError):
        return False
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError):
        return True
    return retry.request_sent(exc)


def _replayable(request: aiohttp.ClientRequest) -> bool:
    """Whether the request's body can be sent again (none, or bytes in memory)."""
    body: Any = request.body
    return body is None or isinstance(body, bytes | bytearray | aiohttp.payload.BytesPayload)


async def _release(response: aiohttp.ClientResponse) -> None:
    response.release()
