"""The client library deadlines.httpx2 binds to: httpx2 and httpcore2, imported here only."""

from __future__ import annotations

from .._extras import missing

try:
    import anyio as anyio
    import httpcore2 as httpcore
    import httpx2 as httpx
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise missing("deadlines.httpx2", "httpx2", "httpx2") from exc

__all__ = ["anyio", "httpcore", "httpx"]
