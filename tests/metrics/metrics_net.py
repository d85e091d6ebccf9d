"""Real misbehaving servers on loopback, a tiny honest client, and a scrape helper.

The client uses `deadlines.CallBudget` the way an outbound integration does: a bounded
pool, then connect, send, headers and body, each limited by `budget.limit(phase)`, the
pool wait measured, and the right error raised for what fired.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import threading
import time
from collections.abc import Iterator
from types import TracebackType
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from deadlines import CallBudget, Dependency

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class HttpServer:
    """An HTTP/1.1 server on 127.0.0.1 that answers after `delay` s, or never (None).

    A silent server (``delay=None``) reads the request and then holds the connection
    open, saying nothing, until the client gives up and closes it.
    """

    def __init__(self, delay: float | None) -> None:
        self.delay = delay
        self.requests = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> HttpServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()  # a silent handler sees the close and returns
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=5)
        await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        try:
            await reader.readuntil(b"\r\n\r\n")
            self.requests += 1
            if self.delay is None:
                while await reader.read(4096):  # silent until the client closes
                    pass
                return
            await asyncio.sleep(self.delay)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            self._writers.discard(writer)
            self._tasks.discard(task)
            writer.close()

    async def wait_requests(self, n: int, timeout: float = 10.0) -> None:
        """Return once `n` requests have arrived (fail after `timeout` s)."""
        end = time.monotonic() + timeout
        while self.requests < n:
            assert time.monotonic() < end, f"only {self.requests} of {n} requests arrived"
            await asyncio.sleep(0.005)


class Blackhole:
    """A loopback listener whose accept queue is full: a new connect never completes."""

    def __init__(self) -> None:
        self._listener = socket.socket()
        self._fillers: list[socket.socket] = []
        self.port = 0

    def __enter__(self) -> Blackhole:
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(0)
        self.port = self._listener.getsockname()[1]
        for _ in range(16):  # fill the queue until a connect hangs
            s = socket.socket()
            s.setblocking(False)
            self._fillers.append(s)
            with contextlib.suppress(BlockingIOError):
                s.connect(("127.0.0.1", self.port))
            if not select.select([], [s], [], 0.2)[1]:
                return self
        raise AssertionError("could not fill the accept queue")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for s in self._fillers:
            s.close()
        self._listener.close()


class TinyClient:
    """GET over a new connection per call, through a pool of `dependency.pool_size` slots."""

    def __init__(self, dependency: Dependency, port: int) -> None:
        self.dependency = dependency
        self.port = port
        self._slots = asyncio.Semaphore(dependency.pool_size)

    async def get(self) -> bytes:
        """One call under a `CallBudget`, which reports it to the observers."""
        budget = CallBudget(self.dependency)
        with budget:
            return await self._call(budget)

    async def _call(self, budget: CallBudget) -> bytes:
        began = time.monotonic()
        try:
            await asyncio.wait_for(self._slots.acquire(), budget.limit("pool"))
        except TimeoutError as exc:
            budget.pool_wait = time.monotonic() - began
            raise budget.timeout("pool") from exc
        budget.pool_wait = time.monotonic() - began
        writer: asyncio.StreamWriter | None = None
        try:
            try:
                connecting = asyncio.open_connection("127.0.0.1", self.port)
                reader, writer = await asyncio.wait_for(connecting, budget.limit("connect"))
            except TimeoutError as exc:
                raise budget.timeout("connect") from exc
            writer.write(b"GET / HTTP/1.1\r\nHost: dep\r\nConnection: close\r\n\r\n")
            budget.request_sent = True
            try:
                head = await asyncio.wait_for(
                    reader.readuntil(b"\r\n\r\n"), budget.limit("headers")
                )
            except TimeoutError as exc:
                raise budget.timeout("headers") from exc
            try:
                body = await asyncio.wait_for(reader.read(), budget.limit("idle"))
            except TimeoutError as exc:
                raise budget.timeout("idle") from exc
            return head + body
        finally:
            if writer is not None:
                writer.close()
            self._slots.release()


def scrape(registry: CollectorRegistry) -> Samples:
    """Every sample in the registry's text exposition, keyed by (name, sorted labels)."""
    return parse(generate_latest(registry).decode())


def parse(text: str) -> Samples:
    """Every sample in a Prometheus text exposition, keyed by (name, sorted labels)."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The sample `name` with exactly `labels`, or None when it is not exported."""
    return samples.get((name, tuple(sorted(labels.items()))))


@contextlib.contextmanager
def serve_uvicorn(app: Any) -> Iterator[int]:
    """Serve an ASGI app with uvicorn in its own thread on loopback; yields the port."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    config = uvicorn.Config(app, lifespan="off", log_level="critical", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        end = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < end and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.005)
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop"
