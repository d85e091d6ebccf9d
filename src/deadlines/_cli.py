"""The command line's shared rules: exit codes, one-line errors, output files.

Every subcommand exits 0 when all is well, 1 when it found what it looks for
(violations, findings), 2 for bad usage or bad input, and 3 for a bug in deadlines
(with its traceback). Bad input is reported in one line on stderr that names the file
or flag, the field, and the values accepted; it is found before any work starts.
docs/cli.md is the user's page for these rules.
"""

from __future__ import annotations

import os
from pathlib import Path

OK = 0
FINDINGS = 1
USAGE = 2
BUG = 3
#: The reader of stdout went away (``| head``): 128 + SIGPIPE, as a shell reports it.
PIPE_CLOSED = 141


class UsageError(Exception):
    """Bad usage or bad input: its message is the one line the user reads (exit 2)."""


def output_file(path: str | Path, flag: str) -> Path:
    """Check, before any work, that `path` can be written as a file; return it.

    Missing parent directories are fine (they are created when the file is written);
    a path that is a directory, under a file, or in a directory that cannot be written
    raises `UsageError`.
    """
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{flag} {path}: is a directory; expected a file name")
    parent = target.absolute().parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: cannot write in {parent}")
    return target


def missing_modules(names: tuple[str, ...]) -> list[str]:
    """Which of the top-level modules `names` cannot be imported here."""
    import importlib.util

    absent = []
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            absent.append(name)
    return absent
