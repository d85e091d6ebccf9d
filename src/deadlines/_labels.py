"""Bounded label values for exporters: a metric label must never take unbounded values."""

from __future__ import annotations

import logging
from typing import Final

#: The label value that stands for every value beyond the limit.
OVERFLOW_LABEL: Final = "other"

_log = logging.getLogger("deadlines")


class LabelGuard:
    """Admits at most `limit` distinct values of one label; later ones become "other".

    Warns once when it starts folding, since that means a URL or a raw path is being
    used where a name or a route template belongs.
    """

    def __init__(self, kind: str, limit: int) -> None:
        self._kind = kind
        self._limit = limit
        self._seen: set[str] = set()
        self._warned = False

    def __call__(self, value: str) -> str:
        if value in self._seen:
            return value
        if len(self._seen) < self._limit:
            self._seen.add(value)
            return value
        if not self._warned:
            self._warned = True
            _log.warning(
                "deadlines metrics: more than %d distinct %s label values; folding %r and"
                " later ones into %r (use a name or route template, not a URL or path)",
                self._limit,
                self._kind,
                value,
                OVERFLOW_LABEL,
            )
        return OVERFLOW_LABEL
