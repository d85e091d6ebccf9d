"""The project's own code passes its own audit."""

from __future__ import annotations

from pathlib import Path

from deadlines.audit import audit_paths

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "deadlines"


def test_whole_package_is_clean() -> None:
    """Every module of src/deadlines is clean; deliberate lines carry a suppression."""
    findings, errors = audit_paths([PACKAGE])
    assert errors == []
    assert findings == [], "\n".join(str(f) for f in findings)


def test_suppressions_are_few_and_deliberate() -> None:
    """Only the lab's misbehaving variants and the aiohttp integration suppress a rule."""
    suppressed = sorted(
        path.relative_to(PACKAGE).as_posix()
        for path in PACKAGE.rglob("*.py")
        if "# deadlines: ignore[" in path.read_text() and path.parent.name != "audit"
    )
    assert suppressed == [
        "aiohttp/_session.py",
        "lab/cascade/__init__.py",
        "lab/cascade/api.py",
        "lab/chain/__init__.py",
        "lab/chain/hop.py",
        "lab/defaults/clients.py",
        "lab/defaults/exit.py",
    ]
