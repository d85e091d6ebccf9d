"""The project's own code passes its own audit."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from deadlines.audit import audit_paths

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "deadlines"

#: Findings in modules owned elsewhere, each intentional; the owner is asked to mark the
#: line with ``# deadlines: ignore[CODE] reason`` and then drop it from here.
#: (relative path, code) -> how many.
KNOWN: Counter[tuple[str, str]] = Counter(
    {
        # The lab's "no timeout" variants misbehave on purpose.
        ("lab/cascade.py", "DLN101"): 1,
        ("lab/cascade_api.py", "DLN101"): 2,
        ("lab/defaults_clients.py", "DLN101"): 1,
        ("lab/defaults_clients.py", "DLN103"): 1,
    }
)


def test_plan_and_audit_are_clean() -> None:
    """The planner and the audit themselves have no finding at all."""
    findings, errors = audit_paths([PACKAGE / "plan", PACKAGE / "audit"])
    assert errors == []
    assert findings == []


def test_whole_package_has_no_unexpected_finding() -> None:
    """Every module of src/deadlines is clean, apart from the known intentional lines."""
    findings, errors = audit_paths([PACKAGE])
    assert errors == []
    counts = Counter((Path(f.path).relative_to(PACKAGE).as_posix(), f.code) for f in findings)
    unexpected = counts - KNOWN
    assert not unexpected, "\n".join(
        str(f)
        for f in findings
        if (Path(f.path).relative_to(PACKAGE).as_posix(), f.code) in unexpected
    )
