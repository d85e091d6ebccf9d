"""Misbehaving HTTP servers on loopback, one per way a call can hang. Standard library only.

Every server listens on ``127.0.0.1`` on a free port, serves each connection from its
own background thread, and is started and stopped by a context manager that reports
its URL:

    with TrickleServer(interval=0.5) as server:
        ...                                     # call server.url with the client under test
        assert server.wait_peer_closed(1)       # the client really closed its socket

| server | what it does | the phase a client hangs in |
|---|---|---|
| `HealthyServer` | answers at once (keep-alive) | none |
| `SlowServer` | answers after `delay` seconds | headers (time to first byte) |
| `SilentServer` | accepts, reads, never answers | headers |
| `HeaderTrickleServer` | sends the status line and headers a byte per `interval` | headers |
| `TrickleServer` | sends the headers, then a body byte per `interval` | body (idle never fires) |
| `ResetServer` | part of the body, then a TCP reset (``SO_LINGER`` 0) | body (an error) |
| `TLSNeverServer` | plain TCP reached with ``https://``; never answers | connect (TLS) |
| `BlackholeServer` | a listener whose accept queue is full, so SYNs are dropped | connect (TCP) |

Each server counts what it sees of its connections (`opened`, `peer_closed`,
`closed`) and records when the peer closed (`close_times`, on `time.monotonic`), so a
test can assert that a client closed the socket after a timeout or a cancellation, and
how soon. Request heads are kept in `requests` (header names lower-case), e.g. to check
the ``x-request-timeout-ms`` a client sent. A server never closes a connection first
unless that is its misbehaviour (`ResetServer`): it waits for the client to leave.
"""

from __future__ import annotations

import errno
import math
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import ClassVar, Self

__all__ = [
    "SERVERS",
    "BlackholeServer",
    "Connection",
    "HeaderTrickleServer",
    "HealthyServer",
    "Request",
    "ResetServer",
    "Server",
    "SilentServer",
    "SlowServer",
    "TLSNeverServer",
    "TrickleServer",
]

_POLL = 0.02  # how often a waiting connection thread looks at the stop flag
_MAX_BUFFER = 1 << 20  # bytes kept from a client; more is read and dropped
_REASONS = {200: "OK", 500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable"}


def _readable(sock: socket.socket, timeout: float) -> bool:
    """Whether `sock` has data (or EOF) within `timeout` seconds; poll has no fd limit."""
    if hasattr(select, "poll"):
        poller = select.poll()
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(max(0, math.ceil(timeout * 1000))))
    ready, _, _ = select.select([sock], [], [], max(0.0, timeout))  # pragma: no cover
    return bool(ready)


@dataclass(frozen=True, slots=True)
class Request:
    """One request head (and body) as the server received it."""

    method: str
    target: str
    headers: dict[str, str]
    body: bytes
    received_at: float = field(default_factory=time.monotonic)


