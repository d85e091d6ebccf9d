"""The client library this package binds to: httpx and httpcore, imported here only."""

from __future__ import annotations

from .._extras import missing

try:
    import anyio as anyio
    import httpcore as httpcore
    import httpx as httpx
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise missing("deadlines.httpx", "httpx", "httpx") from exc

__all__ = ["anyio", "httpcore", "httpx"]
