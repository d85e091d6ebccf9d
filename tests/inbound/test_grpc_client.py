"""gRPC client interceptors on a real grpc.aio server: every call shape keeps its call API.

The server is a plain grpc.aio one (no deadlines interceptor), as most downstreams are,
so what the client sees is the client interceptors' doing. Generic handlers with raw
bytes: no generated code.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
import pytest

import deadlines
from deadlines.grpc import client_interceptors

from .conftest import Events
from .test_grpc import served

pytestmark = [pytest.mark.anyio, pytest.mark.realtime]

SERVICE = "test.Upload"


class Upload:
    """Handlers that report the deadline they were sent, and ones that hold on."""

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.cancelled: list[bytes] = []

    async def count(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> bytes:
        """Stream-unary: how many messages came, and the caller's gRPC deadline."""
        count = 0
        async for _ in requests:
            count += 1
        context.set_trailing_metadata((("counted", str(count)),))
        return json.dumps({"count": count, "time_remaining": context.time_remaining()}).encode()

    async def expire(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> bytes:
        """Stream-unary answering DEADLINE_EXCEEDED, as a server whose deadline passed does."""
        async for _ in requests:
            pass
        await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline passed here")

    async def echo(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        """Unary-unary with trailing metadata."""
        context.set_trailing_metadata((("echoed", request.decode()),))
        return request

    async def _hold(self, request: bytes) -> None:
        self.received.append(request)
        try:
            await asyncio.sleep(10)  # cut short by the caller (or the server's stop)
        except asyncio.CancelledError:
            self.cancelled.append(request)
            raise

    async def hold(self, request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await self._hold(request)
        return b"late"

    async def hold_stream(
        self, request: bytes, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        await self._hold(request)
        yield b"late"

    async def hold_upload(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> bytes:
        await self._hold(b"".join([item async for item in requests]))
        return b"late"

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            SERVICE,
            {
                "Count": grpc.stream_unary_rpc_method_handler(self.count),
                "Expire": grpc.stream_unary_rpc_method_handler(self.expire),
                "Echo": grpc.unary_unary_rpc_method_handler(self.echo),
                "Hold": grpc.unary_unary_rpc_method_handler(self.hold),
                "HoldStream": grpc.unary_stream_rpc_method_handler(self.hold_stream),
                "HoldUpload": grpc.stream_unary_rpc_method_handler(self.hold_upload),
            },
        )

    async def until_received(self, count: int) -> None:
        """Wait (5 s at most) until `count` requests have reached a Hold handler."""
        end = time.monotonic() + 5.0
        while len(self.received) < count:
            assert time.monotonic() < end, f"only {self.received} arrived"
            await asyncio.sleep(0.005)


@pytest.fixture
async def upload() -> AsyncIterator[tuple[Upload, grpc.aio.Channel]]:
    """A plain grpc.aio server and a connected channel through the client interceptors."""
    service = Upload()
    client = client_interceptors(dependency=deadlines.Dependency("upload"))
    async with served(service.handler(), server_interceptors=[], client=client) as channel:
        await asyncio.wait_for(channel.channel_ready(), 10)
        yield service, channel


async def messages(*items: bytes) -> AsyncIterator[bytes]:
    """A request iterator."""
    for item in items:
        yield item


async def test_stream_unary_with_a_request_iterator(
    upload: tuple[Upload, grpc.aio.Channel],
) -> None:
    """The response comes back with the remaining time sent, and the call keeps its API."""
    _, channel = upload
    count = channel.stream_unary(f"/{SERVICE}/Count")
    async with deadlines.scope(3.0):
        call = count(messages(b"a", b"b", b"c"))
        seen = json.loads(await call)
    assert seen["count"] == 3
    # grpc rounds the timeout up and reads a cached clock: a hair above the 3 s scope.
    assert 1.5 < seen["time_remaining"] <= 3.05
    assert await call.code() == grpc.StatusCode.OK
    assert (await call.trailing_metadata())["counted"] == "3"
    assert call.done() and not call.cancelled()
    # Outside any deadline the dependency's total (30 s by default) caps the call, even
    # one with a longer timeout of its own (grpc-timeout rounds 30 s up by up to 0.1 s).
    seen = json.loads(await count(messages(b"a"), timeout=3600))
    assert seen["count"] == 1
    assert 15.0 < seen["time_remaining"] <= 30.2


async def test_stream_unary_with_write_and_done_writing(
    upload: tuple[Upload, grpc.aio.Channel],
) -> None:
    """The write()/done_writing() form answers at once, in a deadline and out of one."""
    _, channel = upload
    count = channel.stream_unary(f"/{SERVICE}/Count")
    async with deadlines.scope(3.0):
        call = count()
        await call.write(b"a")
        await call.write(b"b")
        await call.done_writing()
        seen = json.loads(await call)
    assert seen["count"] == 2
    assert 1.5 < seen["time_remaining"] <= 3.05
    begin = time.monotonic()
    call = count(timeout=3.0)  # the call's own timeout, outside any deadline
    await call.write(b"a")
    await call.done_writing()
    seen = json.loads(await call)
    assert seen["count"] == 1
    assert 1.5 < seen["time_remaining"] <= 3.05
    assert time.monotonic() - begin < 2.0  # answered, not held until the timeout


async def test_stream_unary_deadline_exceeded_is_translated(
    upload: tuple[Upload, grpc.aio.Channel],
) -> None:
    """Our DEADLINE_EXCEEDED becomes DeadlineExceeded or TotalTimeout, by the binding
    limit; the server's own (its handler's limit, long before ours) stays grpc's error."""
    _, channel = upload
    async with deadlines.scope(5.0):
        call = channel.stream_unary(f"/{SERVICE}/Expire")(messages(b"a"))
        with pytest.raises(grpc.aio.AioRpcError) as theirs:
            await call
        assert theirs.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert await call.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # still the call's
    with pytest.raises(deadlines.DeadlineExceeded) as deadline:
        async with deadlines.scope(0.3):
            await channel.stream_unary(f"/{SERVICE}/HoldUpload")(messages(b"a"))
    assert deadline.value.request_sent is True
    async with deadlines.scope(5.0):
        call = channel.stream_unary(f"/{SERVICE}/HoldUpload")(messages(b"b"), timeout=0.3)
        with pytest.raises(deadlines.TotalTimeout) as own:
            await call
        assert own.value.limit == pytest.approx(0.3)
        assert await call.code() == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_unary_unary_call_keeps_its_api(upload: tuple[Upload, grpc.aio.Channel]) -> None:
    """A unary call's metadata and status are the real call's; cancel() cancels the RPC."""
    service, channel = upload
    call = channel.unary_unary(f"/{SERVICE}/Echo")(b"hi")
    assert await call == b"hi"
    assert (await call.trailing_metadata())["echoed"] == "hi"
    assert await call.code() == grpc.StatusCode.OK
    held = channel.unary_unary(f"/{SERVICE}/Hold")(b"held")
    await service.until_received(1)
    assert held.cancel()
    with pytest.raises(asyncio.CancelledError):
        await held
    assert held.cancelled()
    for _ in range(500):  # the server learns of it over the wire
        if service.cancelled:
            break
        await asyncio.sleep(0.01)
    assert service.cancelled == [b"held"]


async def drain(call: Any) -> list[Any]:
    """Every message of a streaming reply."""
    return [item async for item in call]


async def test_a_call_cut_by_the_deadline_counts_as_sent(
    upload: tuple[Upload, grpc.aio.Channel], events: Events
) -> None:
    """Once started, a call the request's deadline cuts short may have been received.

    So the error and the CallFinished event say it was sent (body phase), not retry-safe.
    """
    service, channel = upload
    shapes: dict[str, Callable[[], Awaitable[Any]]] = {
        "unary-unary": lambda: channel.unary_unary(f"/{SERVICE}/Hold")(b"uu"),
        "unary-stream": lambda: drain(channel.unary_stream(f"/{SERVICE}/HoldStream")(b"us")),
        "stream-unary": lambda: channel.stream_unary(f"/{SERVICE}/HoldUpload")(messages(b"su")),
    }
    for shape, start in shapes.items():
        with pytest.raises(deadlines.DeadlineExceeded) as info:
            async with deadlines.scope(1.0):
                await start()
        error = info.value
        assert (shape, error.phase, error.request_sent, error.retry_safe) == (
            shape,
            "body",
            True,
            False,
        )
    await service.until_received(3)  # and the server did receive every one
    finished = [e for e in events.items if isinstance(e, deadlines.CallFinished)]
    assert [(e.dependency, e.outcome, e.phase, e.request_sent) for e in finished] == [
        ("upload", "deadline", "body", True)
    ] * 3


async def test_unary_unary_is_reported_however_it_is_used(
    upload: tuple[Upload, grpc.aio.Channel], events: Events
) -> None:
    """A unary call whose response nobody awaits (only its status read, or only a done
    callback) is still reported, once, with its outcome: its deadline cut included."""
    _, channel = upload
    ok = channel.unary_unary(f"/{SERVICE}/Echo")(b"hi")
    assert await ok.code() == grpc.StatusCode.OK
    done = asyncio.Event()
    called = channel.unary_unary(f"/{SERVICE}/Echo")(b"again")
    called.add_done_callback(lambda _: done.set())
    await asyncio.wait_for(done.wait(), 5)
    with pytest.raises(deadlines.DeadlineExceeded):  # the scope's deadline cuts code()
        async with deadlines.scope(0.3):
            await channel.unary_unary(f"/{SERVICE}/Hold")(b"cut").code()
    twice = channel.unary_unary(f"/{SERVICE}/Echo")(b"twice")
    assert (await twice, await twice) == (b"twice", b"twice")
    # The cut call is reported when grpc ends it (its timeout, the scope's instant):
    # that may come after the last call's report.
    end = time.monotonic() + 5.0
    while len([e for e in events.items if isinstance(e, deadlines.CallFinished)]) < 4:
        assert time.monotonic() < end
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)  # and no fifth
    started = [e for e in events.items if isinstance(e, deadlines.CallStarted)]
    finished = [e for e in events.items if isinstance(e, deadlines.CallFinished)]
    assert len(started) == 4
    assert sorted(e.outcome for e in finished) == ["deadline", "ok", "ok", "ok"]
