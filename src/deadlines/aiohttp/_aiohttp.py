"""The one place that uses aiohttp's private API: the connector's two steps, the body's timer.

* `Connector` overrides two private steps of `aiohttp.BaseConnector.connect`:
  ``_wait_for_available_connection`` (queued for a free place) and
  ``_create_connection`` (DNS, TCP, TLS), exactly where aiohttp sends its own
  ``connection_queued_*`` and ``connection_create_*`` trace events. aiohttp's public
  seam for this, `TraceConfig`, makes every request build and await all of its ~10
  trace events once any trace config is set: that cost more than half of aiohttp's own
  time per call.
* `start_idle_timer` starts aiohttp's own per-read timer (``sock_read``) for the rest of
  a body, through the connection's protocol.
* `twin_request` copies a request for a hedge's backup, which aiohttp has no public way
  to do; a request's upload tracker (aiohttp 3.14) stays with the first attempt.

tests/outbound/test_aiohttp_seams.py pins every name used here (`SEAMS`), so an aiohttp
that changes them fails the tests loudly.
"""

from __future__ import annotations

import copy
from typing import Any

from .. import _clock
from ._call import current
from ._lib import CIMultiDict, aiohttp

#: aiohttp's private names used here, by the class that has them.
SEAMS = {
    "BaseConnector": ("_wait_for_available_connection", "_create_connection"),
    "ResponseHandler": ("read_timeout", "start_timeout"),
}


class Connector(aiohttp.TCPConnector):
    """The dependency's pool, telling the call in this task when each phase begins."""

    async def connect(
        self, req: aiohttp.ClientRequest, traces: list[Any], timeout: aiohttp.ClientTimeout
    ) -> aiohttp.connector.Connection:
        """A pooled or new connection; then the request goes out with the header set."""
        if current.get() is None:  # no call would bound it: refuse rather than hang
            raise RuntimeError(
                "a request of a deadlines.aiohttp session ran without its middleware"
                " (a request's middlewares= replaces the session's): put"
                " deadlines.aiohttp.middleware(dependency) first in it"
            )
        connection = await super().connect(req, traces, timeout)
        call = current.get()
        assert call is not None
        call.connection_ready(req)
        return connection

    async def _wait_for_available_connection(self, key: Any, traces: list[Any]) -> None:
        call = current.get()
        assert call is not None  # `connect` refused a request without one
        call.queued_at = _clock.now()
        if call.guard is None:
            call.arm("pool")  # the guard was not started until something could wait
        await super()._wait_for_available_connection(key, traces)
        call.pool_wait = _clock.now() - call.queued_at
        return

    async def _create_connection(
        self, req: aiohttp.ClientRequest, traces: list[Any], timeout: aiohttp.ClientTimeout
    ) -> Any:
        call = current.get()
        assert call is not None  # `connect` refused a request without one
        if call.pool_wait is None:
            call.pool_wait = 0.0
        call.arm("connect")
        return await super()._create_connection(req, traces, timeout)


def start_idle_timer(response: aiohttp.ClientResponse, idle: float) -> None:
    """Start aiohttp's own per-read timer (``sock_read``) for the rest of the body.

    Called only while some of the body is still to come. It measures the silence since
    the last byte received, exactly, and aiohttp stops it at the end of the body. It is
    off while waiting for the head, which has its own window here, so a short idle cap
    cannot pose as a headers timeout.
    """
    connection = response.connection
    if connection is None or connection.protocol is None:
        return
    connection.protocol.read_timeout = idle
    connection.protocol.start_timeout()


def twin_request(request: aiohttp.ClientRequest) -> aiohttp.ClientRequest:
    """A second request like `request`, to send alongside it (a hedge's backup).

    A shallow copy, before either is sent: its own headers (each attempt sets its
    deadline header), the same body (bytes, or none: sent again as they are). An upload
    tracker, where aiohttp has one, stays the first attempt's.
    """
    twin = copy.copy(request)
    twin.headers = CIMultiDict(request.headers)
    if getattr(request, "_upload_tracker", None) is not None:
        twin._upload_tracker = None
    return twin
