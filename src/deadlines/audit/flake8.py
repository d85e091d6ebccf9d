"""The flake8 plugin: ``flake8`` reports the audit's ``DLN`` codes.

Registered in pyproject.toml as ``DLN = "deadlines.audit.flake8:Plugin"`` under
``flake8.extension``; flake8 selects codes starting with the entry point's name by
default. flake8 handles ``# noqa: DLN101`` itself; this plugin also honours
``# deadlines: ignore[DLN101]``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from .. import __version__
from . import _filter
from ._checker import Checker


class Plugin:
    """A flake8 AST plugin (``name``, ``version``, ``__init__(tree, ...)``, ``run()``)."""

    name = "deadlines"
    version = __version__

    def __init__(
        self, tree: ast.AST, filename: str = "stdin", lines: Sequence[str] | None = None
    ) -> None:
        self.tree = tree
        self.filename = filename
        self.lines = lines

    def _source(self) -> str:
        if self.lines is not None:
            return "".join(self.lines)
        try:
            return Path(self.filename).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            return ""  # stdin or unreadable: no suppression comments to honour

    def run(self) -> Iterator[tuple[int, int, str, type[Any]]]:
        """Yield ``(line, column, "DLNxxx message", type)`` as flake8 expects (column 0-based)."""
        if not isinstance(self.tree, ast.Module):
            return
        raws = Checker(self.tree).run()
        for finding in _filter(raws, self._source(), self.filename, None, ()):
            yield finding.line, finding.col - 1, f"{finding.code} {finding.message}", type(self)
