"""gRPC (grpc.aio): the server interceptor and the client interceptors on a real server.

Generic handlers with raw bytes, so no generated code is needed. Everything runs on the
test's event loop: the gRPC server, uvicorn for the HTTP hops, and the clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import httpx
import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

import deadlines
import deadlines.grpc
from deadlines import wire
from deadlines.asgi import DeadlineMiddleware
from deadlines.grpc import DeadlineInterceptor, Limits, client_interceptors

from .conftest import Events, uvicorn_in_loop

pytestmark = [pytest.mark.anyio, pytest.mark.realtime]

SERVICE = "test.Clock"


class Service:
    """Handlers that report the deadline they run under, and slow ones."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {}
        self.cancelled: list[str] = []
        self.closed: list[float] = []  # when Flood's generator ran its `finally`
        self.http_url = ""

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    async def remaining(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self._count("Remaining")
        left = deadlines.remaining() if deadlines.current() else None
        return json.dumps({"remaining": left, "time_remaining": context.time_remaining()}).encode()

    async def slow(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self._count("Slow")
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            self.cancelled.append(request.decode())
            raise
        return b"done"

    async def ticks(
        self, request: bytes, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        for i in range(int(request.decode())):
            await asyncio.sleep(0.05)
            yield f"{i}:{deadlines.remaining():.3f}".encode()

    async def flood(
        self, request: bytes, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        """1 MiB messages, far more than flow control lets through to a caller not reading."""
        try:
            for _ in range(1000):
                yield b"x" * (1 << 20)
        finally:
            self.closed.append(time.monotonic())

    async def via_http(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """A gRPC handler calling an HTTP service with the remaining budget."""
        async with httpx.AsyncClient(timeout=deadlines.remaining(), verify=False) as client:
            answer = await client.get(
                f"{self.http_url}/remaining", headers=wire.outbound_headers(deadlines.remaining())
            )
        return answer.content

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Remaining": grpc.unary_unary_rpc_method_handler(self.remaining),
                "Slow": grpc.unary_unary_rpc_method_handler(self.slow),
                "Short": grpc.unary_unary_rpc_method_handler(self.slow),
                "Ticks": grpc.unary_stream_rpc_method_handler(self.ticks),
                "Flood": grpc.unary_stream_rpc_method_handler(self.flood),
                "ViaHttp": grpc.unary_unary_rpc_method_handler(self.via_http),
            },
        )


class Rig:
    """A running gRPC server and a plain and an intercepted channel to it."""

    def __init__(self, service: Service, target: str, plain: Any, smart: Any) -> None:
        self.service, self.target, self.plain, self.smart = service, target, plain, smart

    def plain_call(self, method: str) -> Any:
        return self.plain.unary_unary(f"/{SERVICE}/{method}")

    def smart_call(self, method: str) -> Any:
        return self.smart.unary_unary(f"/{SERVICE}/{method}")


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    """A grpc.aio server with DeadlineInterceptor, and channels to it."""
    service = Service()
    interceptor = DeadlineInterceptor(
        default=1.0,
        maximum=2.0,
        routes={
            f"/{SERVICE}/Short": Limits(default=0.3, maximum=0.3),
            f"/{SERVICE}/Flood": Limits(default=0.3, maximum=0.3),
        },
    )
    server = grpc.aio.server(interceptors=[interceptor])
    server.add_generic_rpc_handlers((service.handler(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    target = f"127.0.0.1:{port}"
    plain = grpc.aio.insecure_channel(target)
    smart = grpc.aio.insecure_channel(
        target,
        interceptors=client_interceptors(dependency=deadlines.Dependency("clock", min_useful=0.1)),
    )
    try:
        yield Rig(service, target, plain, smart)
    finally:
        await plain.close()
        await smart.close()
        await server.stop(None)


@contextlib.asynccontextmanager
async def served(
    handler: grpc.GenericRpcHandler,
    *,
    server_interceptors: list[Any] | None = None,
    client: list[Any] | None = None,
) -> AsyncIterator[grpc.aio.Channel]:
    """A grpc.aio server on loopback for `handler` and a channel to it; both closed after.

    The server has a DeadlineInterceptor (1 s default, 2 s maximum) unless told otherwise;
    `client` is the channel's interceptors.
    """
    if server_interceptors is None:
        server_interceptors = [DeadlineInterceptor(default=1.0, maximum=2.0)]
    server = grpc.aio.server(interceptors=server_interceptors)
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", interceptors=client)
    try:
        yield channel
    finally:
        await channel.close()
        await server.stop(None)


async def remaining_of(call: Any, **kwargs: Any) -> dict[str, Any]:
    """Call Remaining and decode the answer."""
    result: dict[str, Any] = json.loads(await call(b"", **kwargs))
    return result


async def test_time_remaining_becomes_the_deadline(rig: Rig) -> None:
    """The caller's gRPC deadline, capped at the maximum, minus reserve, is the handler's."""
    seen = await remaining_of(rig.plain_call("Remaining"), timeout=0.8)
    assert 0.3 < seen["remaining"] <= 0.75  # the first call also connects the channel
    assert seen["remaining"] < seen["time_remaining"]
    capped = await remaining_of(rig.plain_call("Remaining"), timeout=60)
    assert 1.5 < capped["remaining"] <= 1.95
    a_year = 400 * 86400.0  # far past any sane deadline: still capped, not ignored
    for asked in ({"timeout": a_year}, {"metadata": ((wire.HEADER, "999999999999"),)}):
        capped = await remaining_of(rig.plain_call("Remaining"), **asked)
        assert 1.5 < capped["remaining"] <= 1.95


async def test_no_caller_deadline_uses_default(rig: Rig) -> None:
    """time_remaining() is None without a caller deadline: the default applies."""
    seen = await remaining_of(rig.plain_call("Remaining"))
    assert seen["time_remaining"] is None
    assert 0.8 < seen["remaining"] <= 0.95


async def test_metadata_header_is_honoured(rig: Rig) -> None:
    """An x-request-timeout-ms metadata entry shorter than the gRPC deadline wins."""
    seen = await remaining_of(
        rig.plain_call("Remaining"), timeout=5, metadata=((wire.HEADER, "400"),)
    )
    assert 0.2 < seen["remaining"] <= 0.35


async def test_deadline_aborts_with_deadline_exceeded(rig: Rig, events: Events) -> None:
    """The method's 0.3 s maximum cancels the handler and aborts with DEADLINE_EXCEEDED."""
    begin = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await rig.plain_call("Short")(b"short", timeout=5)
    took = time.monotonic() - begin
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "deadline exceeded after" in (info.value.details() or "")
    assert 0.24 <= took <= 0.25 + 0.5
    assert rig.service.cancelled == ["short"]
    finished = (await events.until_finished(1))[0]
    assert (finished.route, finished.outcome) == (f"/{SERVICE}/Short", "deadline")


async def test_expired_on_arrival_never_runs(rig: Rig, events: Events) -> None:
    """A caller deadline shorter than the reserve is aborted without running the handler."""
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await rig.plain_call("Slow")(b"x", timeout=0.02)
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    await asyncio.sleep(0.05)
    assert rig.service.calls.get("Slow") is None
    assert (await events.until_finished(1))[0].outcome == "budget_exhausted"


async def test_caller_cancel_cancels_handler(rig: Rig, events: Events) -> None:
    """When the caller cancels, the handler is cancelled and reported as caller_left."""
    call = rig.plain_call("Slow")(b"gone", timeout=5)
    await asyncio.sleep(0.2)
    call.cancel()
    for _ in range(100):
        if rig.service.cancelled:
            break
        await asyncio.sleep(0.01)
    assert rig.service.cancelled == ["gone"]
    assert (await events.until_finished(1))[0].outcome == "caller_left"


async def test_streaming_handler_under_deadline(rig: Rig) -> None:
    """A server-streaming handler runs under the deadline and is cut off by it."""
    call = rig.plain.unary_stream(f"/{SERVICE}/Ticks")
    items = [item async for item in call(b"3", timeout=2)]
    assert [item.split(b":")[0] for item in items] == [b"0", b"1", b"2"]
    with pytest.raises(grpc.aio.AioRpcError) as info:
        _ = [item async for item in call(b"100", timeout=0.3)]
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_stream_to_a_caller_not_reading_ends_at_the_deadline(
    rig: Rig, events: Events
) -> None:
    """Flow control blocks the writes: the deadline still ends the handler, not the caller.

    The caller does not read for 1.5 s (its own timeout is 10 s); the method's 0.3 s
    deadline closes the app's generator and finishes the request long before that, and
    the caller, reading at last, gets the queued messages and then DEADLINE_EXCEEDED.
    """
    begin = time.monotonic()
    call = rig.plain.unary_stream(f"/{SERVICE}/Flood")(b"", timeout=10)
    await asyncio.sleep(1.5)
    assert rig.service.closed, "the generator was not closed at the deadline"
    assert rig.service.closed[0] - begin < 1.0
    finished = events.finished(f"/{SERVICE}/Flood")
    assert [f.outcome for f in finished] == ["deadline"]
    assert finished[0].duration < 1.0
    received = 0
    with pytest.raises(grpc.aio.AioRpcError) as info:
        async for _ in call:
            received += 1
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert "deadline exceeded after" in (info.value.details() or "")
    assert received < 1000
    assert time.monotonic() - begin < 5.0  # well before the caller's own 10 s timeout


async def test_client_forwards_remaining_time(rig: Rig) -> None:
    """Inside a deadline, calls through the client interceptors carry what is left."""
    # Lower bounds far below the limits: a loaded machine may take a second per call.
    async with deadlines.scope(3.0):
        seen = await remaining_of(rig.smart_call("Remaining"))
        # Upper bounds a hair above: grpc rounds the timeout up and reads a cached clock
        # (3.008 s was seen from a 3 s scope).
        assert 1.5 < seen["time_remaining"] <= 3.05
        own = await remaining_of(rig.smart_call("Remaining"), timeout=1.0)
        assert 0.5 < own["time_remaining"] <= 1.05
    plain = await remaining_of(rig.plain_call("Remaining"))
    assert plain["time_remaining"] is None  # grpcio forwards nothing by itself


async def test_client_streams_forward_remaining(rig: Rig) -> None:
    """A streaming call through the interceptors carries the deadline too."""
    call = rig.smart.unary_stream(f"/{SERVICE}/Ticks")
    async with deadlines.scope(3.0):
        items = [item async for item in call(b"2")]
    left = float(items[0].split(b":")[1])
    assert 1.5 < left <= 2.95


async def test_client_fails_fast_below_min_useful(rig: Rig) -> None:
    """Below the dependency's min_useful nothing is sent: BudgetExhausted."""
    async with deadlines.scope(0.05):
        with pytest.raises(deadlines.BudgetExhausted):
            await rig.smart_call("Slow")(b"never")
    assert rig.service.calls.get("Slow") is None


async def test_client_maps_deadline_exceeded(rig: Rig) -> None:
    """Our DEADLINE_EXCEEDED becomes DeadlineExceeded or TotalTimeout, by the binding
    limit; the server's own, long before ours, stays grpc's error (not blamed on us)."""
    async with deadlines.scope(5):
        with pytest.raises(grpc.aio.AioRpcError) as theirs:
            await rig.smart_call("Short")(b"a")  # the server's own 0.3 s maximum fires
        assert theirs.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    with pytest.raises(deadlines.DeadlineExceeded):  # the caller's deadline binds
        async with deadlines.scope(0.3):
            await rig.smart_call("Slow")(b"c")
    async with deadlines.scope(5):
        with pytest.raises(deadlines.TotalTimeout) as own:
            await rig.smart_call("Slow")(b"b", timeout=0.2)  # the call's own timeout
        assert own.value.limit == pytest.approx(0.2)


async def test_http_handler_calls_grpc_with_same_budget(rig: Rig) -> None:
    """An HTTP handler's gRPC call carries the HTTP request's remaining budget."""

    async def handler(request: Request) -> JSONResponse:
        answer = json.loads(await rig.smart_call("Remaining")(b""))
        return JSONResponse({"http": deadlines.remaining(), "grpc": answer})

    app = Starlette(
        routes=[Route("/call", handler)],
        middleware=[Middleware(DeadlineMiddleware, default=1.0, maximum=5.0)],
    )
    async with uvicorn_in_loop(app) as url, httpx.AsyncClient() as client:
        response = await client.get(f"{url}/call", headers={wire.HEADER: "900"}, timeout=5)
    seen = response.json()
    assert 0.3 < seen["grpc"]["time_remaining"] <= 0.85
    assert seen["grpc"]["remaining"] < seen["grpc"]["time_remaining"]
    assert seen["http"] < seen["grpc"]["time_remaining"]


async def test_grpc_handler_calls_http_with_same_budget(rig: Rig) -> None:
    """A gRPC handler's HTTP call carries the RPC's remaining budget in the header."""

    async def remaining(request: Request) -> JSONResponse:
        return JSONResponse(
            {"header": request.headers.get(wire.HEADER), "remaining": deadlines.remaining()}
        )

    app = Starlette(
        routes=[Route("/remaining", remaining)],
        middleware=[Middleware(DeadlineMiddleware, default=3.0, maximum=5.0)],
    )
    async with uvicorn_in_loop(app) as url:
        rig.service.http_url = url
        seen = json.loads(await rig.plain_call("ViaHttp")(b"", timeout=0.9))
    assert 300 < int(seen["header"]) <= 850  # the RPC's budget, less time spent
    assert 0.2 < seen["remaining"] <= int(seen["header"]) / 1000


class OwnMethodHandler(grpc.RpcMethodHandler):
    """An app's own method handler class (grpc.RpcMethodHandler is public), no namedtuple."""

    def __init__(self, behavior: Any) -> None:
        self.request_streaming = False
        self.response_streaming = False
        self.request_deserializer = json.loads
        self.response_serializer = lambda answer: json.dumps(answer).encode()
        self.unary_unary = behavior
        self.unary_stream = self.stream_unary = self.stream_stream = None


class OwnGenericHandler(grpc.GenericRpcHandler):
    """Serves /test.Own/Hello with `OwnMethodHandler`."""

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        return OwnMethodHandler(self.hello) if details.method == "/test.Own/Hello" else None

    @staticmethod
    async def hello(request: dict[str, str], context: grpc.aio.ServicerContext) -> dict[str, Any]:
        return {"hello": request["name"], "remaining": deadlines.remaining()}


async def test_own_method_handler_class_is_wrapped(events: Events) -> None:
    """A handler that is not grpc's namedtuple runs under the deadline, its codecs kept."""
    async with served(OwnGenericHandler()) as channel:
        raw = await channel.unary_unary("/test.Own/Hello")(b'{"name": "you"}', timeout=5)
    answer = json.loads(raw)  # the app's deserializer and serializer still apply
    assert answer["hello"] == "you"
    assert 0.0 < answer["remaining"] <= 1.95  # the 2 s maximum, less the reserve
    assert [f.outcome for f in events.finished("/test.Own/Hello")] == ["ok"]


#: Statuses whose HTTP equivalent is 5xx; a handler answering any other is reported "ok".
ERROR_STATUSES = {
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DATA_LOSS,
}


async def answer_with(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    """Ends with the status the request names, by abort or by set_code and a return."""
    how, _, name = request.decode().partition(":")
    code = grpc.StatusCode[name]
    if how == "abort":
        await context.abort(code, "as asked")
    context.set_code(code)
    context.set_details("as asked")
    return b""


async def stream_then_abort(
    request: bytes, context: grpc.aio.ServicerContext
) -> AsyncIterator[bytes]:
    """A streaming reply that aborts with the named status after one message."""
    yield b"first"
    await context.abort(grpc.StatusCode[request.decode()], "as asked")


async def ended_with(call: Any) -> grpc.StatusCode:
    """The status `call` ended with, once its reply is read (an unread stream never ends)."""
    with contextlib.suppress(grpc.aio.AioRpcError):
        if isinstance(call, grpc.aio.UnaryStreamCall):
            _ = [item async for item in call]
        else:
            await call
    code: grpc.StatusCode = await call.code()
    return code


async def test_outcome_follows_the_status_however_it_is_set(events: Events) -> None:
    """abort(code) and set_code(code) give the same outcome: a 4xx-like answer is "ok"."""
    handler = grpc.method_handlers_generic_handler(
        "test.Answer",
        {
            "Unary": grpc.unary_unary_rpc_method_handler(answer_with),
            "Stream": grpc.unary_stream_rpc_method_handler(stream_then_abort),
        },
    )
    unary, stream = "/test.Answer/Unary", "/test.Answer/Stream"
    seen: dict[tuple[str, str], str] = {}
    expected: dict[tuple[str, str], str] = {}
    async with served(handler) as channel:
        for code in [c for c in grpc.StatusCode if c is not grpc.StatusCode.OK]:
            for how in ("abort", "set_code", "stream abort"):
                if how == "stream abort":
                    call = channel.unary_stream(stream)(code.name.encode(), timeout=5)
                else:
                    call = channel.unary_unary(unary)(f"{how}:{code.name}".encode(), timeout=5)
                assert await ended_with(call) == code  # the caller gets the status asked for
                finished = await events.until_finished(len(seen) + 1)
                assert finished[-1].route == (stream if how == "stream abort" else unary)
                seen[(how, code.name)] = finished[-1].outcome
                expected[(how, code.name)] = "error" if code in ERROR_STATUSES else "ok"
    assert seen == expected


async def test_unknown_method_is_reported_under_star(rig: Rig, events: Events) -> None:
    """An RPC for no known method: one start and one "error" finish, route "*"."""
    asked = ((wire.HEADER, "700"),)
    for method, metadata in ((f"/{SERVICE}/Nope", asked), ("/no.Such/Service", ())):
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await rig.plain.unary_unary(method)(b"", timeout=5, metadata=metadata)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
    # Reported before grpc answers, so already there.
    started = [e for e in events.items if isinstance(e, deadlines.RequestStarted)]
    assert [e.route for e in started] == ["*", "*"]
    # The header's 700 ms or the 1 s default, less the 50 ms reserve.
    assert [e.budget for e in started] == [pytest.approx(0.65), pytest.approx(0.95)]
    finished = events.finished()
    assert [(f.route, f.outcome) for f in finished] == [("*", "error"), ("*", "error")]
    assert [f.budget for f in finished] == [pytest.approx(0.65), pytest.approx(0.95)]
    assert all(0.0 <= f.duration < 1.0 for f in finished)


def test_options_validated() -> None:
    """Bad options fail at construction."""
    with pytest.raises(ValueError, match="default"):
        DeadlineInterceptor(default=3, maximum=2)
    with pytest.raises(TypeError, match="Dependency"):
        client_interceptors(dependency="pricing")  # type: ignore[arg-type]
    assert len(deadlines.grpc.client_interceptors()) == 4
