"""httpx with every phase of a call bounded, inside the request's deadline.

    import deadlines, deadlines.httpx

    pricing = deadlines.Dependency("pricing", connect=0.5, headers=1.0, total=2.0, pool_size=10)

    async with deadlines.httpx.AsyncClient(pricing, base_url="http://pricing") as client:
        async with deadlines.scope(2.0):
            response = await client.get("/prices/42")

`AsyncTransport` and `Transport` compose with any httpx client (pass them as
``transport=``); `AsyncClient` and `Client` are httpx clients built on them. For every
request, from the `Dependency` and the current deadline (`deadlines.CallBudget`):

* below `min_useful` remaining → `BudgetExhausted`, nothing sent;
* pool acquire ≤ min(pool_wait, time left); the pool holds `pool_size` connections for
  this dependency alone, and the time spent in it counts toward the call's total;
* DNS + TCP connect + TLS ≤ min(connect, time left), as one window;
* sending the request and waiting for the first byte of the response ≤ min(headers,
  time left), as one window (a server trickling its headers cannot stretch it);
* each gap in the body ≤ idle; the whole call, body included, also when streamed,
  ≤ min(total, the request's deadline);
* ``x-request-timeout-ms`` carries the time left: set once the call is admitted to the
  pool, refreshed after a new connection is up.

Each limit that fires is raised as the matching `CallTimeout` subclass (or
`DeadlineExceeded` when the request's deadline was the binding limit), translated from
httpcore's errors at one boundary. Other transport errors are httpx's own
(`httpx.ConnectError`, `httpx.ReadError`, ...). The time spent waiting for a pooled
connection is in ``response.extensions["deadlines.pool_wait"]`` (seconds) and in the
error's ``pool_wait``. With ``dependency.retry`` set, failed attempts are retried inside
the budget by the rules of `deadlines.retry`.

The limits come from the `Dependency` only: an httpx ``timeout=`` on a client that uses
these transports is ignored. Cancelling the surrounding task (a `deadlines.scope`
firing, or the caller leaving) closes the socket at once in every phase, the TLS
handshake included, and a connection that a cancelled or failed call leaves behind is
closed and its place in the pool freed, however the cancellations interleave.

The blocking `Transport` and `Client` cannot be cancelled: each socket operation gets
as its timeout what is left of its phase and of the call, so the call still ends by its
limits. They resolve names in a thread, waited for at most the connect window. In
threads, pass the deadline along with `deadlines.carry` (or `asyncio.to_thread`, which
copies the context). With ``http2=True`` use one blocking connection from one thread at
a time: httpcore's blocking HTTP/2 shares one socket and one h2 state between threads
without a lock around them, and a thread waiting for another's read can fire late.

With ``http2=True`` the requests to one origin are streams on one connection, and each
keeps its own limits: a stream whose limit fires is reset (RST_STREAM) and the
connection serves the others on.

Layout: the async pool and transport (`_async/`) are written once; the blocking ones
(`_sync/`) are generated from them by ``scripts/unasync.py``. What differs by hand is in
`_primitives` and `_backend`; httpcore's private objects are reached only in
`_httpcore`.
"""

from __future__ import annotations

from ._async.bounded import AsyncBounded
from ._async.client import AsyncClient
from ._async.transport import AsyncTransport
from ._messages import POOL_WAIT
from ._sync.bounded import Bounded
from ._sync.client import Client
from ._sync.transport import Transport

__all__ = [
    "POOL_WAIT",
    "AsyncBounded",
    "AsyncClient",
    "AsyncTransport",
    "Bounded",
    "Client",
    "Transport",
]
