"""FastAPI's included routers, read through their private `_match`.

Recent FastAPI releases keep an included router as such (0.165 here), no longer copying
its routes into the app. Its public `matches` says only whether a route matched; the
private `_match` names the route and its effective context: the full path template,
the endpoint, and the dependencies of the route, its routers and the include. When a
FastAPI release changes it, requests fail with `FastAPIChanged` rather than silently
losing their routes' limits.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any


class FastAPIChanged(RuntimeError):
    """FastAPI no longer has the private `_match` this module reads, in the shape read."""


def match(router: Any, scope: MutableMapping[str, Any]) -> tuple[str, Any, Any]:
    """``router._match(scope)``: the match's name ("FULL", "PARTIAL" or "NONE"), the
    route (or an included router within this one) and its context (None for a router)."""
    try:
        found, _, route, context = router._match(scope)
    except (AttributeError, TypeError, ValueError) as exc:
        raise FastAPIChanged(
            "deadlines.asgi reads FastAPI's private APIRouter._match(scope) -> (match,"
            " child scope, route, context), which this FastAPI changed; use a FastAPI"
            f" release deadlines supports, or report it ({exc})"
        ) from exc
    return str(getattr(found, "name", "NONE")), route, context
