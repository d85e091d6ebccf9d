"""gRPC (grpc.aio): the caller's deadline becomes the request's, and every outbound call carries it.

    import deadlines.grpc

    server = grpc.aio.server(interceptors=[
        deadlines.grpc.DeadlineInterceptor(default=2.0, maximum=10.0),
    ])
    channel = grpc.aio.insecure_channel(target, interceptors=deadlines.grpc.client_interceptors(
        dependency=deadlines.Dependency("pricing", min_useful=0.05),
    ))

Server side: gRPC sends the caller's deadline as ``grpc-timeout``; grpc.aio exposes it
as `context.time_remaining()`, which is None when the caller set none. The interceptor
turns it (and an ``x-request-timeout-ms`` metadata entry, if any) into the request's
`Deadline` -- capped at the method's maximum, minus a reserve, the method's default
when there is none -- and runs the handler inside `deadlines.scope`, so
`deadlines.current()` works in handlers and HTTP calls made from them carry the same
budget. A deadline that passes aborts the RPC with ``DEADLINE_EXCEEDED``; a call that
arrives already expired is aborted without running the handler. When the caller
cancels or its connection drops, grpc.aio cancels the handler itself; the interceptor
reports it as ``caller_left`` (as it does a server shutting down).

The outcome reported follows the status the handler answers with, however it sets it
(`context.abort` or `context.set_code`): a status whose HTTP equivalent is below 500
(``NOT_FOUND``, ``INVALID_ARGUMENT``, ``CANCELLED``, ...) is an answer, ``ok``;
``UNKNOWN``, ``INTERNAL``, ``UNAVAILABLE``, ``UNIMPLEMENTED``, ``DATA_LOSS`` and a
``DEADLINE_EXCEEDED`` of the handler's own are ``error``. An RPC for a method the
server does not know is reported under the route ``*`` as an ``error`` (grpc.aio
answers ``UNIMPLEMENTED``).

Client side: grpcio does not forward a deadline to outbound calls by itself. The client
interceptors give every call ``timeout = min(the call's own timeout, what is left,
the dependency's total)`` (``grpc-timeout`` on the wire; `total` is 30 s unless
``Dependency(..., total=...)`` says otherwise, and it caps outside any deadline too: a
call with no timeout of its own, or a longer one, gets `total`), fail fast with
`BudgetExhausted` below the dependency's `min_useful`, and turn ``DEADLINE_EXCEEDED``
into `DeadlineExceeded` (the request's deadline was binding) or `TotalTimeout` (the
call's own timeout or `total` was). A call cut short once it started counts as sent:
the server may have it, so it is not `retry_safe`.

Only a ``DEADLINE_EXCEEDED`` of ours is translated: one that comes sooner than a hop's
reserve (100 ms, or a tenth of the timeout) before the call's end is the downstream's
own limit, and stays grpc's `AioRpcError`.

Calls keep grpc.aio's call API (metadata, `code()`, `cancel()`, ``write()`` /
``done_writing()``): `continuation` returns the call, never raises, so outer
interceptors (retries, tracing) read its status as usual, and only awaiting a unary
response (or reading a stream) raises the translated error. Observers hear of every
call when it ends, however the caller uses it: awaited, only its `code()` read,
cancelled or dropped half-read.

Server side, the handler keeps its shape (an async generator stays one), so that
interceptors outside this one can wrap it; an outer interceptor iterating a streaming
handler sees no items, as this one writes them itself (`context.write`), inside the
deadline. The budget counts from the RPC's arrival at this interceptor: time spent in
inner interceptors or reading the request is spent from it.

Only async (grpc.aio) handlers are wrapped; sync handlers pass through unchanged.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Mapping
from datetime import timedelta
from typing import Any, NoReturn

from . import _clock, _events, _validate, wire
from ._budget import CallBudget
from ._dependency import Dependency
from ._errors import DeadlineExceeded, TotalTimeout
from ._events import RequestOutcome
from ._extras import missing
from ._inbound import UNMATCHED, Limits, RouteTable
from ._private.grpc import done_writing
from ._request import Request, budget, deadline_outcome

try:
    import grpc
    import grpc.aio
except ImportError as exc:  # pragma: no cover - exercised without grpcio installed
    raise missing("deadlines.grpc", "grpcio", "grpc") from exc

__all__ = ["DeadlineInterceptor", "Limits", "client_interceptors"]


class DeadlineInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Server interceptor: each RPC runs under the caller's deadline (see the module docs).

    Args:
        default: Budget in seconds when the caller set no deadline.
        maximum: The most a caller may ask for; a longer deadline is capped.
        reserve: Subtracted from the budget for the time on the wire and for the reply.
        routes: Limits per method: ``"/pkg.Service/Method"`` or ``"/pkg.Service/*"``.
    """

    def __init__(
        self,
        *,
        default: float | timedelta,
        maximum: float | timedelta,
        reserve: float | timedelta = 0.05,
        routes: Mapping[str, Limits] | None = None,
    ) -> None:
        self._table = RouteTable(routes, Limits(default=default, maximum=maximum))
        self._reserve = _validate.seconds(reserve, "reserve")

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        handler_call_details: Any,
    ) -> Any:
        """Wrap the method's handler so that it runs under the deadline."""
        started = _clock.now()
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        _, limits_ = self._table.match("", method)
        metadata = handler_call_details.invocation_metadata or ()
        header = wire.header_budget(metadata)
        if handler is None:
            if _events.active():
                _Rpc(UNMATCHED, limits_, self._reserve, header, started).report_unknown()
            return None  # grpc.aio answers UNIMPLEMENTED
        rpc = _Rpc(method, limits_, self._reserve, header, started)
        for kind in ("unary_unary", "unary_stream", "stream_unary", "stream_stream"):
            behavior = getattr(handler, kind, None)
            if behavior is not None and _is_async(behavior):
                return _replaced(handler, kind, rpc.wrap(behavior, kind.endswith("stream")))
        return handler


