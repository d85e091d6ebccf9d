"""`DeadlineMiddleware` for WSGI apps (Flask, Django, ...): one deadline per request, stdlib only.

    import deadlines
    from deadlines.wsgi import DeadlineMiddleware

    app.wsgi_app = DeadlineMiddleware(app.wsgi_app, default=2.0, maximum=10.0)   # Flask
    application = DeadlineMiddleware(get_wsgi_application(), default=2.0, maximum=10.0)

The budget comes from the headers (``x-request-timeout-ms``, ``grpc-timeout``,
Envoy's) capped at the route's maximum, minus a reserve, exactly as for ASGI. The app
(and the iteration of its response body) runs inside the sync form of
`deadlines.scope`, so outbound calls and database statements made through deadlines'
integrations are bounded by what is left, and `deadlines.check()` raises
`DeadlineExceeded` once it has passed. A `DeadlineExceeded` that escapes the app before
the response body started becomes a JSON 504; an already expired request is answered
504 without calling the app.

Frameworks that turn every exception into a 500 themselves (Flask, Django) need one line
so a deadline becomes the same 504:

    app.register_error_handler(deadlines.DeadlineExceeded, deadlines.wsgi.timeout_response)

What WSGI cannot do:

* **No cancellation.** A Python thread cannot be interrupted: a handler stuck in pure
  computation or in a call that ignores the deadline runs to its end. Work stops at the
  next bounded wait (an outbound call, a query) or at `deadlines.check()`.
* **No caller-left signal.** WSGI gives the app no notice that the client went away;
  the server finds out only when it writes the response. Propagating the deadline is
  the only way a WSGI hop stops early, so keep budgets tight. A body the server stops
  reading before its end (the client went away) is reported `caller_left`.
"""

from __future__ import annotations

import contextvars
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import timedelta
from types import TracebackType
from typing import Any

from . import _clock, _validate, wire
from ._errors import DeadlineExceeded
from ._events import RequestOutcome
from ._inbound import UNMATCHED, Limits, RouteTable, header_name, limits, timeout_body
from ._request import Request, budget, deadline_outcome
from ._scope import Frame, frame_var

__all__ = ["DeadlineMiddleware", "Limits", "limits", "timeout_response"]

Environ = dict[str, Any]
ExcInfo = tuple[type[BaseException], BaseException, TracebackType | None]
StartResponse = Callable[..., Callable[[bytes], object]]
WSGIApp = Callable[[Environ, StartResponse], Iterable[bytes]]


class _Request(Request):
    """The request's deadline (`Request`) and what `timeout_response` needs; called as
    the app's `start_response`, it notes the status it passes on."""

    def __init__(
        self,
        route: str,
        budget: float,
        started: float,
        asked: dict[str, str],
        limits_: Limits,
        header: str,
        start_response: StartResponse,
    ) -> None:
        super().__init__(route, budget, started)
        self.asked, self.limits, self.header = asked, limits_, header
        self.start_response = start_response
        self.status = ""
        self.timed_out: DeadlineExceeded | None = None

    def __call__(
        self, status: str, headers: list[tuple[str, str]], exc_info: ExcInfo | None = None
    ) -> Callable[[bytes], object]:
        self.status = status
        return self.start_response(status, headers, exc_info)

    def outcome(self) -> RequestOutcome:
        """How a request the app answered ended: a 5xx it answered is an error (Flask
        and Django turn exceptions into a 500 themselves), our 504 a deadline."""
        if self.timed_out is not None:  # the app's error handler answered 504 for us
            return deadline_outcome(self.timed_out)
        return "error" if self.status[:1] == "5" else "ok"

    def body(self) -> bytes:
        return self.timeout_body(self.asked.items(), self.limits, self.header)


_request: contextvars.ContextVar[_Request | None] = contextvars.ContextVar(
    "deadlines.wsgi.request", default=None
)

_HEADERS = [("Content-Type", "application/json"), ("Cache-Control", "no-store")]


def timeout_response(exc: DeadlineExceeded) -> tuple[bytes, int, list[tuple[str, str]]]:
    """A framework error handler: the middleware's JSON 504 for a `DeadlineExceeded`.

    Returns ``(body, 504, headers)``, which Flask accepts from an error handler; other
    frameworks build their response from it. Outside `DeadlineMiddleware` the body
    names the error's own budget.
    """
    info = _request.get()
    if info is None:
        budget = exc.limit or 0.0
        body = timeout_body(limit="deadline", budget=budget, elapsed=exc.elapsed or 0.0)
    else:
        info.timed_out = exc
        body = info.body()
    return body, 504, [*_HEADERS, ("Content-Length", str(len(body)))]


