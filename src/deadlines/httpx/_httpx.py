"""The one place that uses httpx's private API: the hooks by which a client makes its transports.

httpx's clients build their transports in two methods, ``_init_transport`` (the
default one, or the user's ``transport=``) and ``_init_proxy_transport`` (one per
proxy: ``proxy=`` or ``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY`` with
``trust_env``, minus ``NO_PROXY``). Overriding them, instead of passing
``transport=``, keeps everything else exactly as httpx does it: which URLs go through
which proxy, and the environment read only when no transport is given. A third,
``_transport_for_url``, picks a request's transport: one put in after the client was
made (respx's ``using="httpx"`` mocker does) is bounded too.
tests/outbound/test_httpx_layout.py pins their names and parameters.
"""

from __future__ import annotations

from typing import Any

from ._lib import httpx

#: The private methods of httpx's clients overridden here, with their parameters.
SEAMS = {
    "_init_transport": ("verify", "cert", "trust_env", "http1", "http2", "limits", "transport"),
    "_init_proxy_transport": ("proxy", "verify", "cert", "trust_env", "http1", "http2", "limits"),
    "_transport_for_url": ("url",),
}


class TransportHooks:
    """Mixed into our clients ahead of httpx's: every transport the client makes is ours.

    The client supplies `_make` (our transport, direct or through a proxy) and `_bound`
    (a transport of the user's, inside the budget).
    """

    def _make(self, proxy: httpx.Proxy | None, options: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _bound(self, transport: Any) -> Any:
        raise NotImplementedError

    def _init_transport(
        self,
        verify: Any = True,
        cert: Any = None,
        trust_env: bool = True,
        http1: bool = True,
        http2: bool = False,
        limits: httpx.Limits = httpx.Limits(),  # noqa: B008 - immutable
        transport: Any = None,
    ) -> Any:
        if transport is not None:
            return self._bound(transport)
        options = {"verify": verify, "cert": cert, "trust_env": trust_env}
        return self._make(None, {**options, "http1": http1, "http2": http2, "limits": limits})

    def _transport_for_url(self, url: httpx.URL) -> Any:
        return self._bound(super()._transport_for_url(url))  # type: ignore[misc]

    def _init_proxy_transport(
        self,
        proxy: httpx.Proxy,
        verify: Any = True,
        cert: Any = None,
        trust_env: bool = True,
        http1: bool = True,
        http2: bool = False,
        limits: httpx.Limits = httpx.Limits(),  # noqa: B008 - immutable
    ) -> Any:
        options = {"verify": verify, "cert": cert, "trust_env": trust_env}
        return self._make(proxy, {**options, "http1": http1, "http2": http2, "limits": limits})
