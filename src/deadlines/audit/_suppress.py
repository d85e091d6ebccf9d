"""Per-line suppression comments.

    requests.get(url)  # deadlines: ignore[DLN101] the lab's hung client, on purpose
    requests.get(url)  # noqa: DLN101

A code also matches by prefix (``DLN1`` covers every rule), as in flake8. A bare
``# deadlines: ignore`` silences every rule on the line; a bare ``# noqa`` does not:
it is usually meant for another linter, and a silent audit should be a choice.
A comment counts on any line of the flagged expression.
"""

from __future__ import annotations

import io
import re
import tokenize

ALL = "*"

_OURS = re.compile(r"#\s*deadlines:\s*ignore(?:\[(?P<codes>[^\]]*)\])?", re.IGNORECASE)
_NOQA = re.compile(r"#\s*noqa\s*:\s*(?P<codes>[A-Z]+[0-9]*(?:\s*,\s*[A-Z]+[0-9]*)*)", re.IGNORECASE)


def _codes(text: str) -> set[str]:
    return {code.strip().upper() for code in re.split(r"[,\s]+", text) if code.strip()}


def comments(source: str) -> dict[int, set[str]]:
    """Line number -> the codes silenced on it (`ALL` for every code)."""
    silenced: dict[int, set[str]] = {}
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):
        return silenced
    for token in tokens:
        if token.type != tokenize.COMMENT:
            continue
        line = token.start[0]
        ours = _OURS.search(token.string)
        if ours is not None:
            codes = ours.group("codes")
            silenced.setdefault(line, set()).update(_codes(codes) if codes else {ALL})
        noqa = _NOQA.search(token.string)
        if noqa is not None:
            silenced.setdefault(line, set()).update(_codes(noqa.group("codes")))
    return silenced


def is_silenced(code: str, lines: range, silenced: dict[int, set[str]]) -> bool:
    """Whether `code` is silenced on any of `lines`."""
    for line in lines:
        codes = silenced.get(line)
        if codes and (ALL in codes or any(code.startswith(c) for c in codes)):
            return True
    return False
