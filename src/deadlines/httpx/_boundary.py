"""The one boundary where httpcore's errors become ours (timeouts) or httpx's (the rest)."""

from __future__ import annotations

from typing import NoReturn

from .. import retry
from ._call import Call
from ._lib import httpcore, httpx

_NETWORK_ERRORS: tuple[tuple[type[Exception], type[httpx.TransportError]], ...] = (
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.ProxyError, httpx.ProxyError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.ProtocolError, httpx.ProtocolError),
    (httpcore.NetworkError, httpx.NetworkError),
)


class Expired(BaseException):
    """This request's limit ran out while it was reading for a shared HTTP/2 connection.

    Raised instead of httpcore's ``ReadTimeout``, which httpcore would keep and raise on
    every stream of the connection: as a `BaseException` (like a cancellation) it only
    ends this request's stream. Always translated at the boundary (`translate`).
    """


def translate(call: Call, exc: BaseException) -> Exception | None:
    """Our error for httpcore's `exc` (a timeout: the taxonomy; else httpx's), or None."""
    if isinstance(exc, httpcore.TimeoutException | Expired):
        return call.error(exc)
    for theirs, ours in _NETWORK_ERRORS:
        if isinstance(exc, theirs):
            return ours(str(exc))
    return None


def raise_translated(call: Call, exc: BaseException, *, finish: bool = False) -> NoReturn:
    """Raise our error for `exc`, or `exc` itself when it is not httpcore's.

    With `finish`, first report the end of the call (a body read that failed).
    """
    error = translate(call, exc)
    if finish:
        call.budget.finish(exc if error is None else error)
    if error is None:
        raise exc
    raise error from (None if isinstance(exc, Expired) else exc)


def request_sent(exc: BaseException) -> bool | None:
    """For retries: whether `exc` may have reached the server (None: do not retry)."""
    if isinstance(exc, httpx.ConnectError):
        return False
    if isinstance(exc, httpx.ReadError | httpx.WriteError | httpx.RemoteProtocolError):
        return True
    return retry.request_sent(exc)
