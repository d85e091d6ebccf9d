"""aiohttp with every phase of a call bounded, inside the request's deadline.

    import deadlines, deadlines.aiohttp

    pricing = deadlines.Dependency("pricing", connect=0.5, headers=1.0, total=2.0, pool_size=10)

    async with deadlines.aiohttp.session(pricing) as http:
        async with deadlines.scope(2.0):
            async with http.get("http://pricing/prices/42") as response:
                price = await response.json()

`session` returns an `aiohttp.ClientSession`, aiohttp's own class with its whole API
(``ws_connect``, ``cookie_jar``, ...), built on aiohttp's public seams: a connector of
ours (the dependency's pool), a client `Middleware` first in its chain, and a response
class (`Response`). For every request, from the `Dependency` and the deadline
(`CallBudget`):

* below `min_useful` remaining → `BudgetExhausted`, nothing sent;
* waiting in the pool (``limit=pool_size``, this dependency's alone) ≤ min(pool_wait,
  time left), measured where the connector queues the request for a free place, and
  reported as ``response.pool_wait`` and the error's ``pool_wait``;
* DNS + TCP + TLS ≤ min(connect, time left); sending the request and waiting for the
  response head ≤ min(headers, time left);
* each silence in the body ≤ idle (aiohttp's own ``sock_read`` timer, started once
  the head has arrived), and the whole call, body included, ≤ min(total, the
  request's deadline);
* ``x-request-timeout-ms`` carries the time left, computed once a connection is ready.

aiohttp's own timers round any timeout above ``ceil_threshold`` (5 s by default) up to
a whole second of loop time, so a 5.2 s limit could fire at 6 s. The session's are off
unless the caller sets some; one precise timer per call, moved along by the connector
as each phase begins (queued, connecting, connected), bounds everything up to the head,
and a timer at the call's end bounds each read of the body that has to wait. A limit
that fires is raised as the matching `CallTimeout` subclass or `DeadlineExceeded`, and
as aiohttp's own ``ConnectionTimeoutError`` or ``SocketTimeoutError``; other errors
are aiohttp's own. A redirect is a request of its own, with its own call. A WebSocket's
call ends at its handshake.
"""

from __future__ import annotations

from ._middleware import Middleware
from ._response import Response
from ._session import middleware, session

__all__ = ["Middleware", "Response", "middleware", "session"]
