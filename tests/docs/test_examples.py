"""The code in README.md and docs/ is real: every block parses, complete ones run."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUN_MARK = "<!-- doctest: run -->"
BLOCK = re.compile(
    r"(?P<mark><!-- doctest: run -->\n)?(?P<indent>[ ]*)```python\n(?P<code>.*?)(?P=indent)```",
    re.S,
)


def _blocks() -> list[tuple[str, str, bool]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for match in BLOCK.finditer(text):
            line = text[: match.start("code")].count("\n") + 1
            code = textwrap.dedent(match["code"])
            found.append((f"{page.name}:{line}", code, bool(match["mark"])))
    return found


BLOCKS = _blocks()


@pytest.mark.parametrize(
    ("where", "code"), [(w, c) for w, c, _ in BLOCKS], ids=[w for w, _, _ in BLOCKS]
)
def test_block_parses(where: str, code: str) -> None:
    """Every Python block is valid Python (top-level await allowed, as in a notebook)."""
    compile(code, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT | ast.PyCF_ONLY_AST)


RUNNABLE = [(w, c) for w, c, run in BLOCKS if run]


@pytest.mark.parametrize(("where", "code"), RUNNABLE, ids=[w for w, _ in RUNNABLE])
def test_complete_example_runs(where: str, code: str, tmp_path: Path) -> None:
    """Blocks marked as complete programs run as written and exit 0."""
    script = tmp_path / "example.py"
    script.write_text(code)
    proc = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode == 0, f"{where}\n{proc.stderr[-2000:]}"


def test_readme_has_runnable_examples() -> None:
    """The README's main examples are among those executed."""
    assert sum(1 for w, _ in RUNNABLE if w.startswith("README.md")) >= 5
