"""Network backends: each socket operation bounded by the current call's limits.

httpcore asks its network backend for every connect, read and write; these backends
ask the current `Call` (a context variable) for the timeout of each, so that every wait
ends by the limit of its phase and by the call's end. Written twice, async and
blocking, because they differ: the blocking one resolves names in a thread (`Resolver`)
so that DNS too ends with the connect window.

On an HTTP/2 connection ("shared": its requests are streams on one socket) a read is
done by whichever request holds httpcore's read lock, for all of them, and httpcore
keeps a read or write error and raises it on every stream. So no one request's limit
may become a socket timeout there: async reads are bounded by the reading request's
cancel scope instead (cancelling a read loses nothing), blocking reads raise
`Expired`, and writes are never cut midway (half a frame would break the connection
for all): they are bounded by the writing call's end, but given at least
`SHARED_WRITE_MIN` seconds, after which the connection is given up.
"""

from __future__ import annotations

import ssl
import typing
from typing import Any

from ._boundary import Expired
from ._call import Call, current
from ._lib import anyio, httpcore
from ._resolver import is_ip, resolver

SHARED_WRITE_MIN = 1.0
_MIN_SYNC_TIMEOUT = 1e-6  # socket.settimeout(0) would mean non-blocking, not "expired"


def _shared_write_timeout(call: Call | None) -> float:
    return max(SHARED_WRITE_MIN, 0.0 if call is None else call.budget.left())


def _negotiated_h2(stream: httpcore.AsyncNetworkStream | httpcore.NetworkStream) -> bool:
    ssl_object = stream.get_extra_info("ssl_object")
    return ssl_object is not None and ssl_object.selected_alpn_protocol() == "h2"


def _opened(call: Call | None, stream: Any) -> None:
    if call is not None:
        call.connected(stream)


class AsyncStream(httpcore.AsyncNetworkStream):
    """A socket stream whose reads and writes take their timeouts from the current call.

    ``closed`` says whether it was closed through it (the pool then need not again).
    """

    def __init__(self, inner: httpcore.AsyncNetworkStream, *, shared: bool = False) -> None:
        self._inner = inner
        self.shared = shared
        self.closed = False

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        call = current.get()
        if self.shared:
            return await self._inner.read(max_bytes, None if call is not None else timeout)
        return await self._inner.read(max_bytes, timeout if call is None else call.io_timeout())

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        call = current.get()
        if self.shared:
            if call is not None:
                call.stream = self
            with anyio.CancelScope(shield=True):
                await self._inner.write(buffer, _shared_write_timeout(call))
            return
        if call is not None:
            timeout = call.io_timeout(writing=True)
        await self._inner.write(buffer, timeout)

    async def aclose(self) -> None:
        self.closed = True
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        call = current.get()
        if call is not None:
            timeout = call.connect_left()
        try:
            stream = await self._inner.start_tls(ssl_context, server_hostname, timeout)
        except BaseException:
            # httpcore closes the TCP stream when the handshake fails but not when it is
            # cancelled: the socket then stayed open until garbage collection.
            with anyio.CancelScope(shield=True):
                await self._inner.aclose()
            raise
        tls = AsyncStream(stream, shared=_negotiated_h2(stream))
        _opened(call, tls)
        return tls

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class AsyncBackend(httpcore.AsyncNetworkBackend):
    """httpcore's anyio backend (asyncio and trio alike), each connect in the connect window."""

    def __init__(self, *, prior_knowledge: bool = False) -> None:
        self._inner = httpcore.AnyIOBackend()
        #: HTTP/2 without TLS (``http1=False``): every TCP connection is shared.
        self._shared = prior_knowledge

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        call = current.get()
        if call is not None:
            timeout = call.connect_timeout()
        inner = await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        stream = AsyncStream(inner, shared=self._shared)
        _opened(call, stream)
        return stream

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        call = current.get()
        if call is not None:
            timeout = call.connect_timeout()
        inner = await self._inner.connect_unix_socket(path, timeout, socket_options)
        stream = AsyncStream(inner, shared=self._shared)
        _opened(call, stream)
        return stream

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def _sync_timeout(timeout: float) -> float:
    return max(_MIN_SYNC_TIMEOUT, timeout)


class Stream(httpcore.NetworkStream):
    """The blocking twin of `AsyncStream`: each operation's socket timeout from the call."""

    def __init__(self, inner: httpcore.NetworkStream, *, shared: bool = False) -> None:
        self._inner = inner
        self.shared = shared
        self.closed = False

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        call = current.get()
        if call is None:
            return self._inner.read(max_bytes, timeout)
        timeout = _sync_timeout(call.io_timeout())
        if not self.shared:
            return self._inner.read(max_bytes, timeout)
        try:
            return self._inner.read(max_bytes, timeout)
        except httpcore.ReadTimeout:
            raise Expired from None  # this request's limit, not the connection's

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        call = current.get()
        if self.shared:
            if call is not None:
                call.stream = self
            self._inner.write(buffer, _shared_write_timeout(call))
            return
        if call is not None:
            timeout = _sync_timeout(call.io_timeout(writing=True))
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self.closed = True
        self._inner.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        call = current.get()
        if call is not None:
            timeout = _sync_timeout(call.connect_left())
        try:
            stream = self._inner.start_tls(ssl_context, server_hostname, timeout)
        except BaseException:
            self._inner.close()
            raise
        tls = Stream(stream, shared=_negotiated_h2(stream))
        _opened(call, tls)
        return tls

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class Backend(httpcore.NetworkBackend):
    """httpcore's blocking backend, each connect (DNS included) in the connect window."""

    def __init__(self, *, prior_knowledge: bool = False) -> None:
        self._inner = httpcore.SyncBackend()
        self._shared = prior_knowledge

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        call = current.get()
        if call is None or is_ip(host):
            if call is not None:
                timeout = _sync_timeout(call.connect_timeout())
            inner = self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        else:
            inner = self._connect_by_name(call, host, port, local_address, socket_options)
        stream = Stream(inner, shared=self._shared)
        _opened(call, stream)
        return stream

    def _connect_by_name(
        self,
        call: Call,
        host: str,
        port: int,
        local_address: str | None,
        socket_options: typing.Iterable[Any] | None,
    ) -> httpcore.NetworkStream:
        """Resolve in a thread, then try each address, all inside the connect window."""
        addresses = resolver.resolve(host, port, call.connect_timeout())
        options = None if socket_options is None else list(socket_options)
        error: Exception | None = None
        for address in addresses:
            left = call.connect_left()
            if left <= 0.0:
                raise httpcore.ConnectTimeout(f"no time left to connect to {host!r}")
            try:
                return self._inner.connect_tcp(
                    address, port, _sync_timeout(left), local_address, options
                )
            except httpcore.ConnectError as exc:  # refused, unreachable: try the next one
                error = exc
        raise error or httpcore.ConnectError(f"{host!r} resolved to no address")

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        call = current.get()
        if call is not None:
            timeout = _sync_timeout(call.connect_timeout())
        inner = self._inner.connect_unix_socket(path, timeout, socket_options)
        stream = Stream(inner, shared=self._shared)
        _opened(call, stream)
        return stream

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)
