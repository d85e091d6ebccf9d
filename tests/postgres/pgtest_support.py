"""Helpers for the Postgres tests: pg_stat_activity checks, a freezable proxy."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from typing import Any

import psycopg
import pytest

from testservers import Postgres


def backends(admin: psycopg.Connection[tuple[object, ...]], name: str) -> list[tuple[object, ...]]:
    """(pid, state, query) of every backend with application_name `name`."""
    return admin.execute(
        "SELECT pid, state, query FROM pg_stat_activity WHERE application_name = %s", (name,)
    ).fetchall()


def running(admin: psycopg.Connection[tuple[object, ...]], name: str) -> list[str]:
    """Statements still running (state active) on backends named `name`."""
    return [str(q) for _, state, q in backends(admin, name) if state == "active"]


def wait_running(
    admin: psycopg.Connection[tuple[object, ...]],
    name: str,
    *,
    statement: str = "pg_sleep(",
    within: float = 3.0,
) -> None:
    """Block until a backend named `name` is running a statement containing `statement`.

    Not just any statement: a transaction's BEGIN and SET LOCAL run first, and a test
    that acts on seeing them acts before the block it means to interrupt has begun.
    """
    end = time.monotonic() + within
    while not any(statement in query for query in running(admin, name)):
        assert time.monotonic() < end, f"no statement with {statement!r} started"
        time.sleep(0.01)


async def cancelled_after(task: asyncio.Task[Any]) -> float:
    """Cancel `task`, check that it ends cancelled, and return the seconds that took."""
    start = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return time.monotonic() - start


class Proxy:
    """A TCP proxy on loopback in front of Postgres, in its own thread.

    `freeze()` makes it accept new connections and never answer them (a silent
    listener): a cancel request sent through it hangs, while connections opened
    before keep forwarding. `stall()` also stops those: what they send from then on
    is dropped (counted in `dropped`), so the statement sent next is never answered.
    """

    def __init__(self, target: Postgres) -> None:
        self.target = target
        self.frozen = False
        self.stalled = False
        self.held = 0
        self.dropped = 0
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self._thread = threading.Thread(target=self._run, name="pg-proxy", daemon=True)

    def start(self) -> Proxy:
        self._thread.start()
        assert self._ready.wait(5), "proxy did not start"
        return self

    def freeze(self) -> None:
        self.frozen = True

    def stall(self) -> None:
        self.frozen = self.stalled = True

    async def wait_dropped(self) -> None:
        """Wait until a stalled proxy has dropped what the client sent next."""
        end = time.monotonic() + 3
        while not self.dropped and time.monotonic() < end:
            await asyncio.sleep(0.01)
        assert self.dropped, "nothing was sent through the stalled proxy"
        await asyncio.sleep(0.05)  # the client is now waiting for the answer

    @property
    def postgres(self) -> Postgres:
        """The server as reached through the proxy."""
        return dataclasses.replace(self.target, host="127.0.0.1", port=self.port)

    def dsn(self, app: str) -> str:
        return f"{self.postgres.dsn} application_name={app}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._serve())
        self._loop.run_forever()
        self._loop.close()

    async def _serve(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        if self.frozen:  # silent: read and drop, never answer, never close
            self.held += 1
            with contextlib.suppress(Exception):
                while await reader.read(65536):
                    pass
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.target.host, self.target.port)
        except OSError:
            writer.close()
            return
        self._writers.add(up_writer)
        await asyncio.gather(
            self._pipe(reader, up_writer), self._pipe(up_reader, writer), return_exceptions=True
        )

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                if self.stalled:
                    self.dropped += len(data)
                    continue
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._writers):
                w.transport.abort()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await asyncio.sleep(0.01)  # let the aborted transports finish closing
            self._loop.stop()

        asyncio.run_coroutine_threadsafe(stop(), self._loop)
        self._thread.join(5)
        assert not self._thread.is_alive(), "proxy thread did not stop"
