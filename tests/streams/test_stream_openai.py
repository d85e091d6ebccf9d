"""`streams.guard` and `streams.failover` on the openai SDK's async stream.

The SDK talks to the local OpenAI-compatible endpoint (dummy key, no retries), which can
stall before the response starts, before the first token, or mid-answer.
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
MESSAGES = [{"role": "user", "content": "Say hello"}]


def create(client: Any, mode: str, test_id: str) -> Any:
    """The SDK's streaming call, not yet awaited (so the guard times the opening too)."""
    return client.chat.completions.create(
        model=mode, messages=MESSAGES, stream=True, extra_headers={"x-test-id": test_id}
    )


def text_of(chunks: list[Any]) -> str:
    return "".join(chunk.choices[0].delta.content or "" for chunk in chunks)


async def was_closed(llm: Server, test_id: str) -> bool:
    closed_at = await anyio.to_thread.run_sync(llm[1].wait_closed, test_id)
    return closed_at is not None


async def test_healthy_answer_streams_through(openai_client: Any, test_id: str) -> None:
    """A healthy answer arrives whole through the guard, as SDK chunk objects."""
    chunks = [
        chunk
        async for chunk in streams.guard(
            create(openai_client, "ok", test_id), first=2, idle=2, total=10, name="openai"
        )
    ]
    assert text_of(chunks) == "Hello, world! Bye."


@pytest.mark.parametrize("mode", ["stall-headers", "stall-first"])
async def test_no_first_token_raises_and_closes(
    openai_client: Any, llm: Server, test_id: str, mode: str
) -> None:
    """No first token (no response at all, or headers only): FirstItemTimeout, closed."""
    started = time.monotonic()
    with pytest.raises(streams.FirstItemTimeout) as info:
        async for _ in streams.guard(
            create(openai_client, mode, test_id), first=0.3, idle=5, total=10, name="openai"
        ):
            pass
    assert 0.29 <= time.monotonic() - started <= 0.9
    assert info.value.dependency == "openai"
    assert await was_closed(llm, test_id)


async def test_stall_mid_answer_raises_idle_and_closes(
    openai_client: Any, llm: Server, test_id: str
) -> None:
    """Tokens then silence: the partial answer, then StreamIdleTimeout, connection closed."""
    chunks: list[Any] = []
    with pytest.raises(streams.StreamIdleTimeout):
        async for chunk in streams.guard(
            create(openai_client, "stall-mid", test_id), first=2, idle=0.3, total=10
        ):
            chunks.append(chunk)
    assert text_of(chunks) == "Hello, world"
    assert await was_closed(llm, test_id)


async def test_early_stop_closes_the_sdk_stream(
    openai_client: Any, llm: Server, test_id: str
) -> None:
    """Leaving the loop early closes the SDK's stream and its connection."""
    async for chunk in streams.guard(
        create(openai_client, "trickle", test_id), first=2, idle=2, total=10
    ):
        assert chunk.choices[0].delta.content == "tick"
        break
    assert await was_closed(llm, test_id)


async def test_failover_to_second_provider_inside_the_deadline(
    llm: Server, openai_client: Any, test_id: str
) -> None:
    """Provider A does not start in time: B answers the same prompt, inside the deadline."""
    started = time.monotonic()
    async with deadlines.scope(3.0):
        chunks = [
            chunk
            async for chunk in streams.failover(
                {
                    "provider-a": lambda: create(openai_client, "stall-first", f"{test_id}-a"),
                    "provider-b": lambda: create(openai_client, "ok", f"{test_id}-b"),
                },
                first=0.4,
                idle=2,
                total=10,
            )
        ]
        left = deadlines.remaining()
    assert text_of(chunks) == "Hello, world! Bye."
    assert 0.39 <= time.monotonic() - started <= 1.6
    assert left > 1.0
    assert await was_closed(llm, f"{test_id}-a")  # A's stream was ended, not left running
    assert llm[1].get(f"{test_id}-a").tokens == 0


async def test_no_failover_once_the_answer_started(openai_client: Any, test_id: str) -> None:
    """A provider that stalls mid-answer is not replaced: the user already saw tokens."""
    calls: list[str] = []

    def backup() -> Any:
        calls.append("b")
        return create(openai_client, "ok", f"{test_id}-b")

    with pytest.raises(streams.StreamIdleTimeout):
        async for _ in streams.failover(
            {"a": lambda: create(openai_client, "stall-mid", test_id), "b": backup},
            first=1,
            idle=0.3,
            total=10,
        ):
            pass
    assert calls == []


async def test_failover_gives_up_when_every_provider_is_slow(
    openai_client: Any, test_id: str
) -> None:
    """With every provider slow to start, the last FirstItemTimeout is raised, bounded."""
    started = time.monotonic()
    with pytest.raises(streams.FirstItemTimeout) as info:
        async for _ in streams.failover(
            {
                "a": lambda: create(openai_client, "stall-first", f"{test_id}-a"),
                "b": lambda: create(openai_client, "stall-headers", f"{test_id}-b"),
            },
            first=0.25,
            idle=1,
            total=10,
        ):
            pass
    assert info.value.dependency == "b"
    assert 0.49 <= time.monotonic() - started <= 1.5


async def test_failover_respects_the_request_deadline(openai_client: Any, test_id: str) -> None:
    """The deadline bounds the whole fail-over: a late second attempt is cut at the deadline."""
    started = time.monotonic()
    with pytest.raises(deadlines.DeadlineExceeded):
        async with deadlines.scope(0.6):
            async for _ in streams.failover(
                {
                    "a": lambda: create(openai_client, "stall-first", f"{test_id}-a"),
                    "b": lambda: create(openai_client, "slow-first:5", f"{test_id}-b"),
                },
                first=0.4,
                idle=1,
                total=10,
            ):
                pass
    assert 0.59 <= time.monotonic() - started <= 1.3


def test_failover_needs_a_provider() -> None:
    """An empty provider mapping is a ValueError when iteration starts."""

    async def main() -> None:
        async for _ in streams.failover({}, first=1, idle=1, total=1):
            pass

    with pytest.raises(ValueError, match="at least one provider"):
        anyio.run(main)


async def test_a_stream_that_never_ends_is_cut_at_its_total(
    openai_client: Any, llm: Server, test_id: str
) -> None:
    """Tokens forever, each on time: only the total ends it, and the connection closes."""
    started = time.monotonic()
    chunks: list[Any] = []
    with pytest.raises(deadlines.TotalTimeout):
        async for chunk in streams.guard(
            create(openai_client, "trickle", test_id), first=2, idle=2, total=0.6, name="openai"
        ):
            chunks.append(chunk)
    assert 0.59 <= time.monotonic() - started <= 1.4
    assert len(chunks) >= 3
    assert await was_closed(llm, test_id)


async def test_the_caller_leaving_closes_the_providers_stream(
    openai_client: Any, llm: Server, test_id: str
) -> None:
    """The consuming task is cancelled mid-answer (its caller left): the stream is closed."""
    chunks: list[Any] = []

    async def consume() -> None:
        async for chunk in streams.guard(
            create(openai_client, "trickle", test_id), first=2, idle=2, total=10
        ):
            chunks.append(chunk)

    async with anyio.create_task_group() as tasks:
        tasks.start_soon(consume)
        with anyio.fail_after(5):
            while len(chunks) < 2:
                await anyio.sleep(0.01)
        tasks.cancel_scope.cancel()
    assert await was_closed(llm, test_id)
