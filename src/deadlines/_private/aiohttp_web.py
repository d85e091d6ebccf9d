"""aiohttp.web's private APIs that `deadlines.aiohttp_web` reads.

aiohttp has no public way to ask whether a response's headers are held back for its
first chunk, whether the whole response went out, or to hear that a handler prepared
a response while the app is frozen (``on_response_prepare`` cannot be added then).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any


class AiohttpChanged(RuntimeError):
    """aiohttp no longer has a private API `deadlines.aiohttp_web` reads."""


def _read(obj: Any, name: str) -> Any:
    try:
        return getattr(obj, name)
    except AttributeError as exc:
        raise AiohttpChanged(
            f"deadlines.aiohttp_web reads aiohttp's private {type(obj).__name__}.{name},"
            " which this aiohttp no longer has; use an aiohttp release deadlines supports,"
            " or report it"
        ) from exc


def headers_held(writer: Any) -> bool:
    """Whether the writer holds a response's headers back, to send with the first chunk
    (`StreamWriter._headers_buf`)."""
    return _read(writer, "_headers_buf") is not None


def ended(writer: Any) -> bool:
    """Whether the whole response went out: `write_eof` ran (`StreamWriter._eof`)."""
    return _read(writer, "_eof") is True


def on_prepare(request: Any, prepared: Callable[[Any], None]) -> None:
    """Call `prepared(response)` after aiohttp prepares a response to `request`, from
    inside the handler (through the request's `_prepare_hook`)."""
    original: Callable[[Any], Awaitable[None]] = _read(request, "_prepare_hook")

    async def hook(response: Any) -> None:
        await original(response)
        prepared(response)

    vars(request)["_prepare_hook"] = hook  # aiohttp's debug mode warns on setattr
