"""Requests and responses across the boundary: httpx's to httpcore's and back."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ._call import Call
from ._lib import httpcore, httpx

#: Key of ``response.extensions`` holding the seconds spent waiting for a pooled connection.
POOL_WAIT = "deadlines.pool_wait"


class Content:
    """A request body as httpcore reads it, its iterator closed by the call that sent it.

    httpcore 1.0 reads the body with a bare ``async for``: a call cut mid-upload left
    httpx's async generator to the garbage collector (a ResourceWarning under trio).
    """

    __slots__ = ("_iterator", "_stream")

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._iterator: Any = None

    def __aiter__(self) -> Content:
        self._iterator = self._stream.__aiter__()
        return self

    async def __anext__(self) -> bytes:
        chunk: bytes = await self._iterator.__anext__()
        return chunk

    def __iter__(self) -> Iterator[bytes]:
        iterator: Iterator[bytes] = iter(self._stream)  # a generator closes itself
        return iterator

    async def aclose(self) -> None:
        """Close the body's iterator if reading it began and did not end."""
        iterator, self._iterator = self._iterator, None
        if iterator is not None and hasattr(iterator, "aclose"):
            await iterator.aclose()

    def close(self) -> None:
        """Nothing to close in blocking code (the twin of `aclose`)."""


def core_request(
    request: httpx.Request, call: Call, trace: Callable[..., Any] | None
) -> httpcore.Request:
    """httpcore's request for `request`, with the call's trace hook and fallback timeouts."""
    extensions = dict(request.extensions)
    if trace is not None:
        extensions["trace"] = trace
    left = call.budget.left()  # fallbacks: the backend refines each operation's timeout
    extensions["timeout"] = {"pool": left, "connect": left, "read": left, "write": left}
    return httpcore.Request(
        method=request.method,
        url=httpcore.URL(
            scheme=request.url.raw_scheme,
            host=request.url.raw_host,
            port=request.url.port,
            target=request.url.raw_path,
        ),
        headers=request.headers.raw,
        content=Content(request.stream),
        extensions=extensions,
    )


def response(call: Call, core: httpcore.Response, stream: Any) -> httpx.Response:
    """httpx's response for httpcore's `core`, its body read through `stream`."""
    extensions = dict(core.extensions)
    extensions[POOL_WAIT] = call.budget.pool_wait
    return httpx.Response(
        status_code=core.status, headers=core.headers, stream=stream, extensions=extensions
    )
