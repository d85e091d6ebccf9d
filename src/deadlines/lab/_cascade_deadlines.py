"""The cascade API's `deadlines` variant (needs the library's aiohttp integrations)."""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cascade_api import Calls, Options

_NEEDED = ("deadlines.aiohttp", "deadlines.aiohttp_web", "deadlines.fallback")


def missing() -> str | None:
    """Why the variant cannot run here, or None when it can."""
    absent = [m for m in _NEEDED if importlib.util.find_spec(m) is None]
    return f"waiting for {', '.join(absent)}" if absent else None


def deadlines_variant(opts: Options) -> tuple[Calls, list[Any]]:
    """The calls and middlewares of the `deadlines` variant."""
    raise RuntimeError(missing() or "not written yet")
