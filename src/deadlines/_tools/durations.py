"""Durations in the tools' input (files and flags): ``"40ms"``, ``"2s"``, ``"1.5 s"``, seconds.

`deadlines plan`, `deadlines sim` and `deadlines lab` read every duration with `parse`,
so one string means the same to each of them.
"""

from __future__ import annotations

import argparse
import math
import re

_UNITS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "min": 60.0}
#: A number, then a unit (case-insensitive); without a unit the number is seconds.
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?)\s*(us|µs|ms|min|s|m)?\s*$")

EXPECTED = (
    'a duration with a unit (us, ms, s, m or min), like "40ms" or "2s", or a number of seconds'
)
#: Longer than this is a mistake (milliseconds given as seconds, say), not a timeout.
LONGEST = 366 * 24 * 3600.0
#: A bare number above this is more likely milliseconds than seconds: the loader warns.
PLAUSIBLE_BARE = 60.0


def parse(value: object) -> float:
    """Seconds from a TOML value or a flag; raises `ValueError` with what was expected."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"expected {EXPECTED}, got {value!r}")
    if isinstance(value, str):
        match = _PATTERN.match(value.lower())
        if match is None:
            raise ValueError(f"expected {EXPECTED}, got {value!r}")
        result = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    else:
        result = float(value)
    if not math.isfinite(result) or result < 0:
        raise ValueError(f"expected a finite duration >= 0, got {value!r}")
    if result > LONGEST:
        raise ValueError(f"expected a duration of at most a year, got {value!r}")
    return result


def flag(text: str) -> float:
    """`parse` for a command-line flag: argparse reports the error with the flag's name."""
    try:
        return parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def implausible_bare(value: object) -> str | None:
    """A warning when `value` is a number without a unit too large to be meant as seconds."""
    if isinstance(value, str):
        match = _PATTERN.match(value.lower())
        if match is None or match.group(2) is not None:
            return None
        value = float(match.group(1))
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= PLAUSIBLE_BARE:
        return None
    return (
        f"{value:g} is read as {format_seconds(float(value))}; write "
        f'"{value:g}ms" if you meant milliseconds, or "{value:g}s" to keep it'
    )


def format_seconds(seconds: float) -> str:
    """A short human reading: ``500 ms``, ``1.5 s``, ``0.4 ms``."""
    if math.isinf(seconds):
        return "∞"
    if seconds >= 100.0:
        return f"{seconds:,.0f} s"
    if seconds >= 1.0:
        return f"{seconds:.3g} s"
    ms = seconds * 1000.0
    if ms >= 10:
        return f"{ms:.0f} ms"
    return f"{ms:.2g} ms"
