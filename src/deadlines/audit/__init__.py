"""Static audit: find the unbounded waits in a Python code base.

    findings = deadlines.audit.audit_paths(["src"])
    for f in findings:
        print(f)                      # path:line:col DLN101 message

Each rule (`RULES`, codes ``DLN101``-``DLN109``) is a wait from the reference
chapter's checklist: HTTP without a timeout, a read timeout mistaken for a total on a
streamed body, thread futures and ``asyncio.wait`` that leave work running, database
pools without acquire or statement limits, sockets without timeouts, httpx clients
with per-phase limits only. From the command line: ``deadlines audit PATH...``; in
flake8 through the ``DLN`` plugin; in pre-commit as the ``deadlines-audit`` hook.
`docs/audit.md` documents every rule.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.util
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from . import _suppress
from ._checker import Checker
from ._rules import RULES, Rule

__all__ = [
    "DEFAULT_EXCLUDE",
    "RULES",
    "AuditError",
    "Finding",
    "Rule",
    "audit_file",
    "audit_paths",
    "audit_source",
    "python_files",
]

#: Directory names never searched when a directory is given.
DEFAULT_EXCLUDE: tuple[str, ...] = (
    ".git",
    ".hg",
    ".tox",
    ".nox",
    ".venv",
    "venv",
    "__pycache__",
    "node_modules",
    "build",
    "dist",
    "site-packages",
    ".mypy_cache",
    ".ruff_cache",
)


@dataclass(frozen=True, slots=True, order=True)
class Finding:
    """One unbounded wait: where (1-based line and column), which rule, and why."""

    path: str
    line: int
    col: int
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col} {self.code} {self.message}"

    def as_dict(self) -> dict[str, Any]:
        """``{path, line, col, code, message}`` for JSON."""
        return asdict(self)


class AuditError(Exception):
    """A file could not be read or parsed."""


def audit_source(
    source: str,
    path: str = "<string>",
    *,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] = (),
) -> list[Finding]:
    """Findings in Python `source`, after suppression comments; raises `AuditError`.

    `select` and `ignore` take codes or prefixes (``DLN1``).
    """
    try:
        tree = ast.parse(source, filename=path)
    except SyntaxError as exc:
        raise AuditError(f"{path}:{exc.lineno or 0}: cannot parse: {exc.msg}") from exc
    return _filter(Checker(tree).run(), source, path, select, ignore)


def _filter(
    raws: Iterable[Any],
    source: str,
    path: str,
    select: Iterable[str] | None,
    ignore: Iterable[str],
) -> list[Finding]:
    chosen = tuple(select) if select is not None else ("DLN",)
    dropped = tuple(ignore)
    silenced = _suppress.comments(source)
    findings = []
    for raw in raws:
        node = raw.node
        if not raw.code.startswith(chosen) or (dropped and raw.code.startswith(dropped)):
            continue
        lines = range(node.lineno, (node.end_lineno or node.lineno) + 1)
        if _suppress.is_silenced(raw.code, lines, silenced):
            continue
        findings.append(Finding(path, node.lineno, node.col_offset + 1, raw.code, raw.message))
    return findings


def _undecodable(data: bytes, exc: SyntaxError | UnicodeDecodeError) -> str:
    """Why `data` is not Python source text, with the first bad byte where one is."""
    if isinstance(exc, SyntaxError):  # UTF-8 by default; or an unknown coding line
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as bad:
            exc = bad
        else:
            return str(exc.msg)
    if exc.encoding.replace("-", "").lower() == "utf8":
        expected = "UTF-8 text (or a coding line naming its encoding)"
    else:
        expected = f"{exc.encoding} text, as its coding line says"
    return f"expected {expected}, got byte 0x{data[exc.start]:02x} at offset {exc.start}"


def audit_file(
    path: str | Path, *, select: Iterable[str] | None = None, ignore: Iterable[str] = ()
) -> list[Finding]:
    """Findings in one file; raises `AuditError` if it cannot be read or parsed.

    The file is decoded as Python does: UTF-8, or the encoding its first lines declare
    (PEP 263, ``# -*- coding: latin-1 -*-``).
    """
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise AuditError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    try:
        source = importlib.util.decode_source(data)
    except (SyntaxError, UnicodeDecodeError) as exc:
        raise AuditError(f"{path}: cannot read: {_undecodable(data, exc)}") from exc
    return audit_source(source, str(path), select=select, ignore=ignore)


def python_files(paths: Sequence[str | Path], *, exclude: Sequence[str] = ()) -> Iterator[Path]:
    """The Python files under `paths` (files as given; directories searched), sorted.

    `exclude` holds glob patterns matched against each path and each name.
    """

    def excluded(path: Path) -> bool:
        text = path.as_posix()
        return any(
            fnmatch.fnmatch(text, pattern) or fnmatch.fnmatch(path.name, pattern)
            for pattern in exclude
        )

    for given in paths:
        path = Path(given)
        if path.is_dir():
            for found in sorted(path.rglob("*.py")):
                parts = found.relative_to(path).parts[:-1]
                if any(part in DEFAULT_EXCLUDE for part in parts) or excluded(found):
                    continue
                yield found
        elif not excluded(path):
            yield path


def audit_paths(
    paths: Sequence[str | Path],
    *,
    select: Iterable[str] | None = None,
    ignore: Iterable[str] = (),
    exclude: Sequence[str] = (),
) -> tuple[list[Finding], list[AuditError]]:
    """Findings in every Python file under `paths`, and the files that failed."""
    findings: list[Finding] = []
    errors: list[AuditError] = []
    selected = list(select) if select is not None else None
    ignored = list(ignore)
    for path in python_files(paths, exclude=exclude):
        try:
            findings.extend(audit_file(path, select=selected, ignore=ignored))
        except AuditError as exc:
            errors.append(exc)
    return findings, errors
