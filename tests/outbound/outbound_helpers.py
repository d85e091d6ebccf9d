"""Helpers for the outbound tests: counting file descriptors, timing tolerances, TLS."""

from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import deadlines
from deadlines._events import CallFinished
from deadlines.lab.defaults.clients import open_connections
from deadlines.lab.servers import Connection, Server

#: Firing tolerance: early by at most 10 ms, late by at most 500 ms (a loaded 2-core box).
EARLY = 0.01
LATE = 0.5


def open_fds() -> int:
    """File descriptors open in this process (servers and clients alike)."""
    return len(os.listdir("/proc/self/fd"))


def fds_settle(baseline: int, timeout: float = 2.0) -> int:
    """Wait until the fd count is back to `baseline` (or `timeout`); return the count."""
    end = time.monotonic() + timeout
    while (count := open_fds()) != baseline and time.monotonic() < end:
        time.sleep(0.01)
    return count


def fired_at(elapsed: float, limit: float) -> bool:
    """Whether a limit of `limit` seconds fired on time, within the tolerance."""
    return limit - EARLY <= elapsed <= limit + LATE


async def eventually(ready: Callable[[], bool], timeout: float = 2.0) -> bool:
    """Whether `ready()` becomes true within `timeout`, polling without blocking the loop.

    Async tests must not wait on a server with a blocking call: the event loop then
    cannot run the close it has scheduled.
    """
    end = time.monotonic() + timeout
    while not ready():
        if time.monotonic() >= end:
            return False
        await anyio.sleep(0.005)
    return True


async def peer_closed(server: Server, count: int = 1, timeout: float = 2.0) -> bool:
    """Whether `server` saw its peer close `count` connections within `timeout`."""
    return await eventually(lambda: server.peer_closed >= count, timeout)


async def server_idle(server: Server, timeout: float = 2.0) -> bool:
    """Whether `server` has no connection open within `timeout`."""
    return await eventually(lambda: server.opened == server.closed, timeout)


async def fds_back(baseline: int, timeout: float = 2.0) -> int:
    """The fd count once back to `baseline` (or when `timeout` ran out)."""
    await eventually(lambda: open_fds() == baseline, timeout)
    return open_fds()


def write_self_signed(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 and localhost, and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


def sockets_to(port: int) -> int:
    """This process's TCP sockets to loopback `port` that are not closed yet."""
    return open_connections(port) or 0


class UploadStallServer(Server):
    """Accepts and never reads: a large request body stalls in the client's write phase.

    Its sockets take little (a small receive buffer), so a few hundred KiB fill them.
    Never reading, it cannot see the client close either: check the client's sockets.
    """

    def _listen(self, backlog: int) -> socket.socket:
        listener = super()._listen(backlog)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        return listener

    def handle(self, conn: Connection) -> None:
        """Hold the connection, unread, until the server stops."""
        while not self.stopping:
            time.sleep(0.02)


@contextmanager
def finished_events() -> Iterator[list[CallFinished]]:
    """The CallFinished events reported while the block runs."""
    seen: list[CallFinished] = []

    def keep(event: object) -> None:
        if isinstance(event, CallFinished):
            seen.append(event)

    unsubscribe = deadlines.observe(keep)
    try:
        yield seen
    finally:
        unsubscribe()
