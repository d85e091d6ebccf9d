"""DLN101: HTTP calls and clients with no timeout, or with timeout=None."""

from __future__ import annotations

import asyncio
import http.client
import urllib.request
from typing import Any
from urllib.request import urlopen as fetch_url

import aiohttp
import httpx
import requests
import requests as rq
import urllib3
from requests import Session
from requests import get as http_get

import deadlines

PRICING = "https://pricing.internal/prices"


def fetch_price(sku: str) -> Any:
    response = requests.get(f"{PRICING}/{sku}")  # expect: DLN101
    return response.json()


def fetch_price_bounded(sku: str) -> Any:
    return requests.get(f"{PRICING}/{sku}", timeout=(1.5, 0.5)).json()


def post_order(order: dict[str, Any]) -> Any:
    return rq.post("https://orders.internal/orders", json=order)  # expect: DLN101


def imported_function(url: str) -> Any:
    return http_get(url)  # expect: DLN101


def session_from_class(url: str) -> Any:
    session = Session()
    return session.get(url)  # expect: DLN101


def settings_timeout(url: str, settings: Any) -> Any:
    return requests.get(url, timeout=settings.HTTP_TIMEOUT)


def forwarded_options(url: str, **options: Any) -> Any:
    return requests.get(url, **options)  # cannot tell: the timeout may be in there


class CatalogClient:
    def __init__(self) -> None:
        self.session = requests.Session()

    def item(self, item_id: str) -> Any:
        return self.session.get(f"https://catalog.internal/items/{item_id}")  # expect: DLN101

    def search(self, query: str) -> Any:
        return self.session.get("https://catalog.internal/search", params={"q": query}, timeout=2)


def annotated(session: requests.Session, url: str) -> Any:
    return session.request("GET", url)  # expect: DLN101


def not_http(cache: dict[str, str], key: str) -> str | None:
    return cache.get(key)


def httpx_default_is_per_phase(url: str) -> Any:
    return httpx.get(url)  # expect: DLN109 (5 s per phase: not DLN101, which is no limit)


def httpx_disabled(url: str) -> Any:
    return httpx.get(url, timeout=None)  # expect: DLN101


def httpx_client_disabled() -> httpx.Client:
    return httpx.Client(timeout=None)  # expect: DLN101


def httpx_read_unbounded() -> httpx.Timeout:
    return httpx.Timeout(5.0, read=None)  # expect: DLN101


def httpx_timeout_ok() -> httpx.Timeout:
    return httpx.Timeout(5.0, connect=1.0)


async def httpx_bounded_by_scope(client: httpx.AsyncClient, url: str) -> Any:
    async with asyncio.timeout(0.5):
        return await client.get(url, timeout=None)  # the scope cancels it


async def httpx_disabled_outside_scope(client: httpx.AsyncClient, url: str) -> Any:
    return await client.get(url, timeout=None)  # expect: DLN101


async def aiohttp_default_session(url: str) -> Any:
    async with (
        aiohttp.ClientSession() as session,  # expect: DLN101
        session.get(url) as response,
    ):
        return await response.json()


async def aiohttp_idle_only(url: str) -> Any:
    timeout = aiohttp.ClientTimeout(sock_connect=1, sock_read=10)  # expect: DLN101
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(url) as response,
    ):
        return await response.text()


async def aiohttp_bounded(url: str) -> Any:
    timeout = aiohttp.ClientTimeout(total=2, sock_connect=1)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(url, timeout=None) as response,  # expect: DLN101
    ):
        return await response.text()


async def aiohttp_request_in_deadline(session: aiohttp.ClientSession, url: str) -> Any:
    async with (
        deadlines.scope(0.8),
        session.get(url, timeout=None) as response,  # the deadline cancels it
    ):
        return await response.text()


async def aiohttp_module_request(url: str) -> Any:
    async with aiohttp.request("GET", url) as response:  # expect: DLN101
        return await response.read()


def urllib_plain(url: str) -> bytes:
    with urllib.request.urlopen(url) as response:  # expect: DLN101
        return bytes(response.read())


def urllib_keyword(url: str) -> bytes:
    with fetch_url(url, timeout=2.0) as response:
        return bytes(response.read())


def urllib_positional(url: str) -> bytes:
    with fetch_url(url, None, 2.0) as response:
        return bytes(response.read())


def http_client_plain(host: str) -> http.client.HTTPConnection:
    return http.client.HTTPConnection(host)  # expect: DLN101


def http_client_bounded(host: str) -> http.client.HTTPSConnection:
    return http.client.HTTPSConnection(host, timeout=2.0)


def http_client_positional(host: str) -> http.client.HTTPConnection:
    return http.client.HTTPConnection(host, 80, 2.0)


def urllib3_pool() -> urllib3.PoolManager:
    return urllib3.PoolManager(num_pools=4)  # expect: DLN101


def urllib3_pool_bounded() -> urllib3.PoolManager:
    return urllib3.PoolManager(timeout=urllib3.Timeout(connect=1.0, read=2.0))
