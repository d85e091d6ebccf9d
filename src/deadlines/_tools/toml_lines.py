"""Line numbers for keys of a TOML document, so a validation error can name its line.

`tomllib` reports syntax errors with a position but returns plain dicts without one.
This scanner reads the text once more and records where each table header and each
``key =`` starts. It understands what the tools' files use (tables, arrays of tables,
dotted and quoted keys, inline tables, multi-line strings and arrays) and otherwise
falls back to the nearest enclosing table: a line near the error beats none.
"""

from __future__ import annotations

import re

Path = tuple[str | int, ...]

_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?\s*(?:#.*)?$")
_KEY = re.compile(
    r"""^\s*((?:"[^"]*"|'[^']*'|[A-Za-z0-9_\-]+)(?:\s*\.\s*(?:"[^"]*"|'[^']*'|[A-Za-z0-9_\-]+))*)\s*="""
)
_INLINE_KEY = re.compile(r"""(?:^|[{,])\s*("[^"]*"|'[^']*'|[A-Za-z0-9_\-]+)\s*=""")


def path_of(key: str) -> Path:
    """The path of a key as errors spell it: ``"load[0].rate"`` -> ``("load", 0, "rate")``."""
    path: list[str | int] = []
    for part in key.split("."):
        name, *indexes = part.split("[")
        if name:
            path.append(name)
        path.extend(int(index.rstrip("]")) for index in indexes)
    return tuple(path)


def _split_key(text: str) -> list[str]:
    parts = re.findall(r""""[^"]*"|'[^']*'|[A-Za-z0-9_\-]+""", text)
    return [p[1:-1] if p[:1] in "\"'" else p for p in parts]


class Locator:
    """Maps key paths (``("route", "calls", 1, "latency")``) to 1-based line numbers."""

    def __init__(self, text: str) -> None:
        self.lines: dict[Path, int] = {}
        self._counts: dict[Path, int] = {}
        self._scan(text)

    def line(self, path: Path) -> int | None:
        """The line of `path`, or of its nearest ancestor that was found."""
        for end in range(len(path), 0, -1):
            found = self.lines.get(path[:end])
            if found is not None:
                return found
        return None

    def _resolve(self, keys: list[str]) -> Path:
        # Each prefix that is an array of tables refers to its latest element.
        path: list[str | int] = []
        for key in keys:
            path.append(key)
            count = self._counts.get(tuple(path))
            if count is not None:
                path.append(count - 1)
        return tuple(path)

    def _scan(self, text: str) -> None:
        table: Path = ()
        in_string: str | None = None
        for number, raw in enumerate(text.splitlines(), start=1):
            if in_string is not None:
                if raw.count(in_string) % 2 == 1:
                    in_string = None
                continue
            header = _HEADER.match(raw)
            if header is not None:
                keys = _split_key(header.group(2))
                if header.group(1) == "[[":
                    parent = (*self._resolve(keys[:-1]), keys[-1])
                    self._counts[parent] = self._counts.get(parent, 0) + 1
                    table = (*parent, self._counts[parent] - 1)
                    self.lines.setdefault(parent, number)
                else:
                    table = self._resolve(keys)
                self.lines[table] = number
                continue
            key = _KEY.match(raw)
            if key is not None:
                path = table + tuple(_split_key(key.group(1)))
                self.lines.setdefault(path, number)
                rest = raw[key.end() :]
                if rest.lstrip().startswith("{"):
                    for inner in _INLINE_KEY.finditer(rest.lstrip()[1:]):
                        self.lines.setdefault((*path, _split_key(inner.group(1))[0]), number)
                for quote in ('"""', "'''"):
                    if rest.count(quote) % 2 == 1:
                        in_string = quote
