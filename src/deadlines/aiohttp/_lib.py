"""The client library this package binds to: aiohttp, imported here only."""

from __future__ import annotations

from .._extras import missing

try:
    import aiohttp as aiohttp
    from multidict import CIMultiDict as CIMultiDict
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise missing("deadlines.aiohttp", "aiohttp", "aiohttp") from exc

__all__ = ["CIMultiDict", "aiohttp"]
