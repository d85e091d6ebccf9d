"""Checks for time values given by users: numbers or timedeltas, finite, not negative."""

from __future__ import annotations

import math
from datetime import timedelta

#: Anything longer than this is a mistake (a value in ms passed as seconds, say).
ABSURD_SECONDS = 366 * 24 * 3600.0


def seconds(value: float | timedelta, name: str, *, allow_zero: bool = True) -> float:
    """Return `value` in seconds, or raise a `ValueError`/`TypeError` that names `name`."""
    # The hot paths: a plain number in range (NaN fails the comparison); a float first,
    # as every scope and call gives one (`type() is` is cheaper than `isinstance`).
    if type(value) is float and 0.0 < value <= ABSURD_SECONDS:
        return value
    if (
        isinstance(value, float | int)
        and not isinstance(value, bool)
        and 0 < value <= ABSURD_SECONDS
    ):
        return float(value)
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds or a timedelta, not {value!r}")
    result = float(value)
    if math.isnan(result):
        raise ValueError(f"{name} must be a number of seconds, not NaN")
    if math.isinf(result):
        raise ValueError(f"{name} must be finite, got {result}; no limit is not an option here")
    if result < 0 or (result == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be {bound} seconds, got {result}")
    if result > ABSURD_SECONDS:
        raise ValueError(
            f"{name} of {result} s is more than a year; did you pass milliseconds as seconds?"
        )
    return result


def fraction(value: float, name: str, *, allow_zero: bool = True) -> float:
    """Return `value` as a float in [0, 1] (or (0, 1]), or raise an error that names `name`."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number between 0 and 1, not {value!r}")
    result = float(value)
    low_ok = result >= 0.0 if allow_zero else result > 0.0
    if not (low_ok and result <= 1.0):  # NaN fails both
        bound = "[0, 1]" if allow_zero else "(0, 1]"
        raise ValueError(f"{name} must be in {bound}, got {value}")
    return result


def count(value: int, name: str, *, low: int = 1, high: int = 1_000_000) -> int:
    """Return `value` if it is an int in [low, high], or raise an error that names `name`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be between {low} and {high}, got {value}")
    return value