class DeadlineMiddleware:
    """Give every WSGI request one deadline (see the module docs for what WSGI cannot do).

    Args:
        app: The WSGI app to wrap.
        default: Budget in seconds when the request carries no valid deadline header.
        maximum: The most a caller may ask for; larger header values are capped.
        reserve: Subtracted from the budget for the time on the wire and for the reply.
        header: The milliseconds header to read in place of ``x-request-timeout-ms``.
        routes: Limits per path pattern (``"/reports/*"``, ``"POST /upload"``).
    """

    def __init__(
        self,
        app: WSGIApp,
        *,
        default: float | timedelta,
        maximum: float | timedelta,
        reserve: float | timedelta = 0.05,
        header: str = wire.HEADER,
        routes: Mapping[str, Limits] | None = None,
    ) -> None:
        if not callable(app):
            raise TypeError(f"app must be a WSGI callable, not {app!r}")
        self.app = app
        self._table = RouteTable(routes, Limits(default=default, maximum=maximum))
        self._reserve = _validate.seconds(reserve, "reserve")
        self._header = header_name(header)
        # Where each understood header sits in the environ, and the name it stands for.
        self._keys = [
            (_environ_key(self._header), wire.HEADER),
            (_environ_key(wire.GRPC_HEADER), wire.GRPC_HEADER),
            (_environ_key(wire.ENVOY_HEADER), wire.ENVOY_HEADER),
        ]

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        """Run the app for one request under its deadline."""
        started = _clock.now()
        asked = {name: environ[key] for key, name in self._keys if key in environ}
        pattern, limits_ = self._table.match(
            environ.get("REQUEST_METHOD", "GET"), environ.get("PATH_INFO", "/")
        )
        budget_ = budget(wire.header_budget(asked), limits_, self._reserve)
        info = _Request(
            pattern or UNMATCHED, budget_, started, asked, limits_, self._header, start_response
        )
        if budget_ <= 0.0:
            info.finish("budget_exhausted")
            return _timeout(start_response, info, None)
        token = _request.set(info)
        frame = info.enter()
        try:
            result = self.app(environ, info)
        except DeadlineExceeded as exc:
            info.finish(deadline_outcome(exc))
            return _timeout(start_response, info, sys.exc_info())  # type: ignore[arg-type]
        except BaseException:
            info.finish("error")
            raise
        finally:
            info.leave(None, None)
            _request.reset(token)
        wrapper = environ.get("wsgi.file_wrapper")
        if isinstance(wrapper, type) and isinstance(result, wrapper):
            # The server sends the file itself (sendfile), past the deadline's reach:
            # wrapping it would hide it from the server's fast path.
            info.finish(info.outcome())
            return result
        body = _SizedBody if hasattr(result, "__len__") else _Body
        return body(result, frame, info, start_response)


def _timeout(
    start_response: StartResponse, info: _Request, exc_info: ExcInfo | None
) -> list[bytes]:
    body = info.body()
    headers = [*_HEADERS, ("Content-Length", str(len(body)))]
    if exc_info is None:
        start_response("504 Gateway Timeout", headers)
    else:  # replaces the app's own status if the headers have not gone out yet
        start_response("504 Gateway Timeout", headers, exc_info)
    return [body]


def _environ_key(header: str) -> str:
    return "HTTP_" + header.upper().replace("-", "_")


class _Body:
    """The app's response iterable, each step run under the request's deadline.

    Each step sets the request's own frame again, not a new scope on its deadline: an
    error raised in the body then reports the request's budget and the time since its
    arrival, not what was left when that chunk began.
    """

    def __init__(
        self,
        result: Iterable[bytes],
        frame: Frame,
        info: _Request,
        start_response: StartResponse,
    ) -> None:
        self._result = result
        self._iterator: Iterator[bytes] | None = None
        self._frame = frame
        self._info = info
        self._start_response = start_response
        self._sent = False  # a non-empty chunk went out: the headers are on the wire
        self._ended = False

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        if self._ended:
            raise StopIteration
        token = frame_var.set(self._frame)
        try:
            if self._iterator is None:
                self._iterator = iter(self._result)
            chunk = next(self._iterator)
        except StopIteration:
            self._ended = True
            self._finish()
            raise
        except DeadlineExceeded as exc:
            self._info.finish(deadline_outcome(exc))
            if self._sent:
                raise  # the body is half out: the server drops the connection
            self._ended = True
            (body,) = _timeout(self._start_response, self._info, sys.exc_info())  # type: ignore[arg-type]
            return body
        except BaseException:
            self._info.finish("error")
            raise
        finally:
            frame_var.reset(token)
        if chunk:
            self._sent = True
        return chunk

    def close(self) -> None:
        """Close the app's iterable (WSGI requires it) and report the end: a body the
        server stopped reading before its end was abandoned, the caller having left."""
        try:
            close = getattr(self._result, "close", None)
            if close is not None:
                token = frame_var.set(self._frame)
                try:
                    close()
                finally:
                    frame_var.reset(token)
        finally:
            if self._ended:
                self._finish()
            else:  # servers read a body to its end unless the client went away
                self._info.finish("caller_left")

    def _finish(self) -> None:
        self._info.finish(self._info.outcome())


class _SizedBody(_Body):
    """A `_Body` whose app gave a sized iterable (a list): servers read its length to
    send a Content-Length and keep the connection open, as without the middleware."""

    def __len__(self) -> int:
        return len(self._result)  # type: ignore[arg-type]