class Connection:
    """One accepted socket, with waits that end when the peer closes or the server stops.

    Handlers use it instead of the raw socket so that every wait notices the peer
    closing (and counts it) and no thread outlives `Server.stop`.
    """

    def __init__(self, sock: socket.socket, server: Server) -> None:
        self.sock = sock
        self._server = server
        self._buffer = b""
        self.peer_gone = False
        self.bytes_received = 0

    def _receive(self, timeout: float) -> bool | None:
        """Read what arrives within `timeout`: True on data, False on nothing, None if gone."""
        if self.peer_gone or self._server.stopping:
            return None
        try:
            ready = _readable(self.sock, timeout)
        except (OSError, ValueError):  # closed under us by stop()
            return None
        if not ready:
            return False
        try:
            data = self.sock.recv(65536)
        except OSError:
            data = b""  # a reset is a close too
        if not data:
            self._peer_closed()
            return None
        self.bytes_received += len(data)
        if len(self._buffer) < _MAX_BUFFER:
            self._buffer += data
        return True

    def _peer_closed(self) -> None:
        if not self.peer_gone:
            self.peer_gone = True
            self._server._count_peer_closed()

    def wait(self, seconds: float) -> bool:
        """Wait `seconds` (may be `math.inf`); False as soon as the peer closes or we stop."""
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return not (self.peer_gone or self._server.stopping)
            if self._receive(min(left, _POLL)) is None:
                return False

    def read_request(self) -> Request | None:
        """The next request on this connection, or None when the peer closed first."""
        while b"\r\n\r\n" not in self._buffer:
            if self._receive(_POLL) is None:
                return None
        head, self._buffer = self._buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        method, target, *_ = [*lines[0].split(" "), "", ""]
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while b"0\r\n\r\n" not in self._buffer:
                if self._receive(_POLL) is None:
                    return None
            body, self._buffer = self._buffer.split(b"0\r\n\r\n", 1)
        else:
            length = int(headers.get("content-length", "0") or 0)
            while len(self._buffer) < length:
                if self._receive(_POLL) is None:
                    return None
            body, self._buffer = self._buffer[:length], self._buffer[length:]
        request = Request(method, target, headers, body)
        self._server._record(request)
        return request

    def send(self, data: bytes) -> bool:
        """Send all of `data`; False when the peer is gone."""
        if self.peer_gone or self._server.stopping:
            return False
        try:
            self.sock.settimeout(2.0)
            self.sock.sendall(data)
        except OSError:
            self._peer_closed()
            return False
        return True

    def trickle(self, data: bytes, interval: float) -> bool:
        """Send `data` one byte per `interval`; False as soon as the peer is gone."""
        return all(self.send(data[i : i + 1]) and self.wait(interval) for i in range(len(data)))

    def reset(self) -> None:
        """Close with a TCP RST instead of a FIN (``SO_LINGER`` on, timeout 0)."""
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


def response_head(status: int = 200, *, length: int, extra: str = "") -> bytes:
    """An HTTP/1.1 status line and headers announcing a body of `length` bytes."""
    reason = _REASONS.get(status, "Unknown")
    return (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {length}\r\n{extra}\r\n"
    ).encode("latin-1")


