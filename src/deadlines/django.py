"""`DeadlineMiddleware` for Django: one deadline per request, for sync and async views.

    # settings.py
    MIDDLEWARE = [
        "deadlines.django.DeadlineMiddleware",      # first: the whole request under it
        ...
    ]
    DEADLINES = {"default": 2.0, "maximum": 10.0}  # also reserve, header, routes

The budget comes from the caller's headers (``x-request-timeout-ms``, ``grpc-timeout``,
Envoy's) capped at the route's maximum, minus a reserve, by the same rules as the WSGI
and ASGI middlewares (`deadlines.wire`); ``routes`` maps path patterns (``"/reports/*"``,
``"POST /upload"``) to their own `Limits`. The view runs inside `deadlines.scope`, so
outbound calls and SQL statements made through deadlines' integrations get what is left:

* an **async view** (under ASGI) is cancelled at the deadline, and the caller gets a JSON
  **504**; when the **caller leaves**, Django (5.0 and later) cancels the view, which the
  middleware reports as ``caller_left``;
* a **sync view** cannot be interrupted (see `deadlines.wsgi`): it stops at its next
  bounded wait or `deadlines.check()`, whose `DeadlineExceeded` becomes the same 504;
* a request that arrives with no budget left is answered 504 without running the view.

Each request reports `RequestStarted` and `RequestFinished` (metrics, traces, logs).
A streamed response's body is iterated under the deadline and reported when it ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from datetime import timedelta
from typing import Any

from . import _clock, _validate, wire
from ._errors import DeadlineExceeded
from ._events import RequestOutcome
from ._extras import missing
from ._inbound import UNMATCHED, Limits, RouteTable, header_name
from ._request import Request, answer_outcome, budget, deadline_outcome
from ._scope import Frame, frame_var

try:
    from asgiref.sync import iscoroutinefunction, markcoroutinefunction
    from django.conf import settings
    from django.http import HttpRequest, HttpResponse, HttpResponseBase
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise missing("deadlines.django", "Django", "django") from exc

__all__ = ["DeadlineMiddleware", "Limits"]

_OPTIONS = frozenset({"default", "maximum", "reserve", "header", "routes"})
# The attribute a request carries while its deadline runs.
_ATTRIBUTE = "_deadlines"


class _Request(Request):
    """One request's deadline (`Request`), the headers and limits its 504 names."""

    def __init__(
        self, route: str, budget: float, started: float, asked: dict[str, str], limits_: Limits
    ) -> None:
        super().__init__(route, budget, started)
        self.asked, self.limits = asked, limits_
        self.timed_out: DeadlineExceeded | None = None


