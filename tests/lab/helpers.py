"""Helpers for the lab tests: run `deadlines lab` as a user would, find what it left."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Environment variable that marks every process a test's lab run starts (children inherit it).
TOKEN_VAR = "DEADLINES_LAB_TEST_TOKEN"


def processes_with(token: str) -> list[int]:
    """PIDs of live processes whose environment carries `token` (Linux /proc)."""
    found = []
    needle = f"{TOKEN_VAR}={token}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                environ = fh.read()
            with open(f"/proc/{entry}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if needle in environ.split(b"\0") and state != b"Z":
            found.append(int(entry))
    return found


@dataclass
class LabRun:
    """A finished `deadlines lab ...` subprocess."""

    returncode: int
    stdout: str
    stderr: str
    token: str


def run_lab(args: list[str], *, timeout: float) -> LabRun:
    """Run `python -m deadlines lab ARGS` with a fresh token; fail on a timeout."""
    token = uuid.uuid4().hex
    env = dict(os.environ, **{TOKEN_VAR: token})
    proc = subprocess.run(
        [sys.executable, "-m", "deadlines", "lab", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )
    return LabRun(proc.returncode, proc.stdout, proc.stderr, token)


@dataclass
class QuickAll:
    """`deadlines lab --quick`: its run, JSON and report."""

    run: LabRun
    data: dict[str, Any]
    report: Path
