"""grpc.aio's private API that `deadlines.grpc` serves.

grpc.aio's ``write()`` proxy for a stream-unary call asks the call an interceptor
returned for ``_done_writing_flag``; the client interceptors' answers pass it on from
the call they wrap.
"""

from __future__ import annotations

from typing import Any


class GrpcChanged(RuntimeError):
    """grpc.aio no longer has the private API `deadlines.grpc` serves."""


def done_writing(call: Any) -> bool:
    """Whether the caller said it is done writing (the call's `_done_writing_flag`)."""
    try:
        return bool(call._done_writing_flag)
    except AttributeError as exc:
        raise GrpcChanged(
            f"deadlines.grpc reads grpc.aio's private {type(call).__name__}._done_writing_flag,"
            " which this grpcio no longer has; use a grpcio release deadlines supports, or"
            " report it"
        ) from exc
