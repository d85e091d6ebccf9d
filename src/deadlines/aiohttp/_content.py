"""`Content`: a response's body, each read bounded by the idle gap and the call's end."""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

from .. import _alarms
from ._call import Call, translate
from ._lib import aiohttp

T = TypeVar("T")


class Content:
    """The response body stream, each read bounded by the idle gap and the call's end.

    Stands in for ``response.content`` (an `aiohttp.StreamReader`); everything but
    reading is passed through. It refers to its response weakly: the response holds it,
    and a strong reference back would make every call a cycle for the garbage collector.
    """

    __slots__ = ("_call", "_inner", "_response")

    def __init__(
        self, inner: aiohttp.StreamReader, call: Call, response: aiohttp.ClientResponse
    ) -> None:
        self._inner = inner
        self._call = call
        self._response = weakref.ref(response)

    def exception(self) -> BaseException | None:
        """The stream's error, if any (asked by aiohttp on every release)."""
        return self._inner.exception()

    def set_exception(self, *args: Any) -> None:
        """Fail pending and later reads (aiohttp's release does, on every call)."""
        self._inner.set_exception(*args)

    async def _bounded(self, read: Coroutine[Any, Any, T]) -> T:
        call = self._call
        call.in_force, call.phase = "total", "body"
        try:
            if self._inner.is_eof():  # the rest of the body is buffered: no wait, no timer
                return await read
            timer = _alarms.Timeout(call.at(call.limit("total")))
            try:
                async with timer:
                    return await read
            except TimeoutError as exc:
                error = translate(call, timer, exc)
                if error is exc:
                    raise
                raise error from exc
        except BaseException as exc:
            call.finish(exc)  # first: closing the response reports the call too, as ok
            response = self._response()
            if response is not None:
                response.close()  # a broken or abandoned body: close the socket now
            raise

    # The reads return `_bounded`'s coroutine rather than being coroutines themselves:
    # one coroutine less per read.

    def read(self, n: int = -1) -> Coroutine[Any, Any, bytes]:
        """Up to `n` bytes (all with -1)."""
        return self._bounded(self._inner.read(n))

    def readany(self) -> Coroutine[Any, Any, bytes]:
        """The next bytes that arrive."""
        return self._bounded(self._inner.readany())

    def readchunk(self) -> Coroutine[Any, Any, tuple[bytes, bool]]:
        """The next HTTP chunk and whether it ended."""
        return self._bounded(self._inner.readchunk())

    def readexactly(self, n: int) -> Coroutine[Any, Any, bytes]:
        """Exactly `n` bytes."""
        return self._bounded(self._inner.readexactly(n))

    def readline(self) -> Coroutine[Any, Any, bytes]:
        """The next line."""
        return self._bounded(self._inner.readline())

    def readuntil(self, separator: bytes = b"\n") -> Coroutine[Any, Any, bytes]:
        """Bytes up to and including `separator`."""
        return self._bounded(self._inner.readuntil(separator))

    async def iter_chunked(self, n: int) -> AsyncIterator[bytes]:
        """Chunks of at most `n` bytes."""
        while chunk := await self.read(n):
            yield chunk

    async def iter_any(self) -> AsyncIterator[bytes]:
        """Bytes as they arrive."""
        while chunk := await self.readany():
            yield chunk

    async def iter_chunks(self) -> AsyncIterator[tuple[bytes, bool]]:
        """HTTP chunks with their end-of-chunk flag."""
        while (chunk := await self.readchunk()) != (b"", False):
            yield chunk

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while line := await self.readline():
            yield line

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
