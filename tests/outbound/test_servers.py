"""The lab's misbehaving servers do what their docs say, seen with raw sockets."""

from __future__ import annotations

import socket
import time

import pytest
from outbound_helpers import fds_settle, open_fds

from deadlines.lab import servers
from deadlines.lab.servers import (
    BlackholeServer,
    HeaderTrickleServer,
    HealthyServer,
    ResetServer,
    SilentServer,
    SlowServer,
    TLSNeverServer,
    TrickleServer,
)

GET = b"GET /x HTTP/1.1\r\nHost: t\r\nX-Request-Timeout-Ms: 1234\r\n\r\n"


def connect(server: servers.Server) -> socket.socket:
    """A client socket connected to `server`, with a 2 s timeout."""
    return socket.create_connection((server.host, server.port), timeout=2.0)


def test_healthy_answers_and_records_the_request() -> None:
    """The healthy server answers at once and keeps the request head, names lower-case."""
    with HealthyServer(body=b"hello") as server, connect(server) as sock:
        sock.sendall(GET)
        assert sock.recv(1024).endswith(b"\r\n\r\nhello")
        assert server.requests[0].headers["x-request-timeout-ms"] == "1234"
        assert server.requests[0].method == "GET"


def test_peer_close_is_counted_with_its_time() -> None:
    """Closing the client socket is seen server-side: counted and timestamped."""
    with SilentServer() as server:
        sock = connect(server)
        assert server.wait_opened(1)
        closed_at = time.monotonic()
        sock.close()
        assert server.wait_peer_closed(1)
        assert server.close_times[0] - closed_at < 0.5
        assert server.wait_idle()


def test_silent_never_answers() -> None:
    """The silent server accepts and reads but sends nothing."""
    with SilentServer() as server, connect(server) as sock:
        sock.sendall(GET)
        sock.settimeout(0.2)
        with pytest.raises(TimeoutError):
            sock.recv(1)


def test_slow_answers_after_its_delay() -> None:
    """The slow server's first byte comes after `delay` seconds."""
    with SlowServer(0.3) as server, connect(server) as sock:
        start = time.monotonic()
        sock.sendall(GET)
        assert sock.recv(1024).startswith(b"HTTP/1.1 200")
        assert 0.29 <= time.monotonic() - start < 1.0


def test_trickle_sends_a_body_byte_per_interval() -> None:
    """After the head, the body comes one byte per interval."""
    with TrickleServer(interval=0.1, length=100) as server, connect(server) as sock:
        sock.sendall(GET)
        head = b""
        while b"\r\n\r\n" not in head:
            head += sock.recv(1024)
        start = time.monotonic()
        got = len(head.split(b"\r\n\r\n", 1)[1])
        while got < 4:
            got += len(sock.recv(1024))
        assert 0.2 <= time.monotonic() - start < 1.0


def test_header_trickle_sends_the_head_byte_by_byte() -> None:
    """The status line arrives one byte per interval."""
    with HeaderTrickleServer(interval=0.05) as server, connect(server) as sock:
        sock.sendall(GET)
        start = time.monotonic()
        data = b""
        while len(data) < 5:
            data += sock.recv(1024)
        assert data.startswith(b"HTTP/")
        assert time.monotonic() - start >= 0.15


def test_reset_sends_part_of_the_body_then_rst() -> None:
    """The reset server breaks the connection mid-body with a RST."""
    with ResetServer(sent=10, length=1000) as server, connect(server) as sock:
        sock.sendall(GET)
        data = b""
        with pytest.raises(ConnectionResetError):
            while True:
                chunk = sock.recv(4096)
                assert chunk, "a RST, not a clean FIN, was expected"
                data += chunk
        assert data.endswith(b"\r\n\r\n" + b"x" * 10)


def test_tls_never_is_https_and_silent() -> None:
    """The TLS-never server is reached with https:// and never answers a ClientHello."""
    with TLSNeverServer() as server, connect(server) as sock:
        assert server.url.startswith("https://127.0.0.1:")
        sock.sendall(b"\x16\x03\x01\x00\x05hello")
        sock.settimeout(0.2)
        with pytest.raises(TimeoutError):
            sock.recv(1)


def test_blackhole_connect_hangs_and_stays_bounded() -> None:
    """A connect to the loopback blackhole hangs (SYNs dropped); stopping frees it all."""
    baseline = open_fds()
    with BlackholeServer() as server:
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            socket.create_connection((server.host, server.port), timeout=0.3)
        assert 0.29 <= time.monotonic() - start < 1.0
        assert server.opened == 0
    assert fds_settle(baseline) == baseline


def test_stop_leaves_no_threads_or_sockets() -> None:
    """Stopping a server with a client still connected joins its threads, frees its fds."""
    baseline = open_fds()
    with TrickleServer(interval=0.05) as server:
        sock = connect(server)
        sock.sendall(GET)
        assert server.wait_opened(1)
    assert all(not thread.is_alive() for thread in server._threads)
    sock.close()
    assert fds_settle(baseline) == baseline


def test_registry_names_every_server() -> None:
    """The lab finds each server by name."""
    assert set(servers.SERVERS) == {
        "healthy",
        "slow",
        "silent",
        "header-trickle",
        "trickle",
        "reset",
        "tls-never",
        "blackhole",
    }
