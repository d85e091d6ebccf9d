"""Which route a request is, and which limits it gets, as FastAPI and Starlette route it.

Included routers (kept as such by recent FastAPI releases), marks on routes, routers and
sub-dependencies, a proxy's root path, a mounted app without routes: each request's
RequestStarted names its route template and the budget its limits gave it.
"""

from __future__ import annotations

from typing import Annotated, Any

import httpx
import pytest
from fastapi import Depends

import deadlines
import deadlines.fastapi as dfa
from deadlines.asgi import DeadlineMiddleware, Limits, limits

from .conftest import Events, serve_uvicorn

pytestmark = pytest.mark.realtime

# The global limits: 2 s by default, 10 s at most; every budget below less 0.05 s.
GLOBAL = {"default": 2.0, "maximum": 10.0}


async def user(_: Annotated[Any, dfa.limits(default=6.0, maximum=12.0)]) -> str:
    """A dependency with a mark of its own (module level: FastAPI resolves the string
    annotations of this module from its globals)."""
    return "someone"


def started(events: Events, count: int) -> list[tuple[str, float]]:
    """(route, budget) of the first `count` requests, once they have finished."""
    events.wait_finished(count)
    found = [e for e in events.items if isinstance(e, deadlines.RequestStarted)]
    return [(e.route, round(e.budget, 2)) for e in found[:count]]


def test_included_routers_keep_their_routes_limits(events: Events) -> None:
    """Routes of an included APIRouter (nested too) are found with their template and
    their marks: the decorator, the route's dependency, the router's dependency."""
    from fastapi import APIRouter, FastAPI

    inner = APIRouter(prefix="/deep")

    @inner.get("/{name}")
    @limits(default=7.0, maximum=8.0)
    async def deep(name: str) -> dict[str, str]:
        return {"name": name}

    router = APIRouter(prefix="/api", dependencies=[dfa.limits(default=3.0, maximum=4.0)])

    @router.get("/plain")
    async def plain() -> dict[str, str]:
        return {}

    @router.get("/report", dependencies=[dfa.limits(default=20.0, maximum=40.0)])
    async def report() -> dict[str, str]:
        return {}

    @router.get("/items/{item_id}")
    @limits(default=30.0, maximum=60.0)
    async def item(item_id: int) -> dict[str, int]:
        return {"item": item_id}

    router.include_router(inner)
    app = FastAPI()
    app.include_router(router)
    wrapped = DeadlineMiddleware(app, **GLOBAL)
    paths = ["/api/plain", "/api/report", "/api/items/3", "/api/deep/x", "/nowhere"]
    with serve_uvicorn(wrapped) as url, httpx.Client(timeout=5.0) as client:
        statuses = [client.get(f"{url}{path}").status_code for path in paths]
    assert statuses == [200, 200, 200, 200, 404]
    assert started(events, 5) == [
        ("/api/plain", 2.95),  # the router's mark
        ("/api/report", 19.95),  # the route's own, over the router's
        ("/api/items/{item_id}", 29.95),
        ("/api/deep/{name}", 6.95),
        ("*", 1.95),
    ]


def test_the_most_specific_dependency_mark_wins(events: Events) -> None:
    """An app-wide mark does not override a route's own; a mark on a dependency of a
    dependency counts."""
    from fastapi import FastAPI

    app = FastAPI(dependencies=[dfa.limits(default=1.0, maximum=2.0)])

    @app.get("/report", dependencies=[dfa.limits(default=20.0, maximum=40.0)])
    async def report() -> dict[str, str]:
        return {}

    @app.get("/authed")
    async def authed(who: Annotated[str, Depends(user)]) -> dict[str, str]:
        return {"who": who}

    @app.get("/plain")
    async def plain() -> dict[str, str]:
        return {}

    wrapped = DeadlineMiddleware(app, **GLOBAL)
    with serve_uvicorn(wrapped) as url, httpx.Client(timeout=5.0) as client:
        asked = (("/report", None), ("/report", "30000"), ("/authed", None), ("/plain", None))
        for path, ms in asked:
            headers = {} if ms is None else {"x-request-timeout-ms": ms}
            assert client.get(f"{url}{path}", headers=headers).status_code == 200
    assert started(events, 4) == [
        ("/report", 19.95),
        ("/report", 29.95),  # the route's 40 s maximum, not the app's 2 s
        ("/authed", 5.95),
        ("/plain", 0.95),  # the app-wide mark, where nothing is more specific
    ]


def test_route_map_behind_a_root_path(events: Events) -> None:
    """Behind a proxy's prefix (ASGI servers put ``root_path`` into ``path`` too) the
    ``routes=`` patterns still name the app's own paths."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def export(request: Request) -> JSONResponse:
        return JSONResponse({"path": request.url.path})

    app = Starlette(routes=[Route("/exports/{name}", export)])
    routes = {"/exports/*": Limits(default=20.0, maximum=60.0)}
    wrapped = DeadlineMiddleware(app, routes=routes, **GLOBAL)

    async def behind_proxy(scope: Any, receive: Any, send: Any) -> None:
        # What uvicorn --root-path /api does to each request's scope.
        if scope["type"] == "http":
            scope = {**scope, "root_path": "/api", "path": "/api" + scope["path"]}
        await wrapped(scope, receive, send)

    with serve_uvicorn(behind_proxy) as url:
        answer = httpx.get(f"{url}/exports/a", timeout=5.0)
    assert answer.json() == {"path": "/api/exports/a"}
    assert started(events, 1) == [("/exports/{name}", 19.95)]


def test_a_mounted_app_without_routes_is_its_mount(tmp_path: Any, events: Events) -> None:
    """Files served by a mounted StaticFiles are labelled with the mount, not as
    unmatched: "*" stays for requests no route takes."""
    from starlette.applications import Starlette
    from starlette.routing import Mount
    from starlette.staticfiles import StaticFiles

    (tmp_path / "a.txt").write_text("static")
    app = Starlette(routes=[Mount("/static", StaticFiles(directory=tmp_path))])
    wrapped = DeadlineMiddleware(app, **GLOBAL)
    with serve_uvicorn(wrapped) as url, httpx.Client(timeout=5.0) as client:
        assert client.get(f"{url}/static/a.txt").text == "static"
        assert client.get(f"{url}/elsewhere").status_code == 404
    assert [route for route, _ in started(events, 2)] == ["/static", "*"]