def _is_async(fn: Any) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)


_FACTORIES: dict[str, Callable[..., Any]] = {
    "unary_unary": grpc.unary_unary_rpc_method_handler,
    "unary_stream": grpc.unary_stream_rpc_method_handler,
    "stream_unary": grpc.stream_unary_rpc_method_handler,
    "stream_stream": grpc.stream_stream_rpc_method_handler,
}


def _replaced(handler: Any, kind: str, behavior: Any) -> Any:
    """`handler` with `behavior` in place of its `kind` behaviour."""
    if hasattr(handler, "_replace"):  # grpc's own handlers are namedtuples
        return handler._replace(**{kind: behavior})
    # An app's own subclass of the abstract grpc.RpcMethodHandler: a new one, same codecs.
    return _FACTORIES[kind](
        behavior,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


# gRPC's statuses whose HTTP equivalent is below 500: the handler's answer, as an
# HTTP 4xx is (grpc/doc/http-grpc-status-mapping.md, CANCELLED being 499).
_ANSWERS = frozenset(
    {
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.ABORTED,
        grpc.StatusCode.OUT_OF_RANGE,
    }
)


_NONE: tuple[Any, ...] = ()


def _status_outcome(code: Any) -> RequestOutcome:
    """The outcome of a handler that ended with status `code` (None: it set none, OK)."""
    if code is None or code == grpc.StatusCode.OK or code in _ANSWERS:
        return "ok"
    return "error"


class _Rpc:
    """The deadline rules for one incoming RPC, which arrived at `arrived` (a clock reading)."""

    __slots__ = ("arrived", "header", "limits", "method", "reserve")

    def __init__(
        self, method: str, limits_: Limits, reserve: float, header: float | None, arrived: float
    ) -> None:
        self.method, self.limits, self.reserve, self.header = method, limits_, reserve, header
        self.arrived = arrived

    def budget(self, left: float | None) -> float:
        """min(time_remaining `left`, metadata header, maximum) or default, minus reserve."""
        # However long a caller asks for (a year, `inf`), the maximum caps it, as
        # `wire.inbound_budget` caps a header: more than the maximum is the maximum.
        found = [v for v in (left, self.header) if v is not None and not math.isnan(v)]
        return budget(min(found) if found else None, self.limits, self.reserve)

    def report_unknown(self) -> None:
        """Events for an RPC to a method the server does not know (UNIMPLEMENTED: 501)."""
        # The caller's grpc-timeout is not known before a handler.
        Request(self.method, self.budget(None), self.arrived).finish("error")

    def wrap(self, behavior: Any, streams_out: bool) -> Callable[[Any, Any], Any]:
        """The handler's `behavior` run under the deadline, in the same shape (coroutine
        function or async generator function) so that outer interceptors can wrap it."""

        async def run(request: Any, context: Any) -> Any:
            # The budget counts from the RPC's arrival (`intercept_service`), not from
            # here: inner interceptors and the request's reading spend it too.
            # `time_remaining()` is read now, so it is moved back to the arrival.
            waited = _clock.now() - self.arrived
            left = context.time_remaining()
            rpc = Request(
                self.method, self.budget(None if left is None else left + waited), self.arrived
            )
            outcome: RequestOutcome = "error"
            try:
                if rpc.budget <= 0.0:
                    outcome = "budget_exhausted"
                    await context.abort(
                        grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded on arrival"
                    )
                if rpc.budget <= waited:
                    outcome = "deadline"
                    await context.abort(
                        grpc.StatusCode.DEADLINE_EXCEEDED,
                        f"deadline exceeded before the handler ran ({waited * 1000:.0f} ms)",
                    )
                result: Any = None
                try:
                    async with rpc:
                        result = behavior(request, context)
                        if not streams_out:
                            answer = await result
                        elif inspect.isasyncgen(result):
                            async for item in result:
                                await context.write(item)
                            answer = None
                        else:
                            answer = await result
                except DeadlineExceeded as exc:
                    outcome = deadline_outcome(exc)
                    if not streams_out:
                        await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc))
                    # A streaming reply may be stuck behind flow control (a caller that
                    # reads slowly or not at all): the deadline cancels the blocked
                    # `context.write`, but `context.abort` then waits to send its status
                    # behind the queued messages -- until the caller reads or its own
                    # deadline passes. Setting the status and returning ends the handler
                    # now; grpc.aio sends DEADLINE_EXCEEDED after the queued messages,
                    # as abort would have.
                    context.set_code(grpc.StatusCode.DEADLINE_EXCEEDED)
                    context.set_details(str(exc))
                    return None
                except asyncio.CancelledError:
                    # Our own deadline arrives as DeadlineExceeded; grpc.aio cancels the
                    # handler when the caller cancels or goes away (or at server stop).
                    outcome = "caller_left"
                    raise
                except grpc.aio.AbortError:
                    outcome = _status_outcome(context.code())
                    raise
                finally:
                    if inspect.isasyncgen(result):
                        # Run the app's `finally` now, not when the generator is collected.
                        await result.aclose()
                outcome = _status_outcome(context.code())  # set_code, then return
                return answer
            finally:
                rpc.finish(outcome)

        if not inspect.isasyncgenfunction(behavior):
            return run

        async def run_stream(request: Any, context: Any) -> AsyncIterator[Any]:
            # An async generator, as the app's handler is: an outer interceptor that
            # iterates it (``async for r in behavior(...)``, as tracing ones do) gets no
            # items, since `run` writes each one with `context.write` inside the deadline.
            await run(request, context)
            for item in _NONE:  # never: `run` wrote the replies
                yield item

        return run_stream


