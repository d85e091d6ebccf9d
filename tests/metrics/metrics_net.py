"""Helpers for the metrics tests: read a Prometheus exposition, serve an app, wait.

The misbehaving servers are the lab's (`deadlines.lab.servers`) and the client is
`deadlines.httpx`, so what is measured is what users run.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


async def until(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Wait without blocking the loop until `predicate()` holds; fail after `timeout` s."""
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, f"{what} did not happen within {timeout} s"
        await asyncio.sleep(0.005)


def scrape(registry: CollectorRegistry) -> Samples:
    """Every sample in the registry's text exposition, keyed by (name, sorted labels)."""
    return parse(generate_latest(registry).decode())


def parse(text: str) -> Samples:
    """Every sample in a Prometheus text exposition, keyed by (name, sorted labels)."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    """The sample `name` with exactly `labels`, or None when it is not exported."""
    return samples.get((name, tuple(sorted(labels.items()))))


@contextlib.contextmanager
def serve_uvicorn(app: Any) -> Iterator[int]:
    """Serve an ASGI app with uvicorn in its own thread on loopback; yields the port."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    config = uvicorn.Config(app, lifespan="off", log_level="critical", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        end = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < end and thread.is_alive(), "uvicorn did not start"
            time.sleep(0.005)
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop"
