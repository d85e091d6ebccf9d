"""Real servers on loopback for the inbound middleware tests, each in its own thread."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import pytest

import deadlines

from .apps import Record


def free_socket() -> socket.socket:
    """A listening TCP socket on a free loopback port."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock


def free_port() -> int:
    """A loopback port that was free a moment ago."""
    with contextlib.closing(free_socket()) as sock:
        port: int = sock.getsockname()[1]
    return port


def _wait(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > end:
            raise RuntimeError(f"{what} did not happen within {timeout} s")
        time.sleep(0.005)


@contextlib.contextmanager
def serve_uvicorn(app: Any, *, http: str = "auto", loop: str = "asyncio") -> Iterator[str]:
    """Serve an ASGI app with uvicorn in a thread; yields its base URL.

    The loop is asyncio's unless asked: uvicorn's "auto" would pick uvloop whenever it is
    installed (the dev extra has it), and the tests written for asyncio's loop would
    silently stop covering it (test_asgi_uvloop.py asks for uvloop).
    """
    import uvicorn

    sock = free_socket()
    config = uvicorn.Config(
        app,
        loop=loop,
        http=http,
        ws="none",
        lifespan="off",
        log_level="critical",
        access_log=False,
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        _wait(lambda: server.started, "uvicorn start")
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop"


@contextlib.contextmanager
def serve_hypercorn(app: Any) -> Iterator[str]:
    """Serve an ASGI app with hypercorn (asyncio) in a thread; yields its base URL."""
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    port = free_port()
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 1.0
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(
        target=loop.run_until_complete,
        args=(serve(app, config, shutdown_trigger=stop.wait, mode="asgi"),),
        daemon=True,
    )
    thread.start()
    try:
        _wait(lambda: _connectable(port), "hypercorn start")
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()
        assert not thread.is_alive(), "hypercorn did not stop"


def _connectable(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


class Events:
    """Every deadlines event emitted while the fixture is active, from any thread."""

    def __init__(self) -> None:
        self.items: list[deadlines.Event] = []
        self._open: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, event: deadlines.Event) -> None:
        with self._lock:
            # A request that started before the fixture (a previous test's) is ignored.
            if isinstance(event, deadlines.RequestStarted):
                self._open[event.route] = self._open.get(event.route, 0) + 1
            elif isinstance(event, deadlines.RequestFinished):
                if not self._open.get(event.route):
                    return
                self._open[event.route] -= 1
            self.items.append(event)

    def finished(self, route: str | None = None) -> list[deadlines.RequestFinished]:
        """RequestFinished events, optionally for one route label."""
        return [
            e
            for e in self.items
            if isinstance(e, deadlines.RequestFinished) and (route is None or e.route == route)
        ]

    def wait_finished(
        self, count: int = 1, timeout: float = 5.0
    ) -> list[deadlines.RequestFinished]:
        """Block until `count` requests have finished (servers run in other threads)."""
        _wait(lambda: len(self.finished()) >= count, f"{count} finished requests", timeout)
        return self.finished()

    async def until_finished(
        self, count: int = 1, timeout: float = 5.0
    ) -> list[deadlines.RequestFinished]:
        """`wait_finished` for servers on the test's own event loop."""
        end = time.monotonic() + timeout
        while len(self.finished()) < count:
            assert time.monotonic() < end, f"{count} requests never finished: {self.items}"
            await asyncio.sleep(0.005)
        return self.finished()


@pytest.fixture
def events() -> Iterator[Events]:
    """Record deadlines events for the duration of a test."""
    recorder = Events()
    unsubscribe = deadlines.observe(recorder)
    try:
        yield recorder
    finally:
        unsubscribe()


def raw_request(port: int, data: bytes, *, timeout: float = 5.0) -> bytes:
    """Send raw bytes to a loopback port and return everything the server answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks: list[bytes] = []
        while True:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            chunks.append(chunk)
            if b"\r\n\r\n" in b"".join(chunks) and _complete(b"".join(chunks)):
                break
        return b"".join(chunks)


def read_response(sock: socket.socket) -> bytes:
    """One whole response with a content-length from `sock`, which stays open for more."""
    data = b""
    while not _complete(data):
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection after {data!r}"
        data += chunk
    return data


def _complete(data: bytes) -> bool:
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":", 1)[1])
    return False


def status_of(response: bytes) -> int:
    """The status code of a raw HTTP/1.1 response."""
    return int(response.split(b" ", 2)[1])


@contextlib.contextmanager
def serve_aiohttp(app: Any, **runner_options: Any) -> Iterator[str]:
    """Serve an aiohttp.web app in a thread with its own loop; yields its base URL."""
    from aiohttp import web

    sock = free_socket()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None, **runner_options)

    async def start() -> None:
        await runner.setup()
        await web.SockSite(runner, sock).start()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(start(), loop).result(10)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
        sock.close()


@contextlib.contextmanager
def serve_waitress(app: Any) -> Iterator[str]:
    """Serve a WSGI app with waitress in a thread; yields its base URL."""
    from waitress import wasyncore
    from waitress.server import create_server

    server = create_server(app, host="127.0.0.1", port=0, threads=4, asyncore_loop_timeout=0.05)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.effective_port}"
    finally:
        # Close the sockets from the server's own loop thread, then stop the workers.
        try:
            server.trigger.pull_trigger(lambda: wasyncore.close_all(server._map))
        except OSError:
            # Its trigger pipe's descriptor was closed under it (seen once in a full run,
            # EBADF): close from here; the loop ends when its map is empty.
            wasyncore.close_all(server._map)
        thread.join(10)
        server.task_dispatcher.shutdown()
        assert not thread.is_alive(), "waitress did not stop"


@contextlib.asynccontextmanager
async def uvicorn_in_loop(app: Any) -> AsyncIterator[str]:
    """Serve an ASGI app with uvicorn on the current event loop; yields its base URL."""
    import uvicorn

    sock = free_socket()
    config = uvicorn.Config(app, ws="none", lifespan="off", log_level="critical", access_log=False)
    server = uvicorn.Server(config)
    task = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.005)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


@pytest.fixture(scope="module")
def record() -> Record:
    """Observations of the module's handlers, shared by its servers (one per module)."""
    return Record()