def client_interceptors(*, dependency: Dependency | None = None) -> list[Any]:
    """Client interceptors for `grpc.aio` channels: one per call shape, all sharing `dependency`.

    Every outbound call gets ``timeout = min(its own timeout, the time left, the
    dependency's total)``; below the dependency's `min_useful` the call is not made
    (`BudgetExhausted`); a ``DEADLINE_EXCEEDED`` status becomes `DeadlineExceeded` or
    `TotalTimeout`.
    """
    policy = dependency if dependency is not None else Dependency("grpc")
    if not isinstance(policy, Dependency):
        raise TypeError(f"dependency must be a deadlines.Dependency, not {dependency!r}")
    return [
        _UnaryUnary(policy),
        _UnaryStream(policy),
        _StreamUnary(policy),
        _StreamStream(policy),
    ]


# A server answers DEADLINE_EXCEEDED a reserve before the deadline it was sent (our
# interceptor: 50 ms by default), so one that comes this close to our own end is ours.
# Sooner, it is the downstream's own limit (or one of its calls'), not ours to blame.
_HOP_RESERVE = 0.1  # seconds, or a tenth of the timeout if more
_REPORTS: set[asyncio.Task[None]] = set()  # `_Call._report` tasks, held until they end


class _Call:
    """One outbound call's limits: the timeout to send and the error for DEADLINE_EXCEEDED."""

    __slots__ = ("budget", "own", "own_binding", "timeout")

    def __init__(self, dependency: Dependency, own: float | None) -> None:
        self.budget = CallBudget(dependency)  # raises BudgetExhausted: nothing sent
        left = self.budget.limit("total")
        self.own = own
        self.own_binding = own is not None and own < left
        self.timeout = left if own is None else min(own, left)

    def details(self, details: Any) -> Any:
        return details._replace(timeout=self.timeout)

    def started(self, real: Any) -> None:
        """The RPC `real` is under way: grpc may have written the request, so a cut is
        not retry-safe. Observers hear of its end however the caller uses it."""
        self.budget.request_sent = True
        self.budget.phase = "body"
        if _events.observers:
            self.budget.__enter__()  # CallStarted; `finish` reports the end, once
            self._follow(real)

    def error(self, exc: BaseException) -> BaseException:
        """What the caller gets for `exc`: ours for our DEADLINE_EXCEEDED, else `exc`."""
        if not self._ours(exc):
            return exc
        if self.own_binding:
            assert self.own is not None
            elapsed = _clock.now() - self.budget.start
            dependency = self.budget.dependency.name
            return TotalTimeout(
                limit=self.own, elapsed=elapsed, dependency=dependency, phase="body"
            )
        return self.budget.timeout("total")

    def _ours(self, exc: BaseException) -> bool:
        """Whether `exc` is the DEADLINE_EXCEEDED of our timeout (see `_HOP_RESERVE`)."""
        if not isinstance(exc, grpc.aio.AioRpcError):
            return False
        if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
            return False
        elapsed = _clock.now() - self.budget.start
        return elapsed >= self.timeout - max(_HOP_RESERVE, self.timeout / 10)

    def fail(self, exc: BaseException) -> NoReturn:
        """The call failed with `exc`: report it, and raise what the caller gets."""
        error = self.error(exc)
        self.budget.finish(error)
        if error is exc:
            raise exc
        raise error from exc

    async def unary(self, call: Any) -> Any:
        try:
            answer = await call
        except BaseException as exc:
            self.fail(exc)
        self.budget.finish()
        return answer

    async def stream(self, call: Any) -> AsyncIterator[Any]:
        try:
            async for item in call:
                yield item
        except BaseException as exc:
            self.fail(exc)
        self.budget.finish()

    def _follow(self, real: Any) -> None:
        """Report the call when it ends, unless the caller's await or read did first: a
        call nobody awaits, a stream dropped or cancelled half-read, still ends."""
        loop = asyncio.get_running_loop()

        def ended(_: Any) -> None:
            if not self.budget.finished:
                task = loop.create_task(self._report(real))
                _REPORTS.add(task)
                task.add_done_callback(_REPORTS.discard)

        try:
            real.add_done_callback(ended)
        except NotImplementedError:  # an inner interceptor answered a bare response
            ended(real)

    async def _report(self, real: Any) -> None:
        """The ended call's status, reported as the caller's await would have."""
        error: BaseException | None = None
        try:
            code = await real.code()
            if code == grpc.StatusCode.CANCELLED:
                error = asyncio.CancelledError()
            elif code != grpc.StatusCode.OK:
                error = self.error(grpc.aio.AioRpcError(code, details=await real.details()))
        except Exception as exc:  # an inner interceptor's call that fails to say
            error = exc
        self.budget.finish(error)


