"""What the compat scripts share: a library's own tests, run twice, and the differences.

Each script downloads a library's source distribution (`sdist`), runs its tests as
they are and with a pytest plugin that puts deadlines in place (`run`), and checks the
tests that fail only with deadlines against the differences it documents (`compare`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path


def sdist(library: str, into: Path) -> Path:
    """Download and unpack the installed version's source distribution; its folder."""
    wanted = f"{library}=={version(library)}"
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    subprocess.run([*pip, "--quiet", "--dest", str(into), wanted], check=True)
    (archive,) = into.glob(f"{library}-*.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    folder = into / archive.name.removesuffix(".tar.gz")
    if not (folder / "tests").is_dir():
        raise SystemExit(f"{archive.name} has no tests/")
    return folder


def _test_id(folder: Path, classname: str, name: str) -> str:
    """``tests/test_x.py::TestY::test_z[...]`` from junit's dotted class name."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        path = "/".join(parts[:cut]) + ".py"
        if (folder / path).is_file():
            return "::".join([path, *parts[cut:], name])
    return f"{classname}::{name}"  # a module that failed to import


def run(
    folder: Path, paths: list[str], plugin: str | None, report: Path, *options: str
) -> dict[str, str]:
    """Run the tests at `paths` (with the pytest `plugin`, if any); each test id's
    outcome: passed, failed or skipped. The unpacked folder comes first on the path."""
    command = [sys.executable, "-m", "pytest", *paths, "-q", "-o", "addopts=", *options]
    command += ["--junitxml", str(report), "-p", "no:cacheprovider", "-p", "no:randomly"]
    if plugin is not None:
        command += ["-p", plugin]
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    subprocess.run(command, cwd=folder, env=env, check=False, capture_output=True)
    outcomes = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        name = _test_id(folder, case.get("classname", ""), case.get("name", ""))
        failed = case.find("failure") is not None or case.find("error") is not None
        skipped = case.find("skipped") is not None
        outcomes[name] = "failed" if failed else "skipped" if skipped else "passed"
    return outcomes


def _base(test_id: str) -> str:
    return test_id.split("[", 1)[0]


@dataclass
class Comparison:
    """The tests that fail with deadlines, and how they stand against the documented list."""

    failing: list[str]  # with deadlines
    both: list[str]  # failing as they are too
    differences: list[str]  # failing with deadlines only
    unlisted: list[str]  # differences not documented
    stale: list[str]  # documented differences that pass now
    lines: list[str]  # each difference with its reason, each stale entry: to print

    @property
    def ok(self) -> bool:
        """Every difference documented, and none documented that passes now."""
        return not self.unlisted and not self.stale


def compare(
    theirs: Mapping[str, str], ours: Mapping[str, str], documented: Mapping[str, str]
) -> Comparison:
    """Compare two runs against `documented` (test id without parameters: the reason)."""
    failing = sorted(t for t, outcome in ours.items() if outcome == "failed")
    differences = [t for t in failing if theirs.get(t) == "passed"]
    # A listed difference is stale once all of its tests pass with deadlines. (One that
    # fails both ways here, for a reason of this machine's, proves nothing either way.)
    stale = sorted(
        base
        for base in documented
        if any(_base(t) == base for t in ours)
        and all(outcome != "failed" for t, outcome in ours.items() if _base(t) == base)
    )
    lines = [
        f"  {t}: {documented.get(_base(t), 'NOT A DOCUMENTED DIFFERENCE')}" for t in differences
    ]
    lines += [f"  {base}: listed as a difference, but passes now" for base in stale]
    return Comparison(
        failing=failing,
        both=[t for t in failing if theirs.get(t) == "failed"],
        differences=differences,
        unlisted=[t for t in differences if _base(t) not in documented],
        stale=stale,
        lines=lines,
    )