class Server:
    """Base class: a loopback listener whose connections are handled in threads.

    Subclasses implement `handle(conn)`. Start and stop with ``with`` (or `start` /
    `stop`); stopping closes every socket and joins every thread.
    """

    scheme: ClassVar[str] = "http"

    def __init__(self) -> None:
        self.host = "127.0.0.1"
        self.port = 0
        self.opened = 0
        self.closed = 0
        self.peer_closed = 0
        self.close_times: list[float] = []
        self.requests: list[Request] = []
        self._listener: socket.socket | None = None
        self._threads: list[threading.Thread] = []
        self._sockets: set[socket.socket] = set()
        self._stop = threading.Event()
        self._changed = threading.Condition()

    # Life cycle.

    @property
    def url(self) -> str:
        """The base URL, e.g. ``http://127.0.0.1:40123``."""
        return f"{self.scheme}://{self.host}:{self.port}"

    @property
    def stopping(self) -> bool:
        """Whether `stop` was called."""
        return self._stop.is_set()

    @property
    def active(self) -> int:
        """Connections accepted and not yet closed."""
        return self.opened - self.closed

    def _listen(self, backlog: int) -> socket.socket:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((self.host, 0))
        listener.listen(backlog)
        self.port = listener.getsockname()[1]
        self._listener = listener
        return listener

    def start(self) -> None:
        """Listen and start accepting in a background thread."""
        listener = self._listen(128)
        listener.settimeout(_POLL)
        self._spawn(self._accept_loop, listener)

    def stop(self) -> None:
        """Close the listener and every connection, and join all threads."""
        self._stop.set()
        if self._listener is not None:
            self._listener.close()
        for thread in list(self._threads):
            thread.join(timeout=5.0)
        with self._changed:
            for sock in list(self._sockets):
                sock.close()
            self._sockets.clear()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        thread.name = f"{type(self).__name__}:{self.port}"
        self._threads.append(thread)
        thread.start()

    def _accept_loop(self, listener: socket.socket) -> None:
        while not self._stop.is_set():
            try:
                sock, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # listener closed by stop()
            sock.setblocking(True)
            with self._changed:
                self.opened += 1
                self._sockets.add(sock)
                self._changed.notify_all()
            self._spawn(self._serve, sock)

    def _serve(self, sock: socket.socket) -> None:
        conn = Connection(sock, self)
        try:
            self.handle(conn)
        except OSError as exc:
            if exc.errno in (errno.ECONNRESET, errno.EPIPE):
                conn._peer_closed()
        finally:
            sock.close()
            with self._changed:
                self._sockets.discard(sock)
                self.closed += 1
                self._changed.notify_all()

    def handle(self, conn: Connection) -> None:
        """Serve one connection; return to close it. Subclasses override this."""
        raise NotImplementedError

    # What the server saw.

    def _record(self, request: Request) -> None:
        with self._changed:
            self.requests.append(request)
            self._changed.notify_all()

    def _count_peer_closed(self) -> None:
        with self._changed:
            self.peer_closed += 1
            self.close_times.append(time.monotonic())
            self._changed.notify_all()

    def _wait_until(self, ready: object, timeout: float) -> bool:
        with self._changed:
            return self._changed.wait_for(ready, timeout=timeout)  # type: ignore[arg-type]

    def wait_opened(self, count: int, timeout: float = 2.0) -> bool:
        """Wait until `count` connections were accepted in all; False on timeout."""
        return self._wait_until(lambda: self.opened >= count, timeout)

    def wait_peer_closed(self, count: int, timeout: float = 2.0) -> bool:
        """Wait until the peer closed `count` connections in all; False on timeout."""
        return self._wait_until(lambda: self.peer_closed >= count, timeout)

    def wait_requests(self, count: int, timeout: float = 2.0) -> bool:
        """Wait until `count` requests arrived in all; False on timeout."""
        return self._wait_until(lambda: len(self.requests) >= count, timeout)

    def wait_idle(self, timeout: float = 2.0) -> bool:
        """Wait until no connection is open on the server side; False on timeout."""
        return self._wait_until(lambda: self.opened == self.closed, timeout)


class HealthyServer(Server):
    """Answers every request at once with `status` and `body`, keeping connections alive."""

    def __init__(self, *, status: int = 200, body: bytes = b"ok") -> None:
        super().__init__()
        self.status = status
        self.body = body

    def handle(self, conn: Connection) -> None:
        """Answer requests until the client closes the connection."""
        while (request := conn.read_request()) is not None:
            if request.method == "HEAD":
                conn.send(response_head(self.status, length=len(self.body)))
            elif not conn.send(response_head(self.status, length=len(self.body)) + self.body):
                return


class SlowServer(HealthyServer):
    """Answers each request after `delay` seconds (time to first byte), keep-alive.

    The wait ends early when the client closes the connection, as a server that
    notices its caller left would.
    """

    def __init__(self, delay: float = 1.0, *, status: int = 200, body: bytes = b"ok") -> None:
        super().__init__(status=status, body=body)
        self.delay = delay

    def handle(self, conn: Connection) -> None:
        """Wait `delay`, then answer; until the client closes the connection."""
        while (request := conn.read_request()) is not None:
            if not conn.wait(self.delay):
                return
            payload = b"" if request.method == "HEAD" else self.body
            if not conn.send(response_head(self.status, length=len(self.body)) + payload):
                return


class SilentServer(Server):
    """Accepts connections and reads whatever arrives, but never sends a byte."""

    def handle(self, conn: Connection) -> None:
        """Read (and record) requests until the client closes the connection."""
        while conn.read_request() is not None:
            pass


class TLSNeverServer(SilentServer):
    """A plain TCP server reached with ``https://``: the TLS handshake never completes.

    It reads the client's ClientHello and never answers, like a process that accepts
    connections but is wedged. `url` starts with ``https://``.
    """

    scheme: ClassVar[str] = "https"


