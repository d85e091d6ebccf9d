"""`Response`: an `aiohttp.ClientResponse` that reports the end of its call when released."""

from __future__ import annotations

from typing import Any

from ._call import Call
from ._lib import aiohttp


class Response(aiohttp.ClientResponse):
    """An `aiohttp.ClientResponse` whose body reads are bounded by the call's limits.

    ``pool_wait`` is the seconds this call waited for a pooled connection.
    """

    _deadlines_call: Call | None = None

    @property
    def pool_wait(self) -> float | None:
        """Seconds spent waiting for a pooled connection (None if unknown)."""
        call = self._deadlines_call
        return None if call is None else call.pool_wait

    def release(self) -> Any:
        """Release the connection and report the end of the call."""
        if self._deadlines_call is not None:
            self._deadlines_call.finish()  # once: aiohttp releases twice per call
        return super().release()

    def close(self) -> None:
        """Close the connection and report the end of the call."""
        if self._deadlines_call is not None:
            self._deadlines_call.finish()
        super().close()
