"""FastAPI helpers for `deadlines.asgi.DeadlineMiddleware`: per-route limits as a dependency.

    from deadlines.asgi import DeadlineMiddleware
    import deadlines.fastapi

    app = FastAPI()
    app.add_middleware(DeadlineMiddleware, default=2.0, maximum=10.0)

    @app.get("/report", dependencies=[deadlines.fastapi.limits(default=10, maximum=30)])
    async def report(deadline: Annotated[Deadline | None, Depends(deadlines.fastapi.deadline)]):
        ...

The middleware finds the `limits` dependency on the route before the handler runs, so
the route's limits apply from arrival. The dependency only marks the route: the
deadline itself is enforced by the middleware.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from . import _inbound
from ._deadline import Deadline
from ._extras import missing
from ._scope import current

try:
    from fastapi import Depends
except ImportError as exc:  # pragma: no cover - exercised without fastapi installed
    raise missing("deadlines.fastapi", "FastAPI", "fastapi") from exc

__all__ = ["deadline", "limits"]


async def deadline() -> Deadline | None:
    """Dependency: the request's deadline (None when no DeadlineMiddleware is installed)."""
    return current()


def limits(*, default: float | timedelta, maximum: float | timedelta) -> Any:
    """A `Depends(...)` marking its route with its own default budget and maximum."""
    mark = _inbound.Limits(default=default, maximum=maximum)

    async def route_deadline() -> Deadline | None:
        return current()

    setattr(route_deadline, _inbound.LIMITS_ATTRIBUTE, mark)
    return Depends(route_deadline)
