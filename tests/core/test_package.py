"""The package surface: exports, zero dependencies, CLI entry points."""

from __future__ import annotations

import subprocess
import sys

import deadlines


def test_all_matches_exports() -> None:
    """__all__ is sorted, complete, and every name in it exists."""
    public = {n for n in dir(deadlines) if not n.startswith("_") and n not in {"annotations"}}
    modules = {n for n in public if type(getattr(deadlines, n)).__name__ == "module"}
    assert set(deadlines.__all__) == (public - modules) | {"__version__"}
    assert deadlines.__all__ == sorted(deadlines.__all__, key=lambda n: (n.upper() != n, n))


def test_core_imports_no_third_party_module() -> None:
    """`import deadlines` pulls in nothing outside the standard library."""
    code = (
        "import sys; before = set(sys.modules); import deadlines, deadlines.wire, "
        "deadlines.testing; new = set(sys.modules) - before; "
        "std = sys.stdlib_module_names; "
        "bad = sorted(m for m in new if m.split('.')[0] not in std and "
        "m.split('.')[0] != 'deadlines'); print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_cli_version_and_help() -> None:
    """`deadlines --version` and `python -m deadlines --help` work."""
    version = subprocess.run(
        [sys.executable, "-m", "deadlines", "--version"], capture_output=True, text=True, check=True
    )
    assert version.stdout.strip() == f"deadlines {deadlines.__version__}"
    helptext = subprocess.run(
        [sys.executable, "-m", "deadlines", "--help"], capture_output=True, text=True, check=True
    )
    assert "usage: deadlines" in helptext.stdout


def test_py_typed_is_shipped() -> None:
    """The package declares its types (PEP 561)."""
    from importlib.resources import files

    assert files("deadlines").joinpath("py.typed").is_file()


def test_metadata_says_the_license_and_the_pythons_ci_runs() -> None:
    """pyproject's license is the LICENSE file's; its classifiers name 3.11 to 3.13."""
    import re
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())["project"]
    assert project["license"] == "MIT"
    assert project["license-files"] == ["LICENSE"]
    assert (root / "LICENSE").read_text().startswith("MIT License\n")
    pythons = sorted(
        tuple(map(int, m.groups()))
        for c in project["classifiers"]
        if (m := re.fullmatch(r"Programming Language :: Python :: (\d+)\.(\d+)", c))
    )
    assert pythons == [(3, 11), (3, 12), (3, 13)]
    assert project["requires-python"] == ">=3.11"
    ci = (root / ".ci" / "versions").read_text()
    assert "3.13) version=3.13" in ci  # the newest classifier's Python has its own run
