"""Generate the blocking half of deadlines.httpx from its async half.

    python scripts/unasync.py          # write src/deadlines/httpx/_sync/*.py
    python scripts/unasync.py --check  # exit 1 if they differ from what would be written

The async pool, transport and client (``_async/``) are the source; each blocking module
is the same code with ``async``/``await`` removed and ``AsyncX`` names renamed to ``X``
(the pairs that cannot be renamed are written by hand in ``_primitives.py`` and
``_backend.py``); a line ending in ``# async only`` is left out (hedging: a blocking call
cannot be cancelled). The output is formatted with ruff, as the rest of the code is.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "deadlines" / "httpx"
MODULES = ("pool.py", "transport.py", "bounded.py", "client.py")

#: (pattern, replacement), applied in order to every line.
RULES = [
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"\bAsyncByteStream\b", "SyncByteStream"),
    (r"\bAsyncBaseTransport\b", "BaseTransport"),
    (r"\bhandle_async_request\b", "handle_request"),
    (r"\b_aclose_response\b", "_close_response"),
    (r"\baclose\b", "close"),
    (r"\b__aiter__\b", "__iter__"),
    (r"\b__anext__\b", "__next__"),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\bStopAsyncIteration\b", "StopIteration"),
    (r"\basync_trace\b", "sync_trace"),
    (r"\babandon_async\b", "abandon_sync"),
    (r"\brun_async\b", "run_sync"),
    (r"\bAsync([A-Z]\w*)", r"\1"),
    (r"\bAwaitable\[([\w.]+)\]", r"\1"),
    (r"^(from collections\.abc import .*)\bAwaitable, ", r"\1"),
]
_COMPILED = [(re.compile(pattern), replacement) for pattern, replacement in RULES]


#: Ends a line that only the async half has (hedging: a blocking call cannot be cancelled).
ASYNC_ONLY = "# async only"


def unasync(source: str, name: str) -> str:
    """The blocking module for the async module `source` (named `name` in ``_async/``)."""
    lines = []
    for line in source.splitlines(keepends=True):
        if line.rstrip().endswith(ASYNC_ONLY):
            continue
        for pattern, replacement in _COMPILED:
            line = pattern.sub(replacement, line)
        lines.append(line)
    header = f"# Generated from _async/{name} by scripts/unasync.py: edit that file, not this.\n"
    return _format(header + "".join(lines), name)


def _format(text: str, name: str) -> str:
    """`text` with its imports sorted and formatted, as ruff leaves the project's code."""
    for step in (["check", "--select", "I", "--fix", "--quiet"], ["format"]):
        text = _ruff(step, text, name)
    return text


def _ruff(step: list[str], text: str, name: str) -> str:
    target = PACKAGE / "_sync" / name  # ruff finds the project's settings from it
    command = [sys.executable, "-m", "ruff", *step, "--stdin-filename", str(target), "-"]
    done = subprocess.run(command, input=text, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"ruff {step[0]} failed on _sync/{name}: {done.stderr.strip()}")
    return done.stdout


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check`` compare) every generated module; 1 when one differs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    stale = []
    for name in MODULES:
        wanted = unasync((PACKAGE / "_async" / name).read_text(), name)
        target = PACKAGE / "_sync" / name
        if target.exists() and target.read_text() == wanted:
            continue
        if args.check:
            stale.append(name)
        else:
            target.write_text(wanted)
            print(f"wrote {target.relative_to(PACKAGE.parent.parent.parent)}")
    if stale:
        print(
            f"_sync/ differs from _async/ for {', '.join(stale)}: run `python scripts/unasync.py`",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
