"""`AsyncClient`: an httpx client whose every transport bounds its calls by one dependency."""

from __future__ import annotations

from typing import Any

from ..._dependency import Dependency
from .._httpx import TransportHooks
from .._lib import httpx
from .._options import TRANSPORT_ONLY, check_dependency
from .bounded import AsyncBounded
from .transport import AsyncTransport


class AsyncClient(TransportHooks, httpx.AsyncClient):
    """An httpx client whose every call is bounded by `dependency` and the deadline.

    Takes every httpx client argument, with httpx's meaning, and the transport's own
    ``uds``, ``local_address``, ``socket_options`` and ``retries``:

    * its transports are ours, proxies too (``proxy=``, or ``HTTP_PROXY`` and friends
      with ``trust_env``), sharing the dependency's pool: every phase bounded;
    * a ``transport=`` or ``mounts=`` of the user's (a mock, respx) is wrapped in
      `AsyncBounded`: the deadline header, the call inside the deadline and the
      dependency's total, errors typed; the per-phase caps need a transport of ours;
    * ``timeout=`` (unset by default) lowers the dependency's caps where it is shorter;
      ``limits=`` can lower its pool size and sets the keep-alive (unset, the pool
      keeps up to ``pool_size`` connections alive, for up to 5 s idle).
    """

    def __init__(self, dependency: Dependency, **kwargs: Any) -> None:
        check_dependency(dependency)
        self.dependency = dependency
        self._transport_options = {k: kwargs.pop(k) for k in TRANSPORT_ONLY if k in kwargs}
        self._shared_gate: Any = None
        kwargs.setdefault("timeout", None)  # the dependency's caps alone, unless given
        # httpx's default (100 connections, 20 kept) would cap a larger pool_size unasked
        kwargs.setdefault("limits", httpx.Limits())
        mounts = kwargs.get("mounts")
        if mounts:
            kwargs["mounts"] = {
                pattern: None if transport is None else self._bound(transport)
                for pattern, transport in mounts.items()
            }
        super().__init__(**kwargs)

    def _make(self, proxy: httpx.Proxy | None, options: dict[str, Any]) -> AsyncTransport:
        transport = AsyncTransport(
            self.dependency, proxy=proxy, **options, **self._transport_options
        )
        if self._shared_gate is None:  # one bulkhead for the dependency, proxies included
            self._shared_gate = transport._gate
        transport._gate = self._shared_gate
        return transport

    def _bound(self, transport: httpx.AsyncBaseTransport) -> httpx.AsyncBaseTransport:
        if isinstance(transport, AsyncTransport | AsyncBounded):
            return transport  # bounded already, by its own dependency
        return AsyncBounded(self.dependency, transport)
