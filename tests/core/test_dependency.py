"""Dependency and Retry: bounded defaults, validated on construction."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

import pytest

from deadlines import Dependency, Retry


def test_defaults_are_bounded() -> None:
    """No default means 'forever'."""
    dep = Dependency("pricing")
    for name in ("connect", "headers", "idle", "total", "pool_wait"):
        value = getattr(dep, name)
        assert isinstance(value, float)
        assert 0 < value <= 60
    assert 1 <= dep.pool_size <= 100
    assert dep.retry is None


def test_timedelta_accepted_and_normalised() -> None:
    """Every time field takes seconds or a timedelta and stores seconds."""
    dep = Dependency("x", connect=timedelta(milliseconds=500), total=timedelta(seconds=3))
    assert dep.connect == 0.5
    assert dep.total == 3.0


def test_is_frozen_and_replaceable() -> None:
    """A policy is immutable; dataclasses.replace derives a new one (validated again)."""
    dep = Dependency("x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        dep.connect = 5  # type: ignore[misc]
    assert dataclasses.replace(dep, total=1.0).total == 1.0
    with pytest.raises(ValueError, match="total must be > 0"):
        dataclasses.replace(dep, total=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": ""}, "name must be a non-empty string"),
        ({"connect": -1}, "connect must be > 0 seconds, got -1.0"),
        ({"headers": 0}, "headers must be > 0 seconds"),
        ({"idle": float("nan")}, "idle must be a number of seconds, not NaN"),
        ({"total": float("inf")}, "total must be finite"),
        ({"pool_size": 0}, "pool_size must be between 1 and 100000"),
        ({"pool_wait": 10**9}, "more than a year"),
        ({"min_useful": 5, "total": 1}, "min_useful .* is longer than total"),
    ],
)
def test_bad_values_are_refused(kwargs: dict[str, object], message: str) -> None:
    """Each bad setting fails with a message that names it."""
    kwargs.setdefault("name", "x")
    with pytest.raises(ValueError, match=message):
        Dependency(**kwargs)  # type: ignore[arg-type]


def test_bad_types_are_refused() -> None:
    """Wrong types are TypeErrors."""
    with pytest.raises(TypeError, match="pool_size must be an int"):
        Dependency("x", pool_size=2.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="retry must be a deadlines.Retry"):
        Dependency("x", retry=3)  # type: ignore[arg-type]


def test_retry_backoff() -> None:
    """Backoff grows by the multiplier, is capped, and jitter scales it."""
    r = Retry(backoff=0.1, multiplier=2, max_backoff=0.3, jitter=False)
    assert [r.backoff_for(n) for n in (1, 2, 3, 4)] == [0.1, 0.2, 0.3, 0.3]
    assert Retry(backoff=0.1, jitter=True).backoff_for(1, rand=0.5) == pytest.approx(0.05)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"attempts": 0}, "attempts must be between 1 and 100"),
        ({"backoff": -1}, "backoff must be >= 0"),
        ({"multiplier": 0.5}, "multiplier must be >= 1"),
    ],
)
def test_retry_validation(kwargs: dict[str, object], message: str) -> None:
    """Retry settings are validated too."""
    with pytest.raises(ValueError, match=message):
        Retry(**kwargs)  # type: ignore[arg-type]
