"""Fixtures for the stream tests: the local misbehaving LLM endpoint and clients for it."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest
from llm_stream_server import Registry, serve

from deadlines import Dependency


@pytest.fixture(scope="session")
def llm() -> Iterator[tuple[str, Registry]]:
    """The local OpenAI-compatible streaming endpoint: (base URL, what it saw)."""
    with serve() as server:
        yield server


@pytest.fixture
def test_id() -> str:
    """A unique request id, sent as ``x-test-id`` so the server's record can be found."""
    return uuid.uuid4().hex


@pytest.fixture
async def httpx_client() -> AsyncIterator[object]:
    """An httpx client for loopback only (no proxies from the environment)."""
    import httpx

    async with httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(10.0)) as client:
        yield client


#: The dependency the openai SDK's own client is bounded by, through deadlines.httpx2.
LLM = Dependency("openai", connect=1.0, headers=10.0, idle=15.0, total=120.0)


@pytest.fixture(params=["sdk", "deadlines"])
async def openai_client(
    llm: tuple[str, Registry], request: pytest.FixtureRequest
) -> AsyncIterator[object]:
    """The openai SDK pointed at the local endpoint: dummy key, no retries, no proxies.

    Its HTTP client is the SDK's own, or `deadlines.httpx2.AsyncClient` (the SDK runs on
    httpx2): the guard's behaviour must not depend on which.
    """
    import openai

    import deadlines.httpx2

    url, _ = llm
    http_client = (
        openai.DefaultAsyncHttpxClient(trust_env=False)
        if request.param == "sdk"
        else deadlines.httpx2.AsyncClient(LLM, trust_env=False)
    )
    client = openai.AsyncOpenAI(
        base_url=f"{url}/v1",
        api_key="dummy",
        max_retries=0,
        timeout=10.0,
        http_client=http_client,
    )
    async with client:
        yield client


@pytest.fixture(autouse=True)
def no_stream_threads_left() -> Iterator[None]:
    """Every test leaves no `guard_sync` helper thread behind."""
    yield
    give_up = time.monotonic() + 3.0
    while any(t.name.startswith("deadlines-stream") for t in threading.enumerate()):
        assert time.monotonic() < give_up, "a guard_sync helper thread was left running"
        time.sleep(0.01)
