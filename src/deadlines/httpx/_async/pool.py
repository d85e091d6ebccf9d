"""`AsyncPool`: the dependency's connections, kept so that no cancellation can leak one.

httpcore's own pool changes its books across awaits. A cancellation that lands while it
cleans up after another (a deadline's timer and the caller leaving in the same instant,
which under load happens by itself) leaves a connection ACTIVE with no request on it,
holding a place in the pool for ever, and the pool wedges (encode/httpcore#1093,
encode/httpx#3782). This pool uses httpcore's connections but keeps the books itself:

* every change to the books is synchronous, made before the first await, so no
  cancellation can tear it;
* a connection that a call leaves in any state but idle (or, for HTTP/2, still
  carrying other calls) is dropped from the books at once and closed, whatever state
  httpcore's own cleanup was interrupted in;
* a close is shielded, and several closes all run even when one is interrupted.

httpcore's pool object serves only to make connections (`create_connection`), so
direct and proxied connections are httpcore's own. The dependency's gate admits at most
`size` calls, and a call holds at most one connection, so a new connection always finds
a place: below `size`, or in place of an idle one.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from .._call import Call
from .._httpcore import abandon_async
from .._lib import httpcore
from .._primitives import AsyncShield


class AsyncPool:
    """At most `size` connections made by `factory`, each carrying the calls it serves.

    With `multiplexed` (HTTP/2 enabled) a connection may carry several calls at once.
    """

    def __init__(
        self,
        factory: httpcore.AsyncConnectionPool,
        size: int,
        *,
        multiplexed: bool,
        max_idle: int | None = None,
    ) -> None:
        self._factory = factory
        self._size = size
        self._multiplexed = multiplexed
        #: Idle connections kept at most (httpx's max_keepalive_connections).
        self._max_idle = size if max_idle is None else max_idle
        # The books change from one thread at a time; never held across an await.
        self._lock = threading.Lock()
        #: Every connection and the number of calls it carries, least recently used first.
        self._uses: dict[Any, int] = {}

    @property
    def connections(self) -> list[Any]:
        """The connections in the books: open, opening, or in use."""
        return list(self._uses)

    async def send(self, call: Call, request: httpcore.Request) -> httpcore.Response:
        """The response head for `request`, on a pooled connection or a new one.

        The connection is ``call.connection`` until the call is done with it
        (`release`); on failure it is released here, and closed unless it can serve on.
        """
        origin = request.url.origin
        while True:
            try:
                # Inside the try: whatever interrupts the checkout (blocking code can be
                # interrupted anywhere), the connection it counted for the call goes back.
                await self.close_each(self._check_out(call, origin))
                head: httpcore.Response = await call.connection.handle_async_request(request)
                return head
            except httpcore.ConnectionNotAvailable:
                # A shared connection that turned out HTTP/1.1 is busy: take another.
                await self.release(call)
            except BaseException:
                try:
                    await abandon_async(call, request)
                finally:
                    await self.release(call)
                raise

    def _check_out(self, call: Call, origin: httpcore.Origin) -> list[Any]:
        """Give `call` a connection to `origin`; return the connections to close."""
        with self._lock:
            closing = []
            chosen = None
            for connection in reversed(list(self._uses)):
                uses = self._uses[connection]
                if connection.is_closed() or (uses == 0 and connection.has_expired()):
                    del self._uses[connection]
                    closing.append(connection)
                elif (
                    chosen is None
                    and (uses == 0 or self._multiplexed)
                    and connection.can_handle_request(origin)
                    and connection.is_available()
                ):
                    chosen = connection
            if chosen is None:
                if len(self._uses) >= self._size:
                    closing.append(self._evict())
                chosen = self._factory.create_connection(origin)
                self._uses[chosen] = 0
            call.connection = chosen  # first: a use counted is always the call's to give back
            self._uses[chosen] += 1
        return closing

    def _evict(self) -> Any:
        """Drop the least recently used idle connection, to make room for a new one."""
        victim = next((c for c, uses in self._uses.items() if uses == 0), None)
        if victim is None:  # the gate admits at most `size` calls: this cannot happen
            raise RuntimeError(f"deadlines.httpx: all {self._size} connections are in use")
        del self._uses[victim]
        return victim

    def _idle(self) -> int:
        return sum(1 for uses in self._uses.values() if uses == 0)

    def check_in(self, call: Call) -> list[Any]:
        """`call` is done with its connection; return what to close (it, if it cannot serve on)."""
        connection, call.connection = call.connection, None
        opened, call.opened = call.opened, None
        if connection is None:
            return []
        with self._lock:
            uses = self._uses.pop(connection, 0) - 1
            if uses > 0:
                self._uses[connection] = uses
                return []
            if uses == 0 and not connection.is_closed() and connection.is_idle():
                if self._idle() < self._max_idle:
                    self._uses[connection] = 0  # back in, as the most recently used
                    return []
                return [connection]  # more idle connections than are kept
        # Torn or closed: drop it, and close what httpcore's own cleanup did not (it may
        # have been interrupted), the socket the call opened included.
        closing = [] if connection.is_closed() else [connection]
        if opened is not None and not opened.closed:
            closing.append(opened)
        return closing

    async def release(self, call: Call) -> None:
        """`check_in`, then close what it returns."""
        await self.close_each(self.check_in(call))

    async def close_each(self, closing: list[Any]) -> None:
        """Close each of `closing` (connections or streams), shielded, then raise any cancellation.

        Each close makes its socket's close before its first await, so even a close
        that is interrupted has closed its socket.
        """
        interrupted: BaseException | None = None
        for item in closing:
            try:
                with AsyncShield(), contextlib.suppress(Exception):
                    await item.aclose()
            except BaseException as exc:  # a cancellation from outside: close the rest first
                interrupted = interrupted or exc
        if interrupted is not None:
            raise interrupted

    async def aclose(self) -> None:
        """Close every connection in the books."""
        with self._lock:
            closing, self._uses = list(self._uses), {}
        await self.close_each(closing)
