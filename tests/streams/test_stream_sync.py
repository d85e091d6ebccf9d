"""`streams.guard_sync`: the same limits over blocking iterables, enforced from a helper thread."""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from llm_stream_server import Registry

import deadlines
from deadlines import streams

pytestmark = pytest.mark.realtime


class Blocking:
    """A blocking source: items after `delays` (time.sleep), records being closed."""

    def __init__(self, delays: list[float]) -> None:
        self.delays = delays
        self.closed = threading.Event()
        self.seen_remaining: list[float] = []

    def __iter__(self) -> Iterator[int]:
        try:
            for number, delay in enumerate(self.delays, 1):
                time.sleep(delay)
                self.seen_remaining.append(deadlines.remaining())
                yield number
        finally:
            self.closed.set()


def test_healthy_source_passes_through_with_the_deadline_inside() -> None:
    """Items come through in order; the source runs in the caller's context (deadline seen)."""
    source = Blocking([0.01, 0.01, 0.01])
    with deadlines.scope(5):
        assert list(streams.guard_sync(source, first=1, idle=1, total=5)) == [1, 2, 3]
    assert source.closed.wait(1)
    assert all(0 < left <= 5 for left in source.seen_remaining)


def test_blocked_first_read_raises_at_the_instant() -> None:
    """A source blocked in its first read: FirstItemTimeout at `first`, not when it returns."""
    source = Blocking([0.8])
    started = time.monotonic()
    with pytest.raises(streams.FirstItemTimeout):
        list(streams.guard_sync(source, first=0.2, idle=1, total=5))
    assert 0.19 <= time.monotonic() - started <= 0.6
    assert source.closed.wait(2)  # closed by the helper once its read returned


def test_idle_and_total_limits() -> None:
    """A mid-stream stall raises StreamIdleTimeout; a trickle is stopped by TotalTimeout."""
    items: list[int] = []
    with pytest.raises(streams.StreamIdleTimeout):
        for item in streams.guard_sync(Blocking([0.01, 0.01, 0.6]), first=1, idle=0.2, total=5):
            items.append(item)
    assert items == [1, 2]
    started = time.monotonic()
    with pytest.raises(deadlines.TotalTimeout):
        list(streams.guard_sync(Blocking([0.05] * 100), first=1, idle=1, total=0.4))
    assert 0.39 <= time.monotonic() - started <= 0.9


def test_request_deadline_binds() -> None:
    """The current deadline caps the stream like in the async form (DeadlineExceeded)."""
    with pytest.raises(deadlines.DeadlineExceeded), deadlines.scope(0.3):
        list(streams.guard_sync(Blocking([0.05] * 100), first=1, idle=1, total=30))


def test_break_closes_the_source() -> None:
    """Stopping early closes the source generator (on the helper thread)."""
    source = Blocking([0.01] * 100)
    guarded = streams.guard_sync(source, first=1, idle=1, total=5)
    for item in guarded:
        if item == 2:
            break
    guarded.close()
    assert source.closed.wait(1)


def test_source_errors_reach_the_caller() -> None:
    """An exception raised by the source is raised to the caller unchanged."""

    def broken() -> Iterator[int]:
        yield 1
        raise ConnectionResetError("reset by peer")

    with pytest.raises(ConnectionResetError, match="reset by peer"):
        list(streams.guard_sync(broken(), first=1, idle=1, total=5))


def test_invalid_limits_are_rejected() -> None:
    """Bad limits raise ValueError when guard_sync() is called."""
    with pytest.raises(ValueError, match="idle must be finite"):
        streams.guard_sync([1], first=1, idle=math.inf, total=1)


def shutdown_socket(response: Any) -> Callable[[], None]:
    """The `close` recipe for an httpx sync stream: shut the socket down, waking the reader."""

    def close() -> None:
        sock = response.extensions["network_stream"].get_extra_info("socket")
        sock.shutdown(socket.SHUT_RDWR)

    return close


def test_httpx_sync_stream_is_interrupted_and_closed(llm: tuple[str, Registry]) -> None:
    """An httpx sync stream that stalls: error at the instant, the server sees the close."""
    import httpx

    url, registry = llm
    test_id = "sync-" + str(time.monotonic_ns())
    body = {"model": "stall-first", "messages": [], "stream": True}
    with (
        httpx.Client(trust_env=False, timeout=httpx.Timeout(10.0)) as client,
        client.stream(
            "POST", f"{url}/v1/chat/completions", json=body, headers={"x-test-id": test_id}
        ) as response,
    ):
        started = time.monotonic()
        with pytest.raises(streams.FirstItemTimeout):
            for _ in streams.guard_sync(
                response.iter_lines(), first=0.3, idle=1, total=5, close=shutdown_socket(response)
            ):
                pass
        assert 0.29 <= time.monotonic() - started <= 0.8
        closed_at = registry.wait_closed(test_id)
        assert closed_at is not None and closed_at - started <= 1.0
