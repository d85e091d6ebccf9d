"""A closed-loop HTTP/1.1 load generator on loopback, in its own process (wrk's job).

    python benchmarks/loadgen.py      # then one JSON command per line on stdin

Each command ``{"port": P, "connections": N, "warmup": W, "seconds": S, "path": "/",
"headers": {...}}`` opens N keep-alive connections to 127.0.0.1:P, each sending its next
GET as soon as the previous answer is complete; after W seconds of warm-up it counts
for S seconds and answers one JSON line: completed requests, the window, each
request's latency in µs, and this process's CPU seconds (if they approach the window,
the generator and not the server was the limit). With ``"ports": [P, Q, ...]`` in place
of ``"port"`` it loads every server at once, N connections each, and answers their
figures in that order under ``"ports"`` (the paired rounds of `inbound.py --paired`).
Bare asyncio protocols keep it cheap.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import announce, exit_with_parent


class _Window:
    """The measurement window and what was seen inside it."""

    def __init__(self, start: float, end: float) -> None:
        self.start = start
        self.end = end
        self.latencies_us: list[int] = []
        self.errors = 0
        self.running = True


class _Conn(asyncio.Protocol):
    def __init__(self, request: bytes, window: _Window) -> None:
        self.request = request
        self.window = window
        self.buffer = b""
        self.sent_at = 0.0
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._send()

    def _send(self) -> None:
        assert self.transport is not None
        self.sent_at = time.perf_counter()
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].lower()
            at = head.find(b"content-length:")
            length = 0
            if at >= 0:
                length = int(head[at + 15 :].split(b"\r\n", 1)[0])
            total = end + 4 + length
            if len(self.buffer) < total:
                return
            if not head.startswith(b"http/1.1 200"):
                self.window.errors += 1
            self.buffer = self.buffer[total:]
            self._done()

    def _done(self) -> None:
        now = time.perf_counter()
        w = self.window
        if w.start <= now <= w.end:
            w.latencies_us.append(round((now - self.sent_at) * 1e6))
        if w.running:
            self._send()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.window.running:
            self.window.errors += 1
        if not self.closed.done():
            self.closed.set_result(None)


async def _round(cmd: dict[str, Any]) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    headers = "".join(f"{k}: {v}\r\n" for k, v in cmd.get("headers", {}).items())
    request = f"GET {cmd.get('path', '/')} HTTP/1.1\r\nHost: bench\r\n{headers}\r\n".encode()
    warmup, seconds = float(cmd["warmup"]), float(cmd["seconds"])
    paired = "ports" in cmd
    ports = [int(p) for p in cmd["ports"]] if paired else [int(cmd["port"])]
    start = time.perf_counter() + warmup
    windows = [_Window(start, start + seconds) for _ in ports]
    conns: list[_Conn] = []
    for port, window in zip(ports, windows, strict=True):
        for _ in range(int(cmd["connections"])):
            _, proto = await loop.create_connection(
                functools.partial(_Conn, request, window), "127.0.0.1", port
            )
            conns.append(proto)
    await asyncio.sleep(max(0.0, start - time.perf_counter()))
    cpu0 = time.process_time()
    await asyncio.sleep(max(0.0, start + seconds - time.perf_counter()))
    cpu = time.process_time() - cpu0
    for window in windows:
        window.running = False
    for conn in conns:
        if conn.transport is not None:
            conn.transport.close()
    await asyncio.gather(*(c.closed for c in conns))
    seen = [
        {"requests": len(w.latencies_us), "lat_us": w.latencies_us, "errors": w.errors}
        for w in windows
    ]
    answer: dict[str, Any] = {"seconds": seconds, "cpu_s": cpu}
    if paired:
        answer["ports"] = seen
    else:
        answer |= seen[0]
    return answer


def main() -> None:
    """Answer one load round per command line on stdin, until stdin closes."""
    exit_with_parent()
    announce({"pid": os.getpid()})
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(asyncio.run(_round(json.loads(line)))), flush=True)


if __name__ == "__main__":
    main()
