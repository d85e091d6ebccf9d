"""Run `deadlines ...` as a user would, optionally with some modules made unimportable."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# Hides the modules named in DEADLINES_TEST_HIDE (comma-separated) before the CLI starts,
# as if their package were not installed, then runs the command line.
_RUN = (
    "import os, sys\n"
    "for name in filter(None, os.environ.get('DEADLINES_TEST_HIDE', '').split(',')):\n"
    "    sys.modules[name] = None\n"
    "from deadlines.__main__ import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


@dataclass
class Run:
    """A finished `deadlines` process."""

    code: int
    stdout: str
    stderr: str
    seconds: float


def deadlines(
    args: list[str], *, cwd: Path, hide: tuple[str, ...] = (), timeout: float = 120
) -> Run:
    """Run `deadlines ARGS` in `cwd`; `hide` makes those modules unimportable."""
    env = dict(os.environ, DEADLINES_TEST_HIDE=",".join(hide))
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", _RUN, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        env=env,
        check=False,
    )
    return Run(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)
