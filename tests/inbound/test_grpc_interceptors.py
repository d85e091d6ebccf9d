"""Our gRPC interceptors beside other interceptors, and calls used in every way grpc.aio allows.

Real grpc.aio servers and channels on loopback; generic handlers with raw bytes. These
failed before their fixes: an outer tracing-style interceptor broke
every server-streaming RPC, the server's budget started when the handler did (not at
arrival), a unary call raised out of `continuation` (an outer retry could not read
its status), `code()` raised after DEADLINE_EXCEEDED, and a response stream cancelled
half-read was never reported finished. The rest guard the same changes (the other
interceptor order, one report per call).
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
import pytest

import deadlines
from deadlines import wire
from deadlines.grpc import DeadlineInterceptor, client_interceptors

from .conftest import Events
from .test_grpc import served

pytestmark = [pytest.mark.anyio, pytest.mark.realtime]

SERVICE = "test.Mixed"


class Tracing(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """An outer interceptor wrapping streaming behaviours as tracing ones do: it iterates them."""

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = await continuation(details)
        if handler is None or not handler.response_streaming:
            return handler
        kind = "stream_stream" if handler.request_streaming else "unary_stream"
        behavior = getattr(handler, kind)

        async def traced(request: Any, context: Any) -> AsyncIterator[Any]:
            async for response in behavior(request, context):
                yield response

        return handler._replace(**{kind: traced})


class Slow(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """An inner interceptor that spends 0.8 s before the handler (an auth lookup, say)."""

    async def intercept_service(self, continuation: Any, details: Any) -> Any:
        await asyncio.sleep(0.8)
        return await continuation(details)


async def ticks(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    """Unary-stream: three messages, each naming whether the handler has a deadline."""
    for i in range(3):
        yield b"%d:%d" % (i, deadlines.current() is not None)


async def echo(requests: AsyncIterator[bytes], context: Any) -> AsyncIterator[bytes]:
    """Stream-stream: every message back."""
    async for item in requests:
        yield item


async def hold(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    """Unary-unary that waits for the deadline."""
    await asyncio.sleep(10)
    return b"late"


async def endless(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    """Unary-stream that never ends by itself."""
    while True:
        yield b"x"
        await asyncio.sleep(0.01)


async def expire(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    """Unary-unary answering DEADLINE_EXCEEDED of its own, long before the caller's."""
    await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "server says so")
    return b""


class Flaky:
    """Unary-unary failing UNAVAILABLE on its first call, then answering (`behavior`)."""

    def __init__(self) -> None:
        self.calls = 0

    async def behavior(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        self.calls += 1
        if self.calls == 1:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "try again")
        return b"ok"


def handlers(flaky: Flaky | None = None) -> grpc.GenericRpcHandler:
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Ticks": grpc.unary_stream_rpc_method_handler(ticks),
            "Echo": grpc.stream_stream_rpc_method_handler(echo),
            "Hold": grpc.unary_unary_rpc_method_handler(hold),
            "Endless": grpc.unary_stream_rpc_method_handler(endless),
            "Expire": grpc.unary_unary_rpc_method_handler(expire),
            "Flaky": grpc.unary_unary_rpc_method_handler((flaky or Flaky()).behavior),
        },
    )


