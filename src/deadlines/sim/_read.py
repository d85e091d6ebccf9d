"""Reading one value of a scenario: its type, its range, and an error naming its key.

Every reader takes the value and its dotted key and raises `Invalid` with what was
expected; `scenario` turns that into a `ScenarioError` that also names the line.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Mapping
from typing import Any

from .._tools import durations
from .model import Distribution

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


class Invalid(Exception):
    """Raised inside the parser; turned into a `ScenarioError` with a line at the top."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.message = message


def duration(
    value: Any, key: str, *, allow_none: bool = False, allow_forever: bool = False
) -> float | None:
    """Seconds from a number or a string with a unit; None for "none" when allowed."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == "none" and allow_none:
            return None
        if text == "forever" and allow_forever:
            return math.inf
    try:
        return durations.parse(value)
    except ValueError as exc:
        extra = ' (or "none" for no limit)' if allow_none else ""
        raise Invalid(key, f"{exc}{extra}") from None


def distribution(value: Any, key: str) -> Distribution:
    """A duration, "forever", or a table { dist = "exp", mean = "80ms" } and friends."""
    if not isinstance(value, Mapping):
        seconds = duration(value, key, allow_forever=True)
        assert seconds is not None
        return Distribution("forever") if seconds == math.inf else Distribution("constant", seconds)
    dist = value.get("dist")
    shapes: dict[str, tuple[str, ...]] = {
        "constant": ("value",),
        "exp": ("mean",),
        "uniform": ("low", "high"),
        "lognormal": ("median", "p99"),
    }
    if dist not in shapes:
        raise Invalid(f"{key}.dist", f"must be one of {', '.join(shapes)}; got {dist!r}")
    only(value, key, ("dist", *shapes[dist]))
    params = []
    for name in shapes[dist]:
        if name not in value:
            raise Invalid(f"{key}.{name}", f"a {dist} distribution needs `{name}`")
        seconds = duration(value[name], f"{key}.{name}")
        assert seconds is not None
        params.append(seconds)
    if dist == "exp" and params[0] <= 0:
        raise Invalid(f"{key}.mean", "must be > 0")
    if dist == "uniform" and params[0] > params[1]:
        raise Invalid(f"{key}.high", "must be >= low")
    if dist == "lognormal" and not 0 < params[0] < params[1]:
        raise Invalid(f"{key}.p99", "needs 0 < median < p99")
    return Distribution(dist, *params)


def target(value: Any, key: str) -> tuple[str, str]:
    if not isinstance(value, str) or value.count("/") != 1:
        raise Invalid(key, f'must be "service/route", got {value!r}')
    service, route = value.split("/")
    return service, route


def table(value: Any, key: str, *, required: bool = False) -> dict[str, Any]:
    if value is None and not required:
        return {}
    if not isinstance(value, Mapping):
        what = "missing" if value is None else f"must be a table, got {value!r}"
        raise Invalid(key, what)
    return dict(value)


def array(value: Any, key: str, *, required: bool = False) -> list[Any]:
    if value is None and not required:
        return []
    if not isinstance(value, list) or (required and not value):
        raise Invalid(key, f"must be an array of tables ([[{key}]]), with at least one entry")
    return value


def only(raw: Mapping[str, Any], path: str, allowed: tuple[str, ...]) -> None:
    for name in raw:
        if name not in allowed:
            key = f"{path}.{name}" if path else name
            expected = f"; expected one of: {', '.join(sorted(allowed))}"
            raise Invalid(key, "unknown key" + (suggest(name, allowed) or expected))


def suggest(name: str, known: Any) -> str:
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def name(name: str, key: str) -> None:
    if not _NAME.match(name):
        raise Invalid(key, f"{name!r} is not a valid name (letters, digits, _ and -)")


def string(value: Any, key: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (not empty and not value.strip()):
        raise Invalid(key, f"must be a string, got {value!r}")
    return value


def boolean(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise Invalid(key, f"must be true or false, got {value!r}")
    return value


def integer(value: Any, key: str, *, low: int = 0, high: int = 10**12) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise Invalid(key, f"must be an integer from {low} to {high}, got {value!r}")
    return value


def optional_integer(value: Any, key: str, *, low: int = 1) -> int | None:
    if value is None or value == "unbounded":
        return None
    return integer(value, key, low=low)
