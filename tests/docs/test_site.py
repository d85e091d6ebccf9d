"""The documentation site builds in strict mode, and a broken API reference fails it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """`mkdocs build --strict` with `config`, into `site`."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def test_the_site_builds_with_every_guide_and_reference(tmp_path: Path) -> None:
    """mkdocs.yml builds strictly; every guide in docs/ is a page, each module documented."""
    result = build(ROOT / "mkdocs.yml", tmp_path)
    assert result.returncode == 0, result.stderr
    for guide in (ROOT / "docs").glob("*.md"):
        assert (tmp_path / guide.stem / "index.html").is_file() or guide.stem == "index"
    core = (tmp_path / "reference" / "core" / "index.html").read_text()
    assert "deadlines.scope" in core and "DeadlineExceeded" in core


def test_a_reference_that_does_not_resolve_fails_the_build(tmp_path: Path) -> None:
    """`::: deadlines.nowhere` in a page makes the strict build fail, naming it."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Broken\n\n::: deadlines.nowhere\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        "site_name: broken\n"
        "plugins:\n"
        "  - mkdocstrings:\n"
        "      handlers:\n"
        "        python:\n"
        f"          paths: [{ROOT / 'src'}]\n"
    )
    result = build(config, tmp_path / "site")
    assert result.returncode != 0
    assert "deadlines.nowhere" in result.stderr
