"""The third-party private APIs the integrations read (`deadlines._private`): each is
pinned against the installed library, and fails loudly when it is gone."""

from __future__ import annotations

import inspect
from typing import Any

import grpc.aio
import httpx
import pytest
from aiohttp import web
from fastapi import APIRouter, FastAPI

from deadlines._private import aiohttp_web, fastapi
from deadlines._private import grpc as grpc_private

from .conftest import serve_aiohttp


def test_fastapi_match_names_an_included_routers_route() -> None:
    """`APIRouter._match` gives the match, the route and its context (full template)."""
    router = APIRouter(prefix="/items")

    @router.get("/{item_id}")
    async def item(item_id: int) -> int:
        return item_id

    app = FastAPI()
    app.include_router(router, prefix="/v1")
    included = next(r for r in app.router.routes if getattr(r, "original_router", None))
    scope = {"type": "http", "method": "GET", "path": "/v1/items/3", "root_path": ""}
    name, route, context = fastapi.match(included, scope)
    assert name == "FULL"
    assert route is not None
    assert context.path_format == "/v1/items/{item_id}"


def test_fastapi_without_match_fails_loudly() -> None:
    """A router without `_match` (a FastAPI that changed it) raises, never guesses."""
    with pytest.raises(fastapi.FastAPIChanged, match="_match"):
        fastapi.match(object(), {"type": "http"})


def test_aiohttp_writer_flags_follow_a_response() -> None:
    """The writer's held-back headers and end flags read what happened, on a real server."""
    seen: list[tuple[str, bool, bool]] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        writer = request.writer
        seen.append(("before", aiohttp_web.headers_held(writer), aiohttp_web.ended(writer)))
        response = web.Response(text="done")  # holds its headers for the body
        await response.prepare(request)
        seen.append(("prepared", aiohttp_web.headers_held(writer), aiohttp_web.ended(writer)))
        await response.write_eof()
        seen.append(("ended", aiohttp_web.headers_held(writer), aiohttp_web.ended(writer)))
        return response

    app = web.Application()
    app.router.add_get("/", handler)
    with serve_aiohttp(app) as base:
        assert httpx.get(base + "/", timeout=5).text == "done"
    assert seen == [("before", False, False), ("prepared", True, False), ("ended", False, True)]


def test_aiohttp_prepare_hook_tells_of_a_prepared_response() -> None:
    """`on_prepare` hears of the response a handler prepares, inside the handler."""
    prepared: list[int] = []

    async def handler(request: web.Request) -> web.Response:
        aiohttp_web.on_prepare(request, lambda response: prepared.append(response.status))
        response = web.Response(status=202, text="ok")
        await response.prepare(request)
        assert prepared == [202]
        return response

    app = web.Application()
    app.router.add_get("/", handler)
    with serve_aiohttp(app) as base:
        assert httpx.get(base + "/", timeout=5).status_code == 202
    assert prepared == [202]


@pytest.mark.parametrize("read", [aiohttp_web.headers_held, aiohttp_web.ended])
def test_aiohttp_without_the_flags_fails_loudly(read: Any) -> None:
    """A writer without the private flags (an aiohttp that changed them) raises."""
    with pytest.raises(aiohttp_web.AiohttpChanged, match="private object"):
        read(object())


def test_grpc_reads_done_writing_flag_from_the_interceptors_call() -> None:
    """grpc.aio's stream-unary write proxy still asks the call for `_done_writing_flag`."""
    source = inspect.getsource(grpc.aio._interceptor)
    assert "call._done_writing_flag" in source


def test_grpc_without_the_flag_fails_loudly() -> None:
    """A call without `_done_writing_flag` (a grpcio that changed it) raises."""
    with pytest.raises(grpc_private.GrpcChanged, match="_done_writing_flag"):
        grpc_private.done_writing(object())
