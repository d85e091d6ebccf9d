"""`streams.guard` on real sockets: httpx streamed responses from a local SSE server.

Every failure case asserts that the server saw the connection close: the provider's
stream really ended, it was not merely abandoned.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import pytest
from llm_stream_server import Registry

import deadlines
from deadlines import streams

pytestmark = [pytest.mark.anyio, pytest.mark.realtime]

Server = tuple[str, Registry]


async def open_stream(client: Any, llm: Server, mode: str, test_id: str) -> Any:
    """Send a streaming chat request; return the response with its body unread."""
    url, _ = llm
    request = client.build_request(
        "POST",
        f"{url}/v1/chat/completions",
        json={"model": mode, "messages": [], "stream": True},
        headers={"x-test-id": test_id},
    )
    return await client.send(request, stream=True)


async def closed_after(llm: Server, test_id: str, started: float) -> float:
    """Seconds from `started` until the server saw the client close (fails if it did not)."""
    _, registry = llm
    closed_at = await anyio.to_thread.run_sync(registry.wait_closed, test_id)
    assert closed_at is not None, "the server never saw the connection close"
    return closed_at - started


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_healthy_sse_stream_passes_through(anyio_backend: str, llm: Server) -> None:
    """A healthy SSE stream comes through `aiter_lines` whole, under asyncio and trio."""
    import httpx

    url, _ = llm
    body = {"model": "ok", "messages": [], "stream": True}
    async with (
        httpx.AsyncClient(trust_env=False) as client,
        client.stream("POST", f"{url}/v1/chat/completions", json=body) as response,
    ):
        lines = [
            line async for line in streams.guard(response.aiter_lines(), first=2, idle=2, total=10)
        ]
    data = [line for line in lines if line.startswith("data: ")]
    assert len(data) == 7 and data[-1] == "data: [DONE]"


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_stall_before_first_token_closes_connection(
    anyio_backend: str, llm: Server, test_id: str
) -> None:
    """No first event within `first`: FirstItemTimeout on time, and the server sees the close."""
    import httpx

    async with httpx.AsyncClient(trust_env=False) as client:
        response = await open_stream(client, llm, "stall-first", test_id)
        started = time.monotonic()
        with pytest.raises(streams.FirstItemTimeout):
            async for _ in streams.guard(response.aiter_lines(), first=0.3, idle=5, total=10):
                pass
        elapsed = time.monotonic() - started
        assert 0.29 <= elapsed <= 0.8
        # Not closed by httpx's context manager: there is none here. The guard did it.
        assert await closed_after(llm, test_id, started) <= elapsed + 0.5


async def test_stall_mid_answer_raises_idle_and_closes(
    llm: Server, test_id: str, httpx_client: Any
) -> None:
    """Three tokens then silence: StreamIdleTimeout after `idle`, connection closed."""
    response = await open_stream(httpx_client, llm, "stall-mid", test_id)
    chunks: list[bytes] = []
    started = time.monotonic()
    with pytest.raises(streams.StreamIdleTimeout):
        async for chunk in streams.guard(response.aiter_bytes(), first=2, idle=0.3, total=10):
            chunks.append(chunk)
    assert b"".join(chunks).count(b"data: ") == 3
    assert 0.29 <= time.monotonic() - started <= 1.0
    assert await closed_after(llm, test_id, started) <= 1.5
    assert llm[1].get(test_id).tokens == 3


async def test_trickle_forever_is_stopped_by_total(
    llm: Server, test_id: str, httpx_client: Any
) -> None:
    """A stream that trickles inside `idle` forever is ended by `total`, connection closed."""
    response = await open_stream(httpx_client, llm, "trickle", test_id)
    started = time.monotonic()
    with pytest.raises(deadlines.TotalTimeout):
        async for _ in streams.guard(response.aiter_lines(), first=1, idle=1, total=0.6):
            pass
    assert 0.59 <= time.monotonic() - started <= 1.2
    assert await closed_after(llm, test_id, started) <= 1.7
    sent = llm[1].get(test_id).tokens
    time.sleep(0.2)
    assert llm[1].get(test_id).tokens == sent  # nothing more is sent (or paid for)


async def test_request_deadline_ends_the_stream(
    llm: Server, test_id: str, httpx_client: Any
) -> None:
    """Inside a request deadline shorter than `total`, the stream ends at the deadline."""
    started = time.monotonic()
    with pytest.raises(deadlines.DeadlineExceeded):
        async with deadlines.scope(0.5):
            response = await open_stream(httpx_client, llm, "trickle", test_id)
            async for _ in streams.guard(response.aiter_lines(), first=1, idle=1, total=30):
                pass
    assert 0.49 <= time.monotonic() - started <= 1.1
    assert await closed_after(llm, test_id, started) <= 1.6


async def test_break_closes_the_connection(llm: Server, test_id: str, httpx_client: Any) -> None:
    """A consumer that stops early with a bare break ends the provider's stream (asyncio)."""
    response = await open_stream(httpx_client, llm, "trickle", test_id)
    started = time.monotonic()
    count = 0
    async for line in streams.guard(response.aiter_lines(), first=1, idle=1, total=30):
        count += line.startswith("data: ")
        if count == 2:
            break
    assert await closed_after(llm, test_id, started) <= 1.5


async def test_close_callback_closes_the_response(
    llm: Server, test_id: str, httpx_client: Any
) -> None:
    """`close=response.aclose` closes the response itself when the guard ends."""
    response = await open_stream(httpx_client, llm, "stall-mid", test_id)
    with pytest.raises(streams.StreamIdleTimeout):
        async for _ in streams.guard(
            response.aiter_raw(), first=2, idle=0.2, total=5, close=response.aclose
        ):
            pass
    assert response.is_closed
    assert await closed_after(llm, test_id, time.monotonic()) <= 1.0
