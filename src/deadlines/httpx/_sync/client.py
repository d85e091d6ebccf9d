# Generated from _async/client.py by scripts/unasync.py: edit that file, not this.
"""`Client`: an httpx client built on `Transport`."""

from __future__ import annotations

from typing import Any

from ..._dependency import Dependency
from .._lib import httpx
from .._options import split_options
from .transport import Transport


class Client(httpx.Client):
    """An httpx client whose every call is bounded by `dependency` and the deadline.

    Takes the `Transport` options (``verify``, ``http2``, ...) and any other
    httpx client argument except those the dependency decides (``timeout``,
    ``limits``, ``transport``, ``mounts``, ``proxy``).
    """

    def __init__(self, dependency: Dependency, **kwargs: Any) -> None:
        transport_options = split_options(kwargs)
        self.dependency = dependency
        super().__init__(transport=Transport(dependency, **transport_options), **kwargs)
