"""`DeadlineMiddleware`: the request's deadline for any ASGI app (Starlette, FastAPI, ...).

A pure ASGI middleware (never Starlette's `BaseHTTPMiddleware`, which stops context
variables from propagating and breaks disconnect detection). For each HTTP request it

1. computes the local deadline from the headers it understands (``x-request-timeout-ms``,
   ``grpc-timeout``, Envoy's) capped at the route's maximum, minus a reserve;
2. runs the app inside `deadlines.scope`, so `deadlines.current()` works in handlers and
   everything under the request is cancelled at the instant;
3. answers **504** with a short JSON body when the deadline passes before the response
   starts (and at once, without running the app, when it arrived already expired); when
   the response had started, it raises so that the server drops the connection;
4. cancels the handler the moment the caller leaves (``http.disconnect``).

How the caller's leaving is seen: an ASGI server reports a closed connection only
through ``receive()``, and only to someone waiting on it. Once a request has run for
`watch_after` seconds the middleware starts one watcher task that reads ahead of the app
(at most `read_ahead` bytes of body, so flow control still works) and hands the app
exactly the messages the server sent, in order. When the watcher receives
``http.disconnect`` before the response is complete, it cancels the request's task with
a `CallerLeft` reason. Requests that finish sooner never pay for a watcher.

The deadline's timer is armed on the same round: the deadline is set on arrival (the
handler sees it, outbound calls and statements are bounded by it), but the timer that
cancels the handler at the instant is armed when the request is still running after
`watch_after`, or at once when the deadline is nearer than that. Most requests end
sooner and never touch a timer.

Under trio (hypercorn's trio worker) the same happens with trio's means: the watcher
cancels the cancel scope the app runs in (the deadline's own), and it is a trio system
task, started after `watch_after` by one sweeper task per trio run, so that here too a
request that ends sooner starts no task.

The package: `_middleware` (the middleware: headers, route, budget, the request's
straight line), `_exchange` (one request: its receive and send, the watcher, the 504),
`_trio` (the same under trio), `_routes` (a Starlette or FastAPI app's route and its
marked limits; the one FastAPI private API it reads is in `deadlines._private.fastapi`).
"""

from __future__ import annotations

from .._inbound import Limits, limits
from ._middleware import DeadlineMiddleware

__all__ = ["DeadlineMiddleware", "Limits", "limits"]
