"""The one place that reaches into httpcore's private objects: resetting an HTTP/2 stream.

A stream given up on (a limit fired, the caller left, the body was not read to its end)
must be reset. httpcore 1.0 forgets such a stream but neither sends RST_STREAM nor
tells h2 (encode/httpcore#1022): the server worked on, and once 100 streams had been
dropped that way h2 refused new ones on the connection ("Max outbound streams is 100,
100 open"). Here the stream is reset in the connection's h2 state and the frame is
written. tests/outbound/test_httpcore_seams.py pins every name used, so an httpcore
that changes them fails loudly there; at run time a connection that is not as expected
is left alone.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ._call import Call
from ._lib import anyio

#: The attributes of httpcore used here (pinned by the seam test).
SEAMS = {
    "AsyncHTTPConnection": ("_connection",),
    "AsyncHTTP2Connection": ("_h2_state", "_write_outgoing_data"),
    "HTTPConnection": ("_connection",),
    "HTTP2Connection": ("_h2_state", "_write_outgoing_data"),
}


def _h2(call: Call) -> Any | None:
    """The HTTP/2 connection inside the call's connection, with its stream still open."""
    if call.connection is None or call.stream_id is None:
        return None
    inner: Any = getattr(call.connection, "_connection", None)
    if not hasattr(inner, "_h2_state"):
        return None
    import h2.errors  # HTTP/2 is optional: imported once it is in use
    import h2.exceptions

    try:
        inner._h2_state.reset_stream(call.stream_id, error_code=h2.errors.ErrorCodes.CANCEL)
    except h2.exceptions.ProtocolError:  # closed: ended, reset by the server, or gone
        return None
    return inner


async def abandon_async(call: Call, request: Any) -> None:
    """Reset the call's HTTP/2 stream, if it has one open, and send the RST_STREAM."""
    inner = _h2(call)
    if inner is None:
        return
    # A failed write means a broken connection, which httpcore has marked so.
    with anyio.CancelScope(shield=True), contextlib.suppress(Exception):
        await inner._write_outgoing_data(request)


def abandon_sync(call: Call, request: Any) -> None:
    """The blocking twin of `abandon_async`."""
    inner = _h2(call)
    if inner is None:
        return
    with contextlib.suppress(Exception):  # broken: httpcore has marked it so
        inner._write_outgoing_data(request)
