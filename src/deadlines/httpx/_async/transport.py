"""`AsyncTransport`: an httpx transport that bounds every phase of a call by its dependency."""

from __future__ import annotations

import ssl
import typing
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from ... import retry
from ..._dependency import Dependency
from ...wire import HEADER
from .._backend import AsyncBackend
from .._boundary import Expired, raise_translated
from .._call import Call, current, start
from .._hedge import hedging  # async only
from .._httpcore import abandon_async
from .._lib import httpcore, httpx
from .._messages import core_request, response
from .._options import (
    as_proxy,
    check_dependency,
    check_url,
    factory_options,
    pool_size,
    proxy_kind,
    retry_options,
)
from .._primitives import AsyncGate, AsyncShield, AsyncWindow, async_trace
from .pool import AsyncPool


class AsyncTransport(httpx.AsyncBaseTransport):
    """An httpx transport that bounds every phase of a call by `dependency`.

    Takes httpx's own transport options, with the same meaning:

    Args:
        dependency: The limits, pool size and retry rule for the service called.
        verify: TLS verification: True, False, a CA bundle path or an `ssl.SSLContext`.
        cert: A client certificate, as for httpx.
        trust_env: Whether to read ``SSL_CERT_FILE`` and friends from the environment.
        http1: Whether to offer HTTP/1.1.
        http2: Whether to offer HTTP/2 (needs the ``h2`` package).
        limits: An `httpx.Limits`: its ``max_connections`` can only lower the
            dependency's pool size; ``keepalive_expiry`` is how long an idle connection
            is kept.
        proxy: A proxy (``http://``, ``https://``, ``socks5://``), as a URL or an
            `httpx.Proxy`; every phase through it is bounded (connecting to it, the
            CONNECT or SOCKS handshake, TLS to the origin count as connecting).
        uds: A Unix domain socket path to connect to instead of TCP.
        local_address: The local address to connect from.
        socket_options: Socket options, as for httpx.
        retries: How often to retry a refused connect (httpx's connect retries; the
            dependency's ``retry`` is the retry of whole calls).

    The pool holds at most ``dependency.pool_size`` connections and admits that many
    calls at once; a response holds its place until it is closed. A request's httpx
    ``timeout`` lowers the dependency's caps where it is shorter.
    """

    def __init__(
        self,
        dependency: Dependency,
        *,
        verify: ssl.SSLContext | str | bool = True,
        cert: Any = None,
        trust_env: bool = True,
        http1: bool = True,
        http2: bool = False,
        limits: httpx.Limits = httpx.Limits(),  # noqa: B008 - immutable, as httpx's default
        proxy: httpx.Proxy | httpx.URL | str | None = None,
        uds: str | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[Any] | None = None,
        retries: int = 0,
    ) -> None:
        check_dependency(dependency)
        self.dependency = dependency
        self._http2 = http2
        proxy = as_proxy(proxy)
        kind = proxy_kind(proxy)
        self._proxied = kind is not None
        size = pool_size(dependency, limits)
        self._gate = AsyncGate(size)
        options = factory_options(
            verify=verify,
            cert=cert,
            trust_env=trust_env,
            http1=http1,
            http2=http2,
            size=size,
            limits=limits,
            proxy=proxy,
            local_address=local_address,
            uds=uds,
            socket_options=socket_options,
            retries=retries,
        )
        backend = AsyncBackend(prior_knowledge=http2 and not http1)
        factory: httpcore.AsyncConnectionPool
        if kind is None:
            factory = httpcore.AsyncConnectionPool(network_backend=backend, **options)
        elif kind == "http":
            factory = httpcore.AsyncHTTPProxy(network_backend=backend, **options)
        else:
            factory = httpcore.AsyncSOCKSProxy(network_backend=backend, **options)
        self._pool = AsyncPool(
            factory, size, multiplexed=http2, max_idle=limits.max_keepalive_connections
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send `request` inside the budget, retrying by ``dependency.retry`` if set."""
        return await with_retries(self.dependency, self._attempt, request)

    async def _attempt(self, request: httpx.Request) -> httpx.Response:
        check_url(request)
        call = start(self.dependency, request.extensions.get("timeout"), proxied=self._proxied)
        token = current.set(call)
        admitted = False
        core = None
        try:
            await self._gate.acquire(call)
            admitted = True
            request.headers[HEADER] = call.budget.header_ms()
            user_trace = request.extensions.get("trace")
            trace = None
            if user_trace is not None or self._http2 or self._proxied:
                trace = async_trace(call, user_trace)
            core = core_request(request, call, trace)
            if trace is None:
                call.headers = core.headers
            try:
                head = await self._send(call, core)
            except (Exception, Expired) as exc:
                raise_translated(call, exc)
            call.budget.answered(head.status)
            call.begin_body()
        except BaseException as exc:
            if admitted:
                self._gate.release()
            call.budget.finish(exc)
            if core is not None:
                with AsyncShield():
                    await core.stream.aclose()  # type: ignore[union-attr]
            raise
        finally:
            current.reset(token)
        body = AsyncBody(head.stream, call, self, core if self._http2 else None)
        return response(call, head, body)

    async def _send(self, call: Call, core: httpcore.Request) -> httpcore.Response:
        """The response head, each phase's limit also enforced by cancelling (HTTP/2 on).

        On a shared connection a request may wait for another's reads, for the
        connection another request is opening, or for a free stream; a window whose end
        follows the phases bounds all of it. Until the connect or send begins, the wait
        counts as a pool wait: min(pool_wait, time left).
        """
        with AsyncWindow(call, call.budget.limit("pool") if self._http2 else None):
            return await self._pool.send(call, core)
        raise call.error()  # only when our own window fired

    async def _finish(self, call: Call) -> None:
        """The call is done: its connection back (or closed), its place in the gate freed."""
        closing = self._pool.check_in(call)
        self._gate.release()
        call.budget.finish()
        await self._pool.close_each(closing)

    async def aclose(self) -> None:
        """Close every pooled connection."""
        await self._pool.aclose()


async def with_retries(
    dependency: Dependency,
    attempt: Callable[[httpx.Request], Awaitable[httpx.Response]],
    request: httpx.Request,
) -> httpx.Response:
    """`attempt(request)`, retried by ``dependency.retry`` (once, without one).

    The async client also hedges each attempt by ``dependency.hedge``, if set.
    """
    if dependency.hedge is not None:  # async only
        attempt = hedging(dependency, attempt)  # async only
    policy = dependency.retry
    if policy is None:
        return await attempt(request)
    return await retry.run_async(
        lambda: attempt(request),
        retry_response=lambda answer: answer.status_code in policy.statuses,
        discard=_aclose_response,
        **retry_options(dependency, request),
    )


async def _aclose_response(answer: httpx.Response) -> None:
    await answer.aclose()


class AsyncBody(httpx.AsyncByteStream):
    """The response body: each chunk read under the call's limits, errors translated.

    With `request` (HTTP/2 enabled) each chunk is also awaited in a window ending at the
    idle limit, and a body closed before its end has its stream reset.
    """

    def __init__(
        self, inner: Any, call: Call, transport: AsyncTransport, request: httpcore.Request | None
    ) -> None:
        self._inner = inner
        self._call = call
        self._transport: AsyncTransport | None = transport
        self._request = request
        self._ended = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        call = self._call
        iterator = self._inner.__aiter__()
        while True:
            token = current.set(call)
            try:
                chunk = await self._next(iterator)
            except StopAsyncIteration:
                self._ended = True
                break
            except BaseException as exc:
                raise_translated(call, exc, finish=True)
            finally:
                current.reset(token)
            yield chunk

    async def _next(self, iterator: AsyncIterator[bytes]) -> bytes:
        call = self._call
        call.limit = "idle"  # what the window enforces, if it fires
        with AsyncWindow(call, None if self._request is None else call.budget.limit("idle")):
            return await iterator.__anext__()
        raise call.error()

    async def aclose(self) -> None:
        transport, self._transport = self._transport, None
        if transport is None:
            return
        call = self._call
        try:
            try:
                await self._inner.aclose()
            except Exception as exc:
                raise_translated(call, exc)
            finally:
                if self._request is not None and not self._ended:
                    await abandon_async(call, self._request)
        finally:
            await transport._finish(call)
