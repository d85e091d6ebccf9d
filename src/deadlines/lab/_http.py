"""A minimal HTTP/1.1 server on asyncio streams, for the lab's downstreams and backends.

Small on purpose: the lab must see exactly what a downstream sees. It counts open
connections (now, and the most at once), keeps connections alive, and notices at once
when a client closes its connection while a request is in progress: the handler is then
cancelled (a client that gave up no longer holds a socket here), and the count drops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

_MAX_HEAD = 64 * 1024
_REASONS = {200: "OK", 404: "Not Found", 500: "Internal Server Error", 504: "Gateway Timeout"}


@dataclass(slots=True)
class Request:
    """One parsed request: method, path (without the query), query string, headers."""

    method: str
    path: str
    query: str
    headers: dict[str, str]


@dataclass(slots=True)
class Response:
    """What a handler returns."""

    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain"

    @classmethod
    def json(cls, data: Any, status: int = 200) -> Response:
        """A JSON response."""
        return cls(status, json.dumps(data).encode(), "application/json")


Handler = Callable[[Request], Awaitable[Response]]


@dataclass
class Counters:
    """Connections as the server sees them. `control` connections are not counted."""

    open: int = 0
    max_open: int = 0
    accepted: int = 0
    requests: int = 0
    in_progress: int = 0
    _control: set[int] = field(default_factory=set)


class HttpServer:
    """Serve `handler` on 127.0.0.1; paths starting with ``/_`` are control requests.

    Control connections (the lab asking for stats) are kept out of the counters, so
    ``max_open`` is what the clients under test opened.
    """

    def __init__(self, handler: Handler) -> None:
        """Wrap `handler`; call `start` to listen."""
        self._handler = handler
        self.counters = Counters()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, port: int = 0, host: str = "127.0.0.1") -> int:
        """Listen and return the port."""
        self._server = await asyncio.start_server(self._connection, host, port, backlog=1024)
        sock = self._server.sockets[0]
        return int(sock.getsockname()[1])

    async def close(self) -> None:
        """Stop listening and close every connection."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        c = self.counters
        cid = id(writer)
        c.accepted += 1
        c.open += 1
        try:
            await self._serve(reader, writer, cid)
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            if cid in c._control:
                c._control.discard(cid)
            else:
                c.open -= 1
            writer.close()
            self._tasks.discard(task)

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, cid: int
    ) -> None:
        c = self.counters
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            except asyncio.LimitOverrunError:
                return
            if len(head) > _MAX_HEAD:
                return
            request = _parse(head)
            length = int(request.headers.get("content-length", "0") or 0)
            if length:
                await reader.readexactly(length)
            if request.path.startswith("/_"):
                if cid not in c._control:
                    c._control.add(cid)
                    c.open -= 1
            else:
                c.requests += 1
                if c.open > c.max_open:
                    c.max_open = c.open
            response = await self._answer(request, reader)
            if response is None:  # the client closed the connection first
                return
            _write(writer, response)
            await writer.drain()
            if request.headers.get("connection", "").lower() == "close":
                return

    async def _answer(self, request: Request, reader: asyncio.StreamReader) -> Response | None:
        # Run the handler while watching the socket: EOF means the client gave up.
        c = self.counters
        c.in_progress += 1
        work = asyncio.ensure_future(self._handler(request))
        eof = asyncio.ensure_future(reader.read(1))
        try:
            await asyncio.wait({work, eof}, return_when=asyncio.FIRST_COMPLETED)
            if eof.done() and not eof.cancelled() and eof.result():
                await asyncio.wait({work})  # a pipelined byte, not a close: keep working
        finally:
            c.in_progress -= 1
            if not work.done():
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await work
            eof.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await eof
        if work.cancelled():
            return None
        exc = work.exception()
        if exc is not None:
            return Response(500, repr(exc).encode())
        return work.result()


def _parse(head: bytes) -> Request:
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    path, _, query = target.partition("?")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Request(method, path, query, headers)


def _write(writer: asyncio.StreamWriter, response: Response) -> None:
    reason = _REASONS.get(response.status, "Status")
    head = (
        f"HTTP/1.1 {response.status} {reason}\r\n"
        f"content-type: {response.content_type}\r\n"
        f"content-length: {len(response.body)}\r\n\r\n"
    )
    writer.write(head.encode("latin-1") + response.body)
