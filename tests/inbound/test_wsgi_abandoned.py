"""The WSGI DeadlineMiddleware when the server abandons a streamed body (waitress)."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from deadlines.wsgi import DeadlineMiddleware

from .conftest import Events, serve_waitress

pytestmark = pytest.mark.realtime


def test_abandoned_body_is_caller_left(events: Events) -> None:
    """A client that resets the connection mid-body makes the server stop iterating and
    close the body: the request ends "caller_left", not "ok"; a whole body ends "ok"."""

    def app(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        start_response("200 OK", [("Content-Type", "text/plain")])
        count = 200 if environ["PATH_INFO"] == "/feed" else 2

        def chunks() -> Iterator[bytes]:
            for _ in range(count):
                yield b"x" * 65536
                time.sleep(0.02)

        return chunks()

    wrapped = DeadlineMiddleware(app, default=10.0, maximum=10.0)
    with serve_waitress(wrapped) as base:
        port = httpx.URL(base).port
        assert port is not None
        sock = socket.create_connection(("127.0.0.1", port), timeout=5)
        sock.sendall(b"GET /feed HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(1000)
        time.sleep(0.1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()  # a reset
        (abandoned,) = events.wait_finished(1)
        assert abandoned.outcome == "caller_left"
        assert abandoned.duration < 3.0  # far from its 200 chunks' 4 s
        assert len(httpx.get(f"{base}/whole", timeout=5).content) == 2 * 65536
        assert [e.outcome for e in events.wait_finished(2)] == ["caller_left", "ok"]
