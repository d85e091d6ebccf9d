"""Checks shared by the experiments' `Params`: positive numbers in range, known names.

Messages name the flag (``--home-rate``) and what it accepts, since users set these
from the shell; every check runs before any process starts.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Iterable, Mapping
from typing import Any

#: The longest time any one setting may be: the lab's longest run (`deadlines sim` is
#: the tool for hours of traffic).
HOUR = 3600.0
#: Requests one variant may send: the load generator is one Python process.
MOST_REQUESTS = 100_000


def flag(name: str) -> str:
    """The command-line flag of a Params field: ``home_rate`` -> ``--home-rate``."""
    return "--" + name.replace("_", "-")


def check(
    params: Any,
    *,
    known: Collection[str] = (),
    names_field: str = "variants",
    at_most: Mapping[str, tuple[float, str]] | None = None,
    seconds: Iterable[str] = (),
) -> None:
    """Raise `ValueError` for a number <= 0 (or NaN/inf), one above its bound, or an unknown name.

    `at_most` maps a field to its bound and why; each field in `seconds` is a time
    and may be at most `HOUR`.
    """
    bounds = dict(at_most or {})
    for name in seconds:
        bounds.setdefault(name, (HOUR, "an hour, the lab's longest run"))
    for f in dataclasses.fields(params):
        value = getattr(params, f.name)
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int | float):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{flag(f.name)} must be a positive number, got {value}")
            if f.name in bounds and value > bounds[f.name][0]:
                bound, why = bounds[f.name]
                raise ValueError(
                    f"{flag(f.name)} must be at most {_number(bound)} ({why}), got {_number(value)}"
                )
    if known:
        names = getattr(params, names_field)
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise ValueError(
                f"--{names_field} must name some of {', '.join(known)}; got {', '.join(names)}"
            )


def _number(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def check_requests(requests: float, flags: str) -> None:
    """Raise `ValueError` when one variant would send more than `MOST_REQUESTS`."""
    if requests > MOST_REQUESTS:
        raise ValueError(
            f"{flags} make {requests:,.0f} requests per run; the lab sends at most"
            f" {MOST_REQUESTS:,} from its one load process (deadlines sim runs millions)"
        )
