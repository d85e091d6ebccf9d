"""DLN108 true negative: a module that sets a default timeout for every socket."""

from __future__ import annotations

import socket

socket.setdefaulttimeout(5.0)


def probe(host: str, port: int) -> bytes:
    with socket.create_connection((host, port)) as conn:
        return conn.recv(16)
