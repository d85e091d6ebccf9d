"""DLN109's negatives: every request made with the async client is awaited under a scope."""

from __future__ import annotations

import asyncio
from typing import Any

import anyio
import httpx

import deadlines


class Catalog:
    def __init__(self) -> None:
        self.http = httpx.AsyncClient(base_url="https://catalog.internal")

    async def item(self, sku: str) -> Any:
        async with asyncio.timeout(0.5):
            return (await self.http.get(f"/items/{sku}")).json()

    async def search(self, query: str) -> Any:
        with anyio.fail_after(1.0):
            return (await self.http.get("/search", params={"q": query})).json()


async def once(url: str) -> Any:
    async with httpx.AsyncClient() as client:
        return await asyncio.wait_for(client.get(url), 2.0)


async def under_a_deadline(client: httpx.AsyncClient, url: str) -> Any:
    async with deadlines.scope(1.5):
        return await client.post(url, json={})
