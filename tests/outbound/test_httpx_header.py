"""deadlines.httpx: the x-request-timeout-ms header carries the time left when it is sent.

The header is set once the call is admitted to the pool and refreshed after a new
connection is up; these tests make connecting slow (a TLS handshake the server holds
back) and check the next hop is not promised the time spent connecting.
"""

from __future__ import annotations

import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from outbound_helpers import write_self_signed

import deadlines
import deadlines.httpx as dhttpx
from deadlines import Dependency

pytestmark = pytest.mark.realtime

HANDSHAKE_DELAY = 0.3


class SlowHandshakeServer:
    """HTTPS on loopback that waits `HANDSHAKE_DELAY` before each TLS handshake.

    Records the x-request-timeout-ms value of every request; keeps connections alive.
    """

    def __init__(self, folder: Path) -> None:
        cert, key = write_self_signed(folder)
        self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._tls.load_cert_chain(cert, key)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.url = f"https://127.0.0.1:{self._listener.getsockname()[1]}/"
        self.sent: list[int] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> SlowHandshakeServer:
        self._spawn(self._accept)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(5)
        self._listener.close()

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self._threads.append(thread)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            self._spawn(self._serve, conn)

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            time.sleep(HANDSHAKE_DELAY)
            conn.settimeout(5)
            try:
                with self._tls.wrap_socket(conn, server_side=True) as tls:
                    buffer = b""
                    while not self._stop.is_set():
                        chunk = tls.recv(65536)
                        if not chunk:
                            return
                        buffer += chunk
                        while b"\r\n\r\n" in buffer:
                            head, buffer = buffer.split(b"\r\n\r\n", 1)
                            for line in head.split(b"\r\n")[1:]:
                                key, _, value = line.partition(b":")
                                if key.strip().lower() == b"x-request-timeout-ms":
                                    self.sent.append(int(value.strip()))
                            tls.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
            except (OSError, ssl.SSLError):
                return


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SlowHandshakeServer]:
    """A started SlowHandshakeServer, stopped after the test."""
    with SlowHandshakeServer(tmp_path) as running:
        yield running


DEP = Dependency("t", connect=2, headers=2, total=2, pool_size=2)


@pytest.mark.anyio
async def test_async_header_excludes_the_time_spent_connecting(
    server: SlowHandshakeServer,
) -> None:
    """A new connection's handshake time is taken out of the header; a reused one's is not."""
    async with dhttpx.AsyncClient(DEP, verify=False) as client:
        for _ in range(2):
            async with deadlines.scope(1.5):
                assert (await client.get(server.url)).status_code == 200
    first, reused = server.sent
    assert first <= 1500 - 1000 * HANDSHAKE_DELAY + 20
    assert reused > 1500 - 200


def test_sync_header_excludes_the_time_spent_connecting(server: SlowHandshakeServer) -> None:
    """The blocking client refreshes the header after connecting, too."""
    with dhttpx.Client(DEP, verify=False) as client, deadlines.scope(1.5):
        assert client.get(server.url).status_code == 200
    assert server.sent[0] <= 1500 - 1000 * HANDSHAKE_DELAY + 20


@pytest.mark.anyio
async def test_header_with_a_caller_trace_is_refreshed_too(server: SlowHandshakeServer) -> None:
    """With the caller's own trace hook installed, the header is still the time left."""
    events: list[str] = []

    async def trace(name: str, info: object) -> None:
        events.append(name)

    async with dhttpx.AsyncClient(DEP, verify=False) as client, deadlines.scope(1.5):
        response = await client.get(server.url, extensions={"trace": trace})
        assert response.status_code == 200
    assert server.sent[0] <= 1500 - 1000 * HANDSHAKE_DELAY + 20
    assert "http11.send_request_headers.started" in events
