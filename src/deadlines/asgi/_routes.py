"""A Starlette or FastAPI app's route for a request: its path template and the limits
marked on its endpoint or its FastAPI dependencies."""

from __future__ import annotations

from typing import Any

from .. import _inbound
from .._inbound import Limits
from .._private import fastapi as _fastapi
from ._exchange import Scope


def routes_of(app: Any) -> list[Any] | None:
    """The routes of a Starlette-like app or router, or None."""
    router = getattr(app, "router", app)
    routes = getattr(router, "routes", None)
    return routes if isinstance(routes, list) else None


def routes_by_host(app: Any, depth: int = 0) -> bool:
    """Whether a Starlette-like app's routing depends on more than method and path.

    Routes that match on a path have one (`Route`, `Mount`, FastAPI's); one without
    (`Host`, or a custom route) may match on anything, the Host header for `Host`.
    """
    for route in routes_of(app) or ():
        included = getattr(route, "original_router", None)  # FastAPI's included router
        if included is not None:
            if depth < 3 and routes_by_host(included, depth + 1):
                return True
            continue
        if not isinstance(getattr(route, "path", None), str):
            return True
        if depth < 3 and routes_of(route) is not None and routes_by_host(route, depth + 1):
            return True
    return False


def route_path(scope: Scope, path: str) -> str:
    """`path` without the app's ``root_path`` (which ASGI servers include in it, behind
    a proxy's prefix), as the app's own routing sees it: what `routes=` patterns name."""
    root = scope.get("root_path") or ""
    if root and path.startswith(root) and path[len(root) : len(root) + 1] in ("", "/"):
        return path[len(root) :] or "/"
    return path


def host_of(scope: Scope) -> str:
    """The request's Host header, as the route cache's key for host-routed apps."""
    for name, value in scope.get("headers") or ():
        if name == b"host":
            return str(value.decode("latin-1"))
    return ""


def match_framework_route(
    app: Any, scope: Scope, prefix: str = "", depth: int = 0
) -> tuple[str | None, Limits | None]:
    """The matching Starlette/FastAPI route's path template and marked limits, if any.

    Uses the framework's own `route.matches(scope)`, which does not change the scope.
    """
    routes = routes_of(app)
    if routes is None or depth > 3:
        return None, None
    partial: tuple[str | None, Limits | None] | None = None
    for route in routes:
        if getattr(route, "original_router", None) is not None:
            name, result = _included(route, scope, prefix, depth)
            if name == "FULL":
                return result
            if name == "PARTIAL":
                partial = partial or result
            continue
        matches = getattr(route, "matches", None)
        if matches is None:
            continue
        try:
            match, child = matches(scope)
        except Exception:  # a custom route that cannot match this scope
            continue
        name = getattr(match, "name", "")
        if name not in ("FULL", "PARTIAL"):
            continue
        template = prefix + str(getattr(route, "path", ""))
        inner = routes_of(route)
        if inner and getattr(route, "endpoint", None) is None:
            found = match_framework_route(route, {**scope, **child}, template, depth + 1)
            if found[0] is not None:
                return found
            continue
        # A route, or a mount of an app without routes of its own (StaticFiles): the
        # mount's path is the template.
        result = (template or None, route_limits(route))
        if name == "FULL":
            return result
        partial = partial or result
    return partial or (None, None)


def _included(
    router: Any, scope: Scope, prefix: str, depth: int
) -> tuple[str, tuple[str | None, Limits | None]]:
    """A FastAPI included router's match: "FULL", "PARTIAL" or "NONE", and the route's
    template and limits."""
    name, route, context = _fastapi.match(router, scope)
    if name not in ("FULL", "PARTIAL") or depth > 3:
        return "NONE", (None, None)
    if context is None:  # an included router within the included router
        return _included(route, scope, prefix, depth + 1)
    template = getattr(context, "path_format", None) or getattr(route, "path", "")
    return name, (prefix + str(template) or None, route_limits(context))


def route_limits(route: Any) -> Limits | None:
    """Limits marked on the endpoint, or on one of its FastAPI dependencies.

    FastAPI lists the app's and the routers' dependencies before the route's own, so
    they are searched last first: the most specific mark wins. A mark on a
    sub-dependency (a dependency of a dependency) counts too.
    """
    found = _inbound.limits_of(getattr(route, "endpoint", None))
    if found is not None:
        return found
    return _dependency_limits(getattr(route, "dependant", None), 0)


def _dependency_limits(dependant: Any, depth: int) -> Limits | None:
    for dependency in reversed(getattr(dependant, "dependencies", None) or ()):
        found = _inbound.limits_of(getattr(dependency, "call", None))
        if found is None and depth < 8:
            found = _dependency_limits(dependency, depth + 1)
        if found is not None:
            return found
    return None
