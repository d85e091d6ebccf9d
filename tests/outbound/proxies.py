"""Proxies on loopback for the outbound tests: forwarding, tunnelling, or never answering.

`ProxyServer` is an HTTP proxy: an absolute-form request (``GET http://host/path``) is
forwarded to its origin, a ``CONNECT host:port`` is answered 200 and tunnelled, and
what it was asked is kept in `asked`. With ``silent=True`` it accepts, reads the request
and never answers. `TLSServer` answers like `HealthyServer`, over TLS, for the origin
behind a tunnel.
"""

from __future__ import annotations

import select
import socket
import ssl
import struct
from pathlib import Path
from urllib.parse import urlsplit

from deadlines.lab.servers import Connection, HealthyServer, Server

_POLL = 0.02


def relay(conn: Connection, upstream: socket.socket, first: bytes = b"") -> None:
    """Copy bytes both ways until either side closes or the server stops."""
    if first:
        upstream.sendall(first)
    client = conn.sock
    try:
        while not conn._server.stopping:
            ready, _, _ = select.select([client, upstream], [], [], _POLL)
            for sock in ready:
                data = sock.recv(65536)
                if not data:
                    if sock is client:
                        conn._peer_closed()
                    return
                (upstream if sock is client else client).sendall(data)
    except OSError:
        conn._peer_closed()
    finally:
        upstream.close()


class ProxyServer(Server):
    """An HTTP proxy: absolute-form requests forwarded, CONNECT tunnelled (or silence)."""

    def __init__(self, *, silent: bool = False) -> None:
        super().__init__()
        self.silent = silent
        self.asked: list[str] = []

    def handle(self, conn: Connection) -> None:
        """Serve one client connection."""
        request = conn.read_request()
        if request is None:
            return
        self.asked.append(f"{request.method} {request.target}")
        if self.silent:
            conn.wait(float("inf"))
            return
        if request.method == "CONNECT":
            host, port = request.target.rsplit(":", 1)
            upstream = socket.create_connection((host, int(port)), timeout=2.0)
            upstream.settimeout(None)
            conn.send(b"HTTP/1.1 200 Connection established\r\n\r\n")
            relay(conn, upstream)
            return
        url = urlsplit(request.target)
        upstream = socket.create_connection((url.hostname, url.port or 80), timeout=2.0)
        upstream.settimeout(None)
        head = f"{request.method} {url.path or '/'} HTTP/1.1\r\n"
        head += "".join(f"{name}: {value}\r\n" for name, value in request.headers.items())
        relay(conn, upstream, (head + "\r\n").encode("latin-1") + request.body)


class TLSServer(HealthyServer):
    """`HealthyServer` over TLS, with the certificate and key given."""

    scheme = "https"

    def __init__(self, cert: Path, key: Path, *, body: bytes = b"ok") -> None:
        super().__init__(body=body)
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert, key)

    def _serve(self, sock: socket.socket) -> None:
        try:
            sock.settimeout(2.0)
            wrapped = self.context.wrap_socket(sock, server_side=True)
            wrapped.settimeout(None)
        except (OSError, ssl.SSLError):
            sock.close()
            with self._changed:
                self._sockets.discard(sock)
                self.closed += 1
                self._changed.notify_all()
            return
        with self._changed:
            self._sockets.discard(sock)
            self._sockets.add(wrapped)
        super()._serve(wrapped)


class Socks5Server(Server):
    """A SOCKS5 proxy without authentication: CONNECT to an IPv4 address, then relay.

    With ``silent=True`` it reads the greeting and never answers.
    """

    def __init__(self, *, silent: bool = False) -> None:
        super().__init__()
        self.silent = silent
        self.asked: list[str] = []

    def handle(self, conn: Connection) -> None:
        """Serve one client connection."""
        sock = conn.sock
        sock.settimeout(2.0)
        try:
            greeting = sock.recv(2)
            sock.recv(greeting[1])  # the methods offered
            if self.silent:
                sock.settimeout(None)
                conn.wait(float("inf"))
                return
            sock.sendall(b"\x05\x00")  # no authentication
            _, command, _, kind = sock.recv(4)
            if command != 1 or kind != 1:  # CONNECT to an IPv4 address only
                sock.sendall(b"\x05\x07\x00\x01" + b"\x00" * 6)
                return
            address = socket.inet_ntoa(sock.recv(4))
            port = struct.unpack("!H", sock.recv(2))[0]
            self.asked.append(f"{address}:{port}")
            upstream = socket.create_connection((address, port), timeout=2.0)
            upstream.settimeout(None)
            sock.sendall(b"\x05\x00\x00\x01" + socket.inet_aton("0.0.0.0") + b"\x00\x00")
            sock.settimeout(None)
        except OSError:
            return
        relay(conn, upstream)
