"""`AsyncBounded`: a transport of the user's (a mock, a proxy of theirs), inside the budget."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ..._dependency import Dependency
from ...wire import HEADER
from .._call import Call, start
from .._lib import httpx
from .._primitives import AsyncWindow
from .transport import with_retries


class AsyncBounded(httpx.AsyncBaseTransport):
    """`transport`, each call inside the request's deadline and `dependency`'s total.

    What a transport of the user's gets (``httpx.MockTransport``, respx, their own):

    * the time left is sent onward in ``x-request-timeout-ms``;
    * the time left is the request's httpx ``timeout`` where that is shorter, which
      httpx's own transports honour phase by phase;
    * the whole call, body included, is cancelled at the call's end (async);
    * a limit that runs out is raised as ours and as httpx's timeout;
    * the dependency's ``retry`` applies.

    The per-phase caps (pool, connect, headers, idle) need a transport of ours: this
    one cannot see the phases inside the transport it wraps.
    """

    def __init__(self, dependency: Dependency, transport: httpx.AsyncBaseTransport) -> None:
        self.dependency = dependency
        self.transport = transport

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send `request` through the wrapped transport, inside the budget."""
        return await with_retries(self.dependency, self._attempt, request)

    async def _attempt(self, request: httpx.Request) -> httpx.Response:
        call = start(self.dependency, request.extensions.get("timeout"))
        try:
            request.headers[HEADER] = call.budget.header_ms()
            left = call.budget.limit("total")
            call.limit, call.request_sent = "total", True  # unknown: assume it was sent
            request.extensions["timeout"] = _within(request.extensions.get("timeout"), left)
            try:
                answer = await self._send(call, request, left)
            except httpx.TimeoutException as exc:
                if call.budget.left() > 0.0:
                    raise  # the wrapped transport's own limit, not ours
                raise call.error(exc, phase="headers") from exc
            call.budget.answered(answer.status_code)
        except BaseException as exc:
            call.budget.finish(exc)
            raise
        answer.stream = AsyncBoundedBody(answer.stream, call)
        return answer

    async def _send(self, call: Call, request: httpx.Request, left: float) -> httpx.Response:
        with AsyncWindow(call, left):
            return await self.transport.handle_async_request(request)
        raise call.error(phase="headers")  # only when our own window fired

    async def __aenter__(self) -> AsyncBounded:
        await self.transport.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.transport.__aexit__(*exc_info)

    async def aclose(self) -> None:
        """Close the wrapped transport."""
        await self.transport.aclose()


def _within(timeout: Any, left: float) -> dict[str, float | None]:
    """httpx's per-phase timeouts, none longer than `left` seconds."""
    given = dict(timeout or {})
    return {
        phase: left if given.get(phase) is None else min(given[phase], left)
        for phase in ("connect", "read", "write", "pool")
    }


class AsyncBoundedBody(httpx.AsyncByteStream):
    """The wrapped transport's body, each read ending by the call's end; closing ends the call."""

    def __init__(self, inner: Any, call: Call) -> None:
        self._inner = inner
        self._call = call

    async def __aiter__(self) -> AsyncIterator[bytes]:
        call = self._call
        iterator = self._inner.__aiter__()
        while True:
            try:
                chunk = await self._next(iterator)
            except StopAsyncIteration:
                break
            except BaseException as exc:
                call.budget.finish(exc)
                raise
            yield chunk

    async def _next(self, iterator: AsyncIterator[bytes]) -> bytes:
        call = self._call
        with AsyncWindow(call, call.budget.limit("total")):
            return await iterator.__anext__()
        raise call.error(phase="body")

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            self._call.budget.finish()
