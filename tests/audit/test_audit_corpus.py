"""The audit on a corpus of realistic snippets: every rule's true positives and negatives.

Each corpus line that must be reported ends in ``# expect: CODE[, CODE]``; every other
line must not be. So each file checks both what is found and what is left alone.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from deadlines.audit import RULES, audit_file

CORPUS = Path(__file__).parent / "corpus"
_EXPECT = re.compile(r"#\s*expect:\s*(?P<codes>DLN\d+(?:\s*,\s*DLN\d+)*)")


def _expected(path: Path) -> set[tuple[int, str]]:
    expected = set()
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        match = _EXPECT.search(line)
        if match:
            expected |= {(number, code.strip()) for code in match.group("codes").split(",")}
    return expected


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.py")), ids=lambda p: p.stem)
def test_corpus_file(path: Path) -> None:
    """Exactly the lines marked `# expect:` are reported, with their codes."""
    found = {(f.line, f.code) for f in audit_file(path)}
    assert found == _expected(path)


def test_every_rule_has_true_positives_and_negatives() -> None:
    """Each rule is exercised by the corpus: reported somewhere, and in a file with negatives."""
    expected = set()
    for path in CORPUS.glob("*.py"):
        expected |= {code for _, code in _expected(path)}
    assert expected == set(RULES)


def test_findings_carry_path_line_column_and_message() -> None:
    """A finding prints as path:line:col CODE message with a 1-based column."""
    path = CORPUS / "dln101_http.py"
    first = audit_file(path)[0]
    assert first.code == "DLN101"
    assert first.col == 16  # `requests.get(` after `    response = `
    assert str(first).startswith(f"{path}:{first.line}:16 DLN101 requests.get() without a timeout")
    assert first.as_dict() == {
        "path": str(path),
        "line": first.line,
        "col": 16,
        "code": "DLN101",
        "message": first.message,
    }