class Retry(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """An outer client interceptor retrying UNAVAILABLE once, by grpc.aio's contract:
    ``call = await continuation(...)``, then ``await call.code()``."""

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        call = await continuation(details, request)
        if await call.code() == grpc.StatusCode.UNAVAILABLE:
            call = await continuation(details, request)
        return call


async def messages(*items: bytes) -> AsyncIterator[bytes]:
    for item in items:
        yield item


@pytest.mark.parametrize("outer_first", [True, False], ids=["tracing-outside", "tracing-inside"])
async def test_streaming_rpcs_work_under_a_tracing_interceptor(outer_first: bool) -> None:
    """Streaming behaviours keep their shape (async generators), so an interceptor
    iterating them works on either side of ours, and the handler still has its deadline."""
    ours = DeadlineInterceptor(default=2.0, maximum=5.0)
    order = [Tracing(), ours] if outer_first else [ours, Tracing()]
    async with served(handlers(), server_interceptors=order) as channel:
        ticked = [m async for m in channel.unary_stream(f"/{SERVICE}/Ticks")(b"", timeout=5)]
        echoed = channel.stream_stream(f"/{SERVICE}/Echo")(messages(b"a", b"b"), timeout=5)
        assert [m async for m in echoed] == [b"a", b"b"]
    assert ticked == [b"0:1", b"1:1", b"2:1"]


async def test_the_server_budget_counts_from_arrival(events: Events) -> None:
    """Time spent before the handler (an inner interceptor's 0.8 s) is spent from the
    budget: a 1 s budget ends ~0.95 s after arrival, not 0.95 s after the handler began."""
    ours = DeadlineInterceptor(default=1.0, maximum=1.0)
    async with served(handlers(), server_interceptors=[ours, Slow()]) as channel:
        for metadata in ([(wire.HEADER, "1000")], None):
            begin = time.monotonic()
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await channel.unary_unary(f"/{SERVICE}/Hold")(b"", timeout=10, metadata=metadata)
            took = time.monotonic() - begin
            assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert 0.85 < took < 1.5, took  # was ~1.75 s
    finished = [e for e in events.items if isinstance(e, deadlines.RequestFinished)]
    assert [e.outcome for e in finished] == ["deadline", "deadline"]
    assert all(0.85 < e.duration < 1.4 for e in finished), finished


async def test_an_outer_retry_interceptor_reads_the_status_and_retries() -> None:
    """`continuation` returns the call, as grpc.aio's contract has it; it does not raise."""
    flaky = Flaky()
    client = [Retry(), *client_interceptors(dependency=deadlines.Dependency("mixed"))]
    async with served(handlers(flaky), server_interceptors=[], client=client) as channel:
        for scoped in (False, True):
            flaky.calls = 0
            async with deadlines.scope(5.0 if scoped else None):
                assert await channel.unary_unary(f"/{SERVICE}/Flaky")(b"") == b"ok"
            assert flaky.calls == 2


async def test_a_failed_unary_call_still_answers_its_status() -> None:
    """After DEADLINE_EXCEEDED (the server's own, or our timeout) code(), details() and
    trailing_metadata() answer as grpc's own call does; only awaiting it raises."""
    client = client_interceptors(dependency=deadlines.Dependency("mixed"))
    async with served(handlers(), server_interceptors=[], client=client) as channel:
        theirs = channel.unary_unary(f"/{SERVICE}/Expire")(b"")
        with pytest.raises(grpc.aio.AioRpcError):
            await theirs
        assert await theirs.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert await theirs.details() == "server says so"
        assert await theirs.trailing_metadata() is not None
        ours = channel.unary_unary(f"/{SERVICE}/Hold")(b"", timeout=0.2)
        with pytest.raises(deadlines.TotalTimeout):
            await ours
        assert await ours.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        only_status = channel.unary_unary(f"/{SERVICE}/Hold")(b"", timeout=0.2)
        assert await only_status.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_a_stream_cancelled_or_dropped_half_read_is_reported(events: Events) -> None:
    """A response stream the caller cancels, or breaks out of and drops, is reported
    finished (cancelled) when the call ends, without waiting for the garbage collector."""
    client = client_interceptors(dependency=deadlines.Dependency("mixed"))
    starts: list[Callable[[grpc.aio.Channel], Any]] = [
        lambda channel: channel.unary_stream(f"/{SERVICE}/Endless")(b""),
        lambda channel: channel.stream_stream(f"/{SERVICE}/Echo")(messages(b"a", b"b")),
    ]

    async def read_one_and_cancel(call: Any) -> None:
        async for _ in call:
            break
        call.cancel()

    gc.disable()  # a report that needed the collector would not come
    try:
        async with served(handlers(), server_interceptors=[], client=client) as channel:
            for start in starts:
                await read_one_and_cancel(start(channel))
            await until(lambda: len(finished(events)) == 2)
    finally:
        gc.enable()
    assert [e.outcome for e in finished(events)] == ["cancelled", "cancelled"]


def finished(events: Events) -> list[deadlines.CallFinished]:
    return [e for e in events.items if isinstance(e, deadlines.CallFinished)]


async def until(condition: Callable[[], bool], within: float = 5.0) -> None:
    end = time.monotonic() + within
    while not condition():
        assert time.monotonic() < end, "not within the time allowed"
        await asyncio.sleep(0.01)


async def test_unary_call_reported_once_however_used(events: Events) -> None:
    """Awaited, awaited twice, or only its status read: one start, one finish each."""
    client = client_interceptors(dependency=deadlines.Dependency("mixed"))
    async with served(handlers(), server_interceptors=[], client=client) as channel:
        call: Awaitable[bytes] = channel.unary_unary(f"/{SERVICE}/Flaky")(b"")
        with pytest.raises(grpc.aio.AioRpcError):
            await call
        with pytest.raises(grpc.aio.AioRpcError):
            await call
        assert await channel.unary_unary(f"/{SERVICE}/Flaky")(b"").code() == grpc.StatusCode.OK
        await until(lambda: len(finished(events)) == 2)
    started = [e for e in events.items if isinstance(e, deadlines.CallStarted)]
    assert len(started) == 2
    assert [e.outcome for e in finished(events)] == ["error", "ok"]
