"""Name resolution for the blocking transport, each wait bounded by the caller (`Resolver`)."""

from __future__ import annotations

import ipaddress
import socket
import threading

from .. import _clock
from ._lib import httpcore


def is_ip(host: str) -> bool:
    """Whether `host` is an IP literal, which needs no name resolution."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class Lookup:
    """One `getaddrinfo` running in its thread; its answer or error once `done` is set."""

    __slots__ = ("addresses", "done", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.addresses: list[str] = []
        self.error: OSError | None = None


class Resolver:
    """Name resolution for the blocking transport, each wait bounded by the caller.

    A blocking ``getaddrinfo`` cannot be interrupted, and `socket.create_connection`
    calls it with no timeout: a hung resolver held a call for as long as the system
    resolver retries (glibc: 5 s × 2 attempts per nameserver by default). Here each
    lookup runs in a daemon thread and the caller waits for it at most what is left of
    its connect window. A lookup abandoned that way runs on until the system resolver
    gives up, then its thread ends and its answer is dropped (nothing is cached). Hung
    lookups cannot pile up: a caller asking for a name and port already being looked up
    waits for that lookup instead of starting another, and at most `max_lookups` run at
    once (a caller beyond that waits for a place, inside its own window).
    """

    def __init__(self, max_lookups: int) -> None:
        self._lock = threading.Lock()
        self._places = threading.BoundedSemaphore(max_lookups)
        self._running: dict[tuple[str, int], Lookup] = {}
        #: Lookups started so far (for tests: an IP literal starts none).
        self.started = 0

    def resolve(self, host: str, port: int, timeout: float) -> list[str]:
        """The addresses of `host`, in the resolver's order; ``ConnectTimeout`` after `timeout`."""
        end = _clock.now() + timeout
        lookup = self._lookup(host, port, timeout)
        if lookup is None or not lookup.done.wait(max(0.0, end - _clock.now())):
            raise httpcore.ConnectTimeout(
                f"resolving {host!r} took longer than the {timeout * 1000:.0f} ms left to connect"
            )
        if lookup.error is not None:
            raise httpcore.ConnectError(str(lookup.error)) from lookup.error
        return lookup.addresses

    def _lookup(self, host: str, port: int, timeout: float) -> Lookup | None:
        """The running lookup of (`host`, `port`), started if needed; None: no place in time."""
        key = (host, port)
        with self._lock:
            lookup = self._running.get(key)
        if lookup is not None:
            return lookup
        if not self._places.acquire(timeout=timeout):
            return None
        with self._lock:
            lookup = self._running.get(key)
            if lookup is not None:  # started by another caller meanwhile
                self._places.release()
                return lookup
            lookup = self._running[key] = Lookup()
            self.started += 1
        thread = threading.Thread(
            target=self._run, args=(key, lookup), name="deadlines-resolve", daemon=True
        )
        try:
            thread.start()
        except BaseException:
            self._done(key, lookup)
            raise
        return lookup

    def _run(self, key: tuple[str, int], lookup: Lookup) -> None:
        try:
            infos = socket.getaddrinfo(*key, type=socket.SOCK_STREAM)
            lookup.addresses = list(dict.fromkeys(str(info[4][0]) for info in infos))
        except OSError as exc:
            lookup.error = exc
        finally:
            self._done(key, lookup)

    def _done(self, key: tuple[str, int], lookup: Lookup) -> None:
        with self._lock:
            del self._running[key]
        self._places.release()
        lookup.done.set()


#: Distinct names the blocking transports may be resolving at once, hung ones included.
MAX_LOOKUPS = 16
resolver = Resolver(MAX_LOOKUPS)
