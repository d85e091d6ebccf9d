# Types of deadlines.httpx2: deadlines.httpx's API over httpx2. The package loads
# deadlines.httpx's own modules over httpx2 at run time (see __init__.py), which a type
# checker cannot follow; tests/outbound/test_httpx2.py checks this file against them.

import ssl
import typing
from typing import Any

import httpx2

from .._dependency import Dependency

POOL_WAIT: str

class AsyncTransport(httpx2.AsyncBaseTransport):
    dependency: Dependency
    def __init__(
        self,
        dependency: Dependency,
        *,
        verify: ssl.SSLContext | str | bool = ...,
        cert: Any = ...,
        trust_env: bool = ...,
        http1: bool = ...,
        http2: bool = ...,
        limits: httpx2.Limits = ...,
        proxy: httpx2.Proxy | httpx2.URL | str | None = ...,
        uds: str | None = ...,
        local_address: str | None = ...,
        socket_options: typing.Iterable[Any] | None = ...,
        retries: int = ...,
    ) -> None: ...
    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response: ...
    async def aclose(self) -> None: ...

class Transport(httpx2.BaseTransport):
    dependency: Dependency
    def __init__(
        self,
        dependency: Dependency,
        *,
        verify: ssl.SSLContext | str | bool = ...,
        cert: Any = ...,
        trust_env: bool = ...,
        http1: bool = ...,
        http2: bool = ...,
        limits: httpx2.Limits = ...,
        proxy: httpx2.Proxy | httpx2.URL | str | None = ...,
        uds: str | None = ...,
        local_address: str | None = ...,
        socket_options: typing.Iterable[Any] | None = ...,
        retries: int = ...,
    ) -> None: ...
    def handle_request(self, request: httpx2.Request) -> httpx2.Response: ...
    def close(self) -> None: ...

class AsyncBounded(httpx2.AsyncBaseTransport):
    dependency: Dependency
    transport: httpx2.AsyncBaseTransport
    def __init__(self, dependency: Dependency, transport: httpx2.AsyncBaseTransport) -> None: ...
    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response: ...
    async def aclose(self) -> None: ...

class Bounded(httpx2.BaseTransport):
    dependency: Dependency
    transport: httpx2.BaseTransport
    def __init__(self, dependency: Dependency, transport: httpx2.BaseTransport) -> None: ...
    def handle_request(self, request: httpx2.Request) -> httpx2.Response: ...
    def close(self) -> None: ...

class AsyncClient(httpx2.AsyncClient):
    dependency: Dependency
    def __init__(self, dependency: Dependency, **kwargs: Any) -> None: ...

class Client(httpx2.Client):
    dependency: Dependency
    def __init__(self, dependency: Dependency, **kwargs: Any) -> None: ...
