"""Real server processes for the lab: start `python -m deadlines.lab.<app>`, stop by PID.

Each app binds its own free loopback port (port 0) and announces it on stdout
(``READY {json}``), so there is no race for a port. `Processes` is a context manager:
on exit — normal, error or Ctrl-C — every child it started is terminated, then killed
if it lingers, and reaped. Children also exit by themselves if this process dies.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import IO, Any

from ._app import READY


class AppFailed(RuntimeError):
    """A lab app did not start: it exited or did not announce readiness in time."""


@dataclass
class Child:
    """One running app process and what it announced (ports, ...)."""

    name: str
    process: subprocess.Popen[bytes]
    info: dict[str, Any]
    _stderr: IO[bytes] = field(repr=False)
    _buffer: bytes = field(default=b"", repr=False)

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.process.pid

    @property
    def port(self) -> int:
        """The port the app listens on."""
        return int(self.info["port"])

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"

    def lines(self, until: float) -> Iterator[str]:
        """Further lines from the child's stdout until it closes or `until` (monotonic)."""
        for _, line in read_lines([self], until):
            yield line

    def stderr_text(self) -> str:
        """What the child wrote on stderr so far (for error messages)."""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    def stop(self, *, grace: float = 3.0) -> None:
        """Terminate (SIGTERM), kill after `grace` seconds, and reap."""
        proc = self.process
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(grace)
        if proc.stdout is not None:
            proc.stdout.close()
        self._stderr.close()


def read_lines(children: Sequence[Child], until: float) -> Iterator[tuple[Child, str]]:
    """Lines from several children's stdout as they come, until all close or `until`."""
    with selectors.DefaultSelector() as sel:
        for child in children:
            assert child.process.stdout is not None
            sel.register(child.process.stdout, selectors.EVENT_READ, child)
        while True:
            for child in children:
                while b"\n" in child._buffer:
                    line, child._buffer = child._buffer.split(b"\n", 1)
                    yield child, line.decode(errors="replace")
            left = until - time.monotonic()
            if left <= 0 or not sel.get_map():
                return
            for key, _ in sel.select(left):
                owner: Child = key.data
                chunk = os.read(key.fd, 65536)
                if chunk:
                    owner._buffer += chunk
                else:
                    sel.unregister(key.fileobj)


class Processes:
    """Starts lab apps as child processes and guarantees they are all stopped.

    with Processes() as procs:
        downstream = procs.start("cascade.downstream")
        ...                      # downstream.url, downstream.pid
    """

    def __init__(self, *, ready_timeout: float = 30.0) -> None:
        """`ready_timeout`: seconds an app may take to import and listen."""
        self.ready_timeout = ready_timeout
        self.children: list[Child] = []

    def start(self, app: str, *args: str) -> Child:
        """Start ``python -m deadlines.lab.<app> ARGS`` and wait until it listens."""
        return self.start_all([(app, list(args))])[0]

    def start_all(self, specs: Sequence[tuple[str, Sequence[str]]]) -> list[Child]:
        """Start several apps at once (their imports overlap), then wait for each."""
        children = [self._spawn(app, args) for app, args in specs]
        for child in children:
            child.info = self._wait_ready(child)
        return children

    def _spawn(self, app: str, args: Sequence[str]) -> Child:
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 - the Child owns and closes it
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = subprocess.Popen(
            [sys.executable, "-m", f"deadlines.lab.{app}", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=env,
            start_new_session=True,  # Ctrl-C reaches the lab only; the lab stops the children
        )
        child = Child(app, proc, {}, stderr)
        self.children.append(child)
        return child

    def _wait_ready(self, child: Child) -> dict[str, Any]:
        proc = child.process
        assert proc.stdout is not None
        end = time.monotonic() + self.ready_timeout
        buffer = b""
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while b"\n" not in buffer:
                left = end - time.monotonic()
                if left <= 0:
                    raise AppFailed(f"{child.name} did not start in {self.ready_timeout} s")
                if not sel.select(left):
                    continue
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    proc.wait(5)
                    raise AppFailed(
                        f"{child.name} exited with {proc.returncode}:\n{child.stderr_text()}"
                    )
                buffer += chunk
        first, child._buffer = buffer.split(b"\n", 1)
        line = first.decode()
        if not line.startswith(READY):
            raise AppFailed(f"{child.name} said {line!r} instead of {READY.strip()}")
        info: dict[str, Any] = json.loads(line[len(READY) :])
        return info

    def stop_all(self) -> None:
        """Stop every child: SIGTERM to all at once, then wait for (or kill) each."""
        for child in self.children:
            if child.process.poll() is None:
                with contextlib.suppress(OSError):
                    child.process.terminate()
        for child in reversed(self.children):
            with contextlib.suppress(Exception):
                child.stop()
        self.children.clear()

    def __enter__(self) -> Processes:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_all()