class HeaderTrickleServer(Server):
    """Reads the request, then sends the status line and headers one byte per `interval`.

    The head is padded so that it never completes while a client waits: a per-read
    idle timer never fires; only a limit on the whole wait for headers does.
    """

    def __init__(self, interval: float = 1.0) -> None:
        super().__init__()
        self.interval = interval

    def handle(self, conn: Connection) -> None:
        """Trickle an endless-looking head until the client leaves."""
        if conn.read_request() is None:
            return
        head = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Padding: " + b"." * 100_000
        if conn.trickle(head, self.interval):
            conn.wait(math.inf)


class TrickleServer(Server):
    """Sends the headers at once, then the body one byte per `interval`.

    The declared body (`length` bytes) takes ``length * interval`` seconds: an idle
    timer that restarts on every byte never fires; only a total limit stops it.
    """

    def __init__(self, interval: float = 1.0, *, length: int = 100_000) -> None:
        super().__init__()
        self.interval = interval
        self.length = length

    def handle(self, conn: Connection) -> None:
        """Answer the first request with a trickled body, then wait for the client."""
        if conn.read_request() is None:
            return
        if conn.send(response_head(200, length=self.length)) and conn.trickle(
            b"x" * self.length, self.interval
        ):
            conn.wait(math.inf)


class ResetServer(Server):
    """Sends the headers and `sent` of the announced `length` body bytes, then a TCP RST.

    With `pause` > 0 it waits that long between the partial body and the reset, so a
    client is mid-body when the connection breaks.
    """

    def __init__(self, *, sent: int = 100, length: int = 10_000, pause: float = 0.05) -> None:
        super().__init__()
        if sent >= length:
            raise ValueError(f"sent ({sent}) must be less than length ({length})")
        self.sent = sent
        self.length = length
        self.pause = pause

    def handle(self, conn: Connection) -> None:
        """Answer part of the first request's body, then reset the connection."""
        if conn.read_request() is None:
            return
        if conn.send(response_head(200, length=self.length) + b"x" * self.sent) and conn.wait(
            self.pause
        ):
            conn.reset()


class BlackholeServer(Server):
    """A loopback address where TCP connects hang: the listener's accept queue is full.

    It listens with backlog 0 and never accepts; one filler connection occupies the
    queue, so Linux drops every later SYN (as a dead host behind a firewall does) and
    the client retransmits until its connect timeout. Starting checks that a probe
    connect really hangs and raises `RuntimeError` if this kernel answers instead.
    Nothing is ever accepted, so `opened` stays 0.
    """

    _PROBE = 0.2  # a loopback connect finishes in microseconds; 200 ms means dropped

    def __init__(self) -> None:
        super().__init__()
        self._fillers: list[socket.socket] = []

    def start(self) -> None:
        """Listen, fill the accept queue, and check that the next connect hangs."""
        self._listen(0)
        for _ in range(8):  # the queue holds backlog + 1 on Linux; bounded either way
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            sock.connect_ex((self.host, self.port))
            _, writable, _ = select.select([], [sock], [], self._PROBE)
            if not writable:
                sock.close()  # this SYN was dropped: the queue is full
                return
            self._fillers.append(sock)
        self.stop()
        raise RuntimeError("cannot make a loopback blackhole: the accept queue never filled")

    def stop(self) -> None:
        """Close the fillers and the listener (later SYNs are then refused)."""
        for sock in self._fillers:
            sock.close()
        self._fillers.clear()
        super().stop()

    def handle(self, conn: Connection) -> None:  # pragma: no cover - never accepts
        """Never called: nothing is accepted."""


#: Every server by its lab name.
SERVERS: dict[str, type[Server]] = {
    "healthy": HealthyServer,
    "slow": SlowServer,
    "silent": SilentServer,
    "header-trickle": HeaderTrickleServer,
    "trickle": TrickleServer,
    "reset": ResetServer,
    "tls-never": TLSNeverServer,
    "blackhole": BlackholeServer,
}
