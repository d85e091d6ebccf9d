"""A local OpenAI-compatible streaming endpoint that misbehaves on request, for stream tests.

`POST /v1/chat/completions` answers with Server-Sent Events the way an LLM provider
streams tokens. The request's ``model`` picks the behaviour:

* ``ok`` — five tokens 10 ms apart, then ``[DONE]``;
* ``slow-first:<s>`` — the first token after <s> seconds, then like ``ok``;
* ``stall-headers`` — never starts the response;
* ``stall-first`` — sends the response headers, then nothing;
* ``stall-mid`` — three tokens, then silence;
* ``trickle`` — one token every 50 ms, forever.

It is a pure ASGI app run by uvicorn on its own thread, so asyncio and trio tests share
it. It records, per ``x-test-id`` header, how many tokens it sent and when the client
closed the connection: the proof that a guard really ended the provider's stream.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

TOKENS = ["Hello", ",", " world", "!", " Bye."]


@dataclass
class Seen:
    """What the server saw of one request."""

    opened: float = 0.0
    tokens: int = 0
    closed: threading.Event = field(default_factory=threading.Event)
    closed_at: float | None = None


class Registry:
    """Thread-safe record of requests by ``x-test-id``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[str, Seen] = {}

    def get(self, test_id: str) -> Seen:
        """The record for `test_id`, created on first use."""
        with self._lock:
            return self._seen.setdefault(test_id, Seen())

    def wait_closed(self, test_id: str, timeout: float = 3.0) -> float | None:
        """When the client closed `test_id`'s connection (monotonic), or None if it did not."""
        seen = self.get(test_id)
        seen.closed.wait(timeout)
        return seen.closed_at


def chunk(content: str | None, finish: str | None = None) -> bytes:
    """One ``chat.completion.chunk`` event."""
    delta = {} if content is None else {"content": content}
    data = {
        "id": "chatcmpl-local",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "local",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(data)}\n\n".encode()


class LLMApp:
    """The ASGI app."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = dict(scope["headers"])
        test_id = headers.get(b"x-test-id", b"-").decode()
        seen = self.registry.get(test_id)
        seen.opened = time.monotonic()
        gone = asyncio.Event()

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            seen.closed_at = time.monotonic()
            seen.closed.set()
            gone.set()

        watcher = asyncio.create_task(watch())
        try:
            mode = json.loads(body or b"{}").get("model", "ok")
            await self._answer(mode, send, seen, gone)
        finally:
            watcher.cancel()

    async def _answer(self, mode: str, send: Send, seen: Seen, gone: asyncio.Event) -> None:
        async def pause(seconds: float) -> bool:
            """Sleep; True when the client left meanwhile."""
            try:
                await asyncio.wait_for(gone.wait(), seconds)
            except TimeoutError:
                return False
            return True

        async def token(text: str | None, finish: str | None = None) -> None:
            await send(
                {"type": "http.response.body", "body": chunk(text, finish), "more_body": True}
            )
            seen.tokens += 1

        if mode == "stall-headers":
            await pause(30)
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream"),
                    (b"cache-control", b"no-cache"),
                ],
            }
        )
        first_delay = float(mode.split(":", 1)[1]) if mode.startswith("slow-first:") else 0.0
        if mode == "stall-first" or await pause(first_delay):
            await pause(30)
            return
        if mode == "trickle":
            while not await pause(0.05):
                await token("tick")
            return
        for i, text in enumerate(TOKENS):
            if i and await pause(0.01):
                return
            if mode == "stall-mid" and i == 3:
                await pause(30)
                return
            await token(text)
        await token(None, "stop")
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


@contextmanager
def serve() -> Iterator[tuple[str, Registry]]:
    """Run the app on 127.0.0.1 (a free port) on a thread; yield its base URL and registry."""
    registry = Registry()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        LLMApp(registry),
        log_level="warning",
        lifespan="off",
        http="h11",
        loop="asyncio",
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the local LLM server did not start")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}", registry
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
