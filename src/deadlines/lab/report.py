"""Tables, JSON and pictures of the lab's figures, and the `all` report (Markdown + PNGs).

matplotlib is imported only when a picture is drawn, so the lab's tables and JSON
work without it.
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._extras import missing

#: The terminal width the lab's tables are made to fit.
WIDTH = 100


@dataclass
class Table:
    """A titled table of strings, printed like the chapter's.

    `verdict` sets the table beside the chapter's figures: ``agrees: ...`` or
    ``differs: ...`` with the reason.
    """

    title: str
    headers: Sequence[str]
    rows: list[Sequence[str]] = field(default_factory=list)
    note: str = ""
    verdict: str = ""

    def text(self) -> str:
        """The table in plain aligned columns, for the terminal; notes wrapped to `WIDTH`."""
        widths = [len(h) for h in self.headers]
        for row in self.rows:
            widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]

        def line(cells: Sequence[str]) -> str:
            return "  ".join(cell.ljust(w) for cell, w in zip(cells, widths, strict=True)).rstrip()

        out = [self.title, line(self.headers), line(["-" * w for w in widths])]
        out.extend(line(row) for row in self.rows)
        if self.note:
            out.append(textwrap.fill(self.note, WIDTH))
        if self.verdict:
            out.append(textwrap.fill(f"Chapter: {self.verdict}", WIDTH))
        return "\n".join(out)

    def markdown(self) -> str:
        """The table in Markdown."""

        def line(cells: Sequence[str]) -> str:
            return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

        title = [f"**{part}**" for part in self.title.splitlines()]  # bold stops at a newline
        out = ["  \n".join(title), "", line(self.headers), line(["---"] * len(self.headers))]
        out.extend(line(row) for row in self.rows)
        if self.note:
            out += ["", self.note]
        if self.verdict:
            out += ["", f"**Chapter:** {self.verdict}"]
        return "\n".join(out)


def ms(value: float | None, *, unit: bool = True) -> str:
    """Milliseconds as a table cell: ``2,004 ms``; ``-`` for None."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.0f} ms" if unit else f"{value:,.0f}"


def write_json(path: str | Path, data: Any) -> Path:
    """Write `data` as indented JSON; return the path."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(data, indent=2, allow_nan=False) + "\n")
    return target


def pyplot() -> Any:
    """matplotlib's pyplot on the non-interactive Agg backend (imported here, lazily)."""
    try:
        import matplotlib
    except ImportError as exc:  # pragma: no cover - the lab extra installs it
        raise missing("deadlines lab", "matplotlib", "lab") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path) -> Path:
    """Save and close a matplotlib figure as PNG (laid out tight unless it is constrained)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    if not fig.get_constrained_layout():
        fig.tight_layout()
    fig.savefig(target, dpi=110)
    pyplot().close(fig)
    return target


def markdown_report(
    path: str | Path,
    *,
    title: str,
    intro: str,
    sections: Sequence[tuple[str, str, Sequence[Table], Sequence[Path]]],
) -> Path:
    """Write one Markdown file: per section a heading, text, tables and pictures.

    Pictures are linked relative to the report, so the folder can be moved whole.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    out = [f"# {title}", "", intro, ""]
    for heading, text, tables, pictures in sections:
        out += [f"## {heading}", "", text, ""]
        for table in tables:
            out += [table.markdown(), ""]
        for picture in pictures:
            try:
                rel = Path(picture).resolve().relative_to(target.parent.resolve()).as_posix()
            except ValueError:  # outside the report's folder: link it where it is
                rel = Path(picture).resolve().as_uri()
            out += [f"![{heading}]({rel})", ""]
    target.write_text("\n".join(out))
    return target
