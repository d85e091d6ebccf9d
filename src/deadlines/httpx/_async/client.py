"""`AsyncClient`: an httpx client built on `AsyncTransport`."""

from __future__ import annotations

from typing import Any

from ..._dependency import Dependency
from .._lib import httpx
from .._options import split_options
from .transport import AsyncTransport


class AsyncClient(httpx.AsyncClient):
    """An httpx client whose every call is bounded by `dependency` and the deadline.

    Takes the `AsyncTransport` options (``verify``, ``http2``, ...) and any other
    httpx client argument except those the dependency decides (``timeout``,
    ``limits``, ``transport``, ``mounts``, ``proxy``).
    """

    def __init__(self, dependency: Dependency, **kwargs: Any) -> None:
        transport_options = split_options(kwargs)
        self.dependency = dependency
        super().__init__(transport=AsyncTransport(dependency, **transport_options), **kwargs)
