# Generated from _async/bounded.py by scripts/unasync.py: edit that file, not this.
"""`Bounded`: a transport of the user's (a mock, a proxy of theirs), inside the budget."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ..._dependency import Dependency
from ...wire import HEADER
from .._call import Call, start
from .._lib import httpx
from .._primitives import Window
from .transport import with_retries


class Bounded(httpx.BaseTransport):
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

    def __init__(self, dependency: Dependency, transport: httpx.BaseTransport) -> None:
        self.dependency = dependency
        self.transport = transport

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        """Send `request` through the wrapped transport, inside the budget."""
        return with_retries(self.dependency, self._attempt, request)

    def _attempt(self, request: httpx.Request) -> httpx.Response:
        call = start(self.dependency, request.extensions.get("timeout"))
        try:
            request.headers[HEADER] = call.budget.header_ms()
            left = call.budget.limit("total")
            call.limit, call.request_sent = "total", True  # unknown: assume it was sent
            request.extensions["timeout"] = _within(request.extensions.get("timeout"), left)
            try:
                answer = self._send(call, request, left)
            except httpx.TimeoutException as exc:
                if call.budget.left() > 0.0:
                    raise  # the wrapped transport's own limit, not ours
                raise call.error(exc, phase="headers") from exc
            call.budget.answered(answer.status_code)
        except BaseException as exc:
            call.budget.finish(exc)
            raise
        answer.stream = BoundedBody(answer.stream, call)
        return answer

    def _send(self, call: Call, request: httpx.Request, left: float) -> httpx.Response:
        with Window(call, left):
            return self.transport.handle_request(request)
        raise call.error(phase="headers")  # only when our own window fired

    def __enter__(self) -> Bounded:
        self.transport.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.transport.__exit__(*exc_info)

    def close(self) -> None:
        """Close the wrapped transport."""
        self.transport.close()


def _within(timeout: Any, left: float) -> dict[str, float | None]:
    """httpx's per-phase timeouts, none longer than `left` seconds."""
    given = dict(timeout or {})
    return {
        phase: left if given.get(phase) is None else min(given[phase], left)
        for phase in ("connect", "read", "write", "pool")
    }


class BoundedBody(httpx.SyncByteStream):
    """The wrapped transport's body, each read ending by the call's end; closing ends the call."""

    def __init__(self, inner: Any, call: Call) -> None:
        self._inner = inner
        self._call = call

    def __iter__(self) -> Iterator[bytes]:
        call = self._call
        iterator = self._inner.__iter__()
        while True:
            try:
                chunk = self._next(iterator)
            except StopIteration:
                break
            except BaseException as exc:
                call.budget.finish(exc)
                raise
            yield chunk

    def _next(self, iterator: Iterator[bytes]) -> bytes:
        call = self._call
        with Window(call, call.budget.limit("total")):
            return iterator.__next__()
        raise call.error(phase="body")

    def close(self) -> None:
        try:
            self._inner.close()
        finally:
            self._call.budget.finish()
