"""A real HTTP/2 server on loopback for the outbound tests: Hypercorn over TLS (ALPN h2).

    with H2Server() as server:
        async with deadlines.httpx.AsyncClient(dep, http2=True, verify=server.ssl_context()) as c:
            await c.get(server.url("/ok"))

Hypercorn runs in a thread of its own with its own event loop, on a socket bound to
127.0.0.1 (listening before the thread starts, so the first connection never races
the server). The certificate is self-signed for 127.0.0.1 and ``localhost``, made
with `cryptography` in a temporary directory. With ``tls=False`` it serves cleartext
HTTP/2 to clients that speak it from the first byte (``http1=False, http2=True``).
``max_streams`` is the concurrent streams it allows per connection (SETTINGS). The
ASGI app answers by path:

| path | what it does |
|---|---|
| ``/ok`` | 200 ``ok`` at once |
| ``/slow?delay=S`` | 200 ``slow`` after S seconds |
| ``/silent`` | never answers; waits for the client to go away |
| ``/stall`` | sends the head and one body byte, then nothing |
| ``/trickle?interval=S&count=N`` | the head, then a byte every S seconds, N bytes (or 5 s) |

Every request is recorded in `requests` (path, HTTP version, headers, the client's
port: equal ports mean one connection), and `disconnects` counts the requests whose
client went away before they ended.
"""

from __future__ import annotations

import asyncio
import math
import os
import socket
import ssl
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self
from urllib.parse import parse_qs

from hypercorn.asyncio import serve
from hypercorn.config import Config
from hypercorn.logging import Logger
from outbound_helpers import write_self_signed

_TRICKLE_FOR = 5.0  # seconds a trickle lasts at most, so no handler outlives a test


@dataclass(frozen=True, slots=True)
class Seen:
    """One request as the app received it."""

    path: str
    http_version: str
    headers: dict[str, str]
    client_port: int
    received_at: float = field(default_factory=time.monotonic)


class H2Server:
    """Hypercorn serving the test app over TLS with ALPN h2, in a background thread."""

    def __init__(self, *, tls: bool = True, max_streams: int = 100) -> None:
        self.tls = tls
        self.requests: list[Seen] = []
        self.disconnects = 0
        self._serving = threading.Event()
        self._tmp = tempfile.TemporaryDirectory(prefix="deadlines-h2-")
        self.cert_path, key_path = write_self_signed(Path(self._tmp.name))
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(128)
        self.port: int = self._sock.getsockname()[1]
        config = Config()
        config.bind = [f"fd://{os.dup(self._sock.fileno())}"]  # Hypercorn owns the copy
        if tls:
            config.certfile = str(self.cert_path)
            config.keyfile = str(key_path)
            config.alpn_protocols = ["h2", "http/1.1"]
        config.h2_max_concurrent_streams = max_streams
        config.graceful_timeout = 0.5
        config.errorlog = None
        config.accesslog = None
        config.logger_class = self._logger_class()
        self._config = config
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="h2-server", daemon=True)

    def url(self, path: str = "/ok") -> str:
        """The URL of `path` on this server (https unless ``tls=False``)."""
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}{path}"

    def ssl_context(self) -> ssl.SSLContext:
        """A client context that trusts this server's certificate (and nothing else)."""
        return ssl.create_default_context(cafile=str(self.cert_path))

    def wait_requests(self, count: int, timeout: float = 2.0) -> bool:
        """Whether `count` requests have arrived within `timeout`."""
        end = time.monotonic() + timeout
        while len(self.requests) < count:
            if time.monotonic() >= end:
                return False
            time.sleep(0.005)
        return True

    # Lifecycle.

    def start(self) -> Self:
        """Start serving; returns once Hypercorn serves (its certificate files closed)."""
        self._thread.start()
        if not self._serving.wait(10):
            raise RuntimeError("the HTTP/2 server did not start")
        return self

    def stop(self) -> None:
        """Stop serving, join the thread, remove the certificate."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=10)
        self._sock.close()
        self._tmp.cleanup()
        if self._thread.is_alive():
            raise RuntimeError("the HTTP/2 server did not stop")

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        await serve(self._app, self._config, shutdown_trigger=self._stop.wait)  # type: ignore[arg-type]

    def _logger_class(self) -> type[Logger]:
        """Hypercorn's logger, silent, telling us when it serves ("Running on ...")."""
        serving = self._serving

        class ReadyLogger(Logger):
            async def info(self, message: str, *args: Any, **kwargs: Any) -> None:
                if message.startswith("Running on"):
                    serving.set()

        return ReadyLogger

    # The ASGI app.

    async def _app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        self.requests.append(
            Seen(scope["path"], scope["http_version"], headers, scope["client"][1])
        )
        query = {k: float(v[0]) for k, v in parse_qs(scope["query_string"].decode()).items()}
        handler = getattr(self, "_" + scope["path"].strip("/"), None)
        if handler is None:
            await self._head(send, 404)
            await send({"type": "http.response.body", "body": b""})
            return
        await receive()  # the request (no body in these tests)
        watcher = asyncio.ensure_future(self._until_disconnect(receive))
        try:
            await handler(send, watcher, **query)
        finally:
            watcher.cancel()

    async def _until_disconnect(self, receive: Any) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        self.disconnects += 1

    @staticmethod
    async def _head(send: Any, status: int = 200) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"text/plain")],
            }
        )

    async def _ok(self, send: Any, gone: asyncio.Future[None]) -> None:
        await self._head(send)
        await send({"type": "http.response.body", "body": b"ok"})

    async def _slow(self, send: Any, gone: asyncio.Future[None], delay: float = 1.0) -> None:
        await asyncio.wait([gone], timeout=delay)
        if not gone.done():
            await self._head(send)
            await send({"type": "http.response.body", "body": b"slow"})

    async def _silent(self, send: Any, gone: asyncio.Future[None]) -> None:
        await gone

    async def _stall(self, send: Any, gone: asyncio.Future[None]) -> None:
        await self._head(send)
        await send({"type": "http.response.body", "body": b"x", "more_body": True})
        await gone

    async def _trickle(
        self, send: Any, gone: asyncio.Future[None], interval: float, count: float = math.inf
    ) -> None:
        await self._head(send)
        end = time.monotonic() + _TRICKLE_FOR
        sent = 0
        while not gone.done() and time.monotonic() < end and sent < count:
            await send({"type": "http.response.body", "body": b"x", "more_body": True})
            sent += 1
            await asyncio.wait([gone], timeout=interval)
        if not gone.done():
            await send({"type": "http.response.body", "body": b""})