class _Answer:
    """grpc.aio's unary-response call, except that awaiting it goes through `_Call`.

    Returned by the interceptor at once: its errors are translated where the caller
    awaits it, while everything else (``code()``, metadata, ``cancel()``) is the real
    call's, as grpc.aio's contract has it (an outer interceptor such as a retry reads
    ``await call.code()``). The stream-unary interceptor could not await the response
    itself anyway: grpc.aio's ``write()`` proxy waits for the interceptor.
    """

    def __init__(self, call: Any, limits: _Call) -> None:
        self._call, self._limits = call, limits

    def __await__(self) -> Generator[Any, None, Any]:
        return self._limits.unary(self._call).__await__()

    def cancel(self) -> bool:
        return bool(self._call.cancel())

    def cancelled(self) -> bool:
        return bool(self._call.cancelled())

    def done(self) -> bool:
        return bool(self._call.done())

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self._call.add_done_callback(callback)

    def time_remaining(self) -> float | None:
        left: float | None = self._call.time_remaining()
        return left

    async def initial_metadata(self) -> Any:
        return await self._call.initial_metadata()

    async def trailing_metadata(self) -> Any:
        return await self._call.trailing_metadata()

    async def code(self) -> Any:
        return await self._call.code()

    async def details(self) -> Any:
        return await self._call.details()

    async def debug_error_string(self) -> Any:
        return await self._call.debug_error_string()

    async def wait_for_connection(self) -> None:
        await self._call.wait_for_connection()


