"""Fixtures shared by the overload tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import deadlines
from deadlines import Event


@pytest.fixture
def events() -> Iterator[list[Event]]:
    """Every event reported during the test."""
    seen: list[Event] = []
    unsubscribe = deadlines.observe(seen.append)
    yield seen
    unsubscribe()
