"""DLN109: httpx limits each phase, never the whole call; a trickle holds it forever."""

from __future__ import annotations

from typing import Any

import httpx
import httpx as hx
from httpx import AsyncClient

import deadlines
import deadlines.httpx

CATALOG = "https://catalog.internal"


def module_function(url: str) -> Any:
    return httpx.get(url)  # expect: DLN109


def module_function_with_a_number(order: dict[str, Any]) -> Any:
    return httpx.post(f"{CATALOG}/orders", json=order, timeout=2.0)  # expect: DLN109


def streamed(url: str) -> int:
    limits = httpx.Timeout(10.0, connect=2.0)
    with httpx.stream("GET", url, timeout=limits) as response:  # expect: DLN109
        return sum(len(chunk) for chunk in response.iter_bytes())


def sync_client() -> httpx.Client:
    return httpx.Client(base_url=CATALOG)  # expect: DLN109


def aliased() -> Any:
    with hx.Client(timeout=5) as client:  # expect: DLN109
        return client.get("/health").json()


async def async_client_unbounded(url: str) -> Any:
    async with AsyncClient() as client:  # expect: DLN109
        return (await client.get(url)).json()


def disabled(url: str) -> Any:
    return httpx.get(url, timeout=None)  # expect: DLN101


def disabled_by_a_timeout_of_none() -> httpx.Client:
    return httpx.Client(timeout=httpx.Timeout(None))  # expect: DLN101


def no_network(handler: Any) -> httpx.Client:
    return httpx.Client(transport=httpx.MockTransport(handler))


def an_app_in_process(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app")


def the_library(url: str) -> deadlines.httpx.AsyncClient:
    return deadlines.httpx.AsyncClient(deadlines.Dependency("catalog", total=2.0))


class Cache:
    def get(self, key: str) -> str:
        return key


def not_httpx(cache: Cache) -> str:
    return cache.get("k")


def a_client_never_used(url: str) -> int:
    with httpx.Client() as _client:
        return len(url)


def passed_through(**options: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(**options)  # expect: DLN109
