"""A progress display on stderr: which experiment runs, elapsed against expected.

On a terminal one line is redrawn twice a second; elsewhere (CI, a pipe) a line is
printed when a step starts and when it ends, so logs stay readable.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO


class Progress:
    """Shows the current step; `quiet=True` shows nothing."""

    def __init__(self, stream: TextIO | None = None, *, quiet: bool = False) -> None:
        """Write to `stream` (stderr by default)."""
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._started = time.monotonic()

    @contextmanager
    def step(self, label: str, expected: float) -> Iterator[None]:
        """Show `label` with elapsed/expected seconds while the block runs."""
        if self.quiet:
            yield
            return
        start = time.monotonic()
        stop = threading.Event()
        thread: threading.Thread | None = None
        if self.tty:
            thread = threading.Thread(
                target=self._redraw, args=(label, expected, start, stop), daemon=True
            )
            thread.start()
        else:
            self._line(f"[lab] {label}: started (about {expected:.0f} s)")
        try:
            yield
        finally:
            stop.set()
            if thread is not None:
                thread.join()
            took = time.monotonic() - start
            total = time.monotonic() - self._started
            if self.tty:
                self.stream.write("\r\033[K")
            self._line(f"[lab] {label}: done in {took:.1f} s (lab total {total:.0f} s)")

    def note(self, text: str) -> None:
        """Print a line of its own."""
        if not self.quiet:
            self._line(f"[lab] {text}")

    def _line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def _redraw(self, label: str, expected: float, start: float, stop: threading.Event) -> None:
        while not stop.wait(0.5):
            elapsed = time.monotonic() - start
            width = 24
            filled = min(width, int(width * elapsed / expected)) if expected > 0 else 0
            bar = "#" * filled + "." * (width - filled)
            self.stream.write(f"\r\033[K[lab] {label} [{bar}] {elapsed:4.1f} s / ~{expected:.0f} s")
            self.stream.flush()
