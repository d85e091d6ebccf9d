"""DLN108: sockets with no timeout."""

from __future__ import annotations

import socket


def probe(host: str, port: int) -> bytes:
    with socket.create_connection((host, port)) as conn:  # expect: DLN108
        return conn.recv(16)


def probe_bounded(host: str, port: int) -> bytes:
    with socket.create_connection((host, port), timeout=1.5) as conn:
        return conn.recv(16)


def raw_client(host: str, port: int) -> bytes:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # expect: DLN108
    sock.connect((host, port))
    return sock.recv(1024)


def raw_client_bounded(host: str, port: int) -> bytes:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(2.0)
    sock.connect((host, port))
    return sock.recv(1024)


def for_the_event_loop() -> socket.socket:
    sock = socket.socket()
    sock.setblocking(False)
    return sock


def server(port: int) -> socket.socket:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        conn, _ = listener.accept()
        return conn


def made_blocking(sock: socket.socket) -> None:
    sock.settimeout(None)  # expect: DLN108