class _UnaryUnaryAnswer(_Answer, grpc.aio.UnaryUnaryCall):  # type: ignore[misc]
    """`_Answer` for a unary-unary call."""


class _StreamUnaryAnswer(_Answer, grpc.aio.StreamUnaryCall):  # type: ignore[misc]
    """`_Answer` for a stream-unary call, with its writing side."""

    async def write(self, request: Any) -> None:
        await self._call.write(request)

    async def done_writing(self) -> None:
        await self._call.done_writing()

    @property
    def _done_writing_flag(self) -> bool:
        # grpc.aio's own write() proxy reads it from the call the interceptors return.
        return done_writing(self._call)


class _Interceptor:
    def __init__(self, dependency: Dependency) -> None:
        self._dependency = dependency


class _UnaryUnary(_Interceptor, grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        call = _Call(self._dependency, details.timeout)
        real = await continuation(call.details(details), request)
        call.started(real)
        return _UnaryUnaryAnswer(real, call)


class _UnaryStream(_Interceptor, grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        call = _Call(self._dependency, details.timeout)
        real = await continuation(call.details(details), request)
        call.started(real)
        return call.stream(real)


class _StreamUnary(_Interceptor, grpc.aio.StreamUnaryClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_unary(
        self, continuation: Any, details: Any, request_iterator: Any
    ) -> Any:
        call = _Call(self._dependency, details.timeout)
        real = await continuation(call.details(details), request_iterator)
        call.started(real)
        return _StreamUnaryAnswer(real, call)


class _StreamStream(_Interceptor, grpc.aio.StreamStreamClientInterceptor):  # type: ignore[misc]
    async def intercept_stream_stream(
        self, continuation: Any, details: Any, request_iterator: Any
    ) -> Any:
        call = _Call(self._dependency, details.timeout)
        real = await continuation(call.details(details), request_iterator)
        call.started(real)
        return call.stream(real)