class DeadlineMiddleware:
    """Give every Django request one deadline, its 504 and its events (module docs).

    Configured by the ``DEADLINES`` setting: ``default`` and ``maximum`` (seconds or
    `timedelta`, required), ``reserve`` (0.05 s), ``header`` (the milliseconds header to
    read in place of ``x-request-timeout-ms``) and ``routes`` (limits per path pattern).
    Put it first in ``MIDDLEWARE``, so the middlewares after it run under the deadline.
    """

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        options = dict(getattr(settings, "DEADLINES", None) or {})
        unknown = set(options) - _OPTIONS
        if unknown or not {"default", "maximum"} <= set(options):
            raise ValueError(
                "settings.DEADLINES needs 'default' and 'maximum' (seconds), and may set"
                f" 'reserve', 'header' and 'routes'; got {sorted(options)}"
            )
        fallback = Limits(default=options["default"], maximum=options["maximum"])
        routes: Mapping[str, Limits] | None = options.get("routes")
        self._table = RouteTable(routes, fallback)
        reserve: float | timedelta = options.get("reserve", 0.05)
        self._reserve = _validate.seconds(reserve, "reserve")
        self._header = header_name(options.get("header", wire.HEADER))
        self._keys = [
            (_meta_key(self._header), wire.HEADER),
            (_meta_key(wire.GRPC_HEADER), wire.GRPC_HEADER),
            (_meta_key(wire.ENVOY_HEADER), wire.ENVOY_HEADER),
        ]
        self._async = iscoroutinefunction(get_response)
        if self._async:
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest) -> Any:
        """Run the rest of the stack for one request under its deadline."""
        if self._async:
            return self._acall(request)
        info = self._arrive(request)
        if info.budget <= 0.0:
            info.finish("budget_exhausted")
            return self._timeout(info)
        try:
            with info as frame:
                response = self.get_response(request)
        except DeadlineExceeded as exc:  # raised by a middleware after this one
            info.finish(deadline_outcome(exc))
            return self._timeout(info)
        except BaseException:
            info.finish("error")
            raise
        return self._answered(info, response, frame)

    async def _acall(self, request: HttpRequest) -> HttpResponseBase:
        info = self._arrive(request)
        if info.budget <= 0.0:
            info.finish("budget_exhausted")
            return self._timeout(info)
        try:
            async with info as frame:
                get_response: Callable[[HttpRequest], Awaitable[HttpResponseBase]]
                get_response = self.get_response
                response = await get_response(request)
        except DeadlineExceeded as exc:  # the view was cancelled at the deadline
            info.finish(deadline_outcome(exc))
            return self._timeout(info)
        except asyncio.CancelledError:  # Django cancels the view when the caller leaves
            info.finish("caller_left")
            raise
        except BaseException:
            info.finish("error")
            raise
        return self._answered(info, response, frame)

    def process_exception(
        self, request: HttpRequest, exception: Exception
    ) -> HttpResponseBase | None:
        """A view's `DeadlineExceeded` is answered 504 (Django would make it a 500)."""
        info: _Request | None = getattr(request, _ATTRIBUTE, None)
        if info is None or not isinstance(exception, DeadlineExceeded):
            return None
        info.timed_out = exception
        return self._timeout(info)

    def _arrive(self, request: HttpRequest) -> _Request:
        started = _clock.now()
        meta = request.META
        asked = {name: meta[key] for key, name in self._keys if key in meta}
        pattern, limits_ = self._table.match(request.method or "GET", request.path_info)
        budget_ = budget(wire.header_budget(asked), limits_, self._reserve)
        info = _Request(pattern or UNMATCHED, budget_, started, asked, limits_)
        setattr(request, _ATTRIBUTE, info)
        return info

    def _timeout(self, info: _Request) -> HttpResponse:
        body = info.timeout_body(info.asked.items(), info.limits, self._header)
        response = HttpResponse(body, status=504, content_type="application/json")
        response["Cache-Control"] = "no-store"
        return response

    def _answered(
        self, info: _Request, response: HttpResponseBase, frame: Frame | None
    ) -> HttpResponseBase:
        """Report the outcome now, or for a streamed body when it ends."""
        if info.timed_out is not None:  # process_exception answered 504
            info.finish(deadline_outcome(info.timed_out))
            return response
        outcome = answer_outcome(response.status_code)
        if not getattr(response, "streaming", False) or frame is None:
            info.finish(outcome)
            return response
        content = response.streaming_content
        if getattr(response, "is_async", False):
            response.streaming_content = _stream_async(content, frame, info, outcome)
        else:
            response.streaming_content = _stream(content, frame, info, outcome)
        return response


def _meta_key(header: str) -> str:
    return "HTTP_" + header.upper().replace("-", "_")


def _stream(
    content: Iterator[bytes], frame: Frame, info: _Request, outcome: RequestOutcome
) -> Iterator[bytes]:
    """A sync streamed body, each chunk made under the request's deadline."""
    ended = False
    try:
        while True:
            token = frame_var.set(frame)
            try:
                chunk = next(content)
            except StopIteration:
                ended = True
                return
            finally:
                frame_var.reset(token)
            yield chunk
    except DeadlineExceeded as exc:  # the headers are out: the server drops the connection
        info.finish(deadline_outcome(exc))
        raise
    finally:
        # A body the server stopped reading before its end: the caller went away.
        info.finish(outcome if ended else "caller_left")


async def _stream_async(
    content: AsyncIterator[bytes], frame: Frame, info: _Request, outcome: RequestOutcome
) -> AsyncIterator[bytes]:
    """An async streamed body, each chunk made under the request's deadline."""
    ended = False
    try:
        while True:
            token = frame_var.set(frame)
            try:
                chunk = await anext(content)
            except StopAsyncIteration:
                ended = True
                return
            finally:
                frame_var.reset(token)
            yield chunk
    except DeadlineExceeded as exc:
        info.finish(deadline_outcome(exc))
        raise
    finally:
        info.finish(outcome if ended else "caller_left")
