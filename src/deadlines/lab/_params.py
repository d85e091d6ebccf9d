"""Checks shared by the experiments' `Params`: numbers that must be positive, known names."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection
from typing import Any


def check(params: Any, *, known: Collection[str] = (), names_field: str = "variants") -> None:
    """Raise `ValueError` for a number <= 0 (or NaN/inf) or an unknown variant name.

    Messages name the flag (``--home-rate``), since users set these from the shell.
    """
    for f in dataclasses.fields(params):
        value = getattr(params, f.name)
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, int | float) and not (math.isfinite(value) and value > 0):
            raise ValueError(f"{flag} must be a positive number, got {value}")
    if known:
        names = getattr(params, names_field)
        unknown = [n for n in names if n not in known]
        if unknown or not names:
            raise ValueError(
                f"--{names_field} must name some of {', '.join(known)}; got {', '.join(names)}"
            )
