"""`Exchange`: one HTTP request through the ASGI middleware, and `Sweeper`, which starts
the watcher of the requests still running after `watch_after` (one per asyncio loop)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any

from .. import _clock, _inbound
from .._alarms import clock_for
from .._errors import DeadlineExceeded
from .._events import RequestOutcome
from .._gate import Gate
from .._inbound import Limits
from .._request import Request, answer_outcome, deadline_outcome
from .._scope import exceeded

if TYPE_CHECKING:
    from ._middleware import DeadlineMiddleware
    from ._trio import TrioSweeper

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("deadlines.asgi")
_JSON_HEADERS = [(b"content-type", b"application/json"), (b"cache-control", b"no-store")]
_NO_WAITERS: list[Any] = []  # shared empty list: never appended to
# Messages an app may send before its response starts (103 Early Hints; TestClient's).
BEFORE_START = frozenset({"http.response.early_hint", "http.response.debug"})


class Exchange(Request):
    """One request: its deadline scope, the wrapped receive and send, the watcher, the outcome.

    The exchange is the request's `deadlines.scope`, one object less per request:
    `__call__` sets its frame and keeps the token; it is armed at once, or by the
    sweeper when the request is still running after `watch_after` (`_watch`), and left
    with `_leave`.
    """

    # Most requests end before the watcher starts and never change most of this state:
    # class-level defaults, so a request stores only what it sets (no __slots__ here).
    _last: Message | None = None  # the last message the app sent (see `started`)
    _start: Message | None = None  # the app's response start (its status, its trailers)
    # The watcher's state.
    buffer: deque[Message] | None = None
    _bytes = 0
    _waiters: list[asyncio.Future[None]] = _NO_WAITERS
    _room: asyncio.Future[None] | None = None
    watcher: Any = None  # the watcher once started: its asyncio Task (trio: its CancelScope)
    _watcher_error: BaseException | None = None
    _watcher_wanted = False
    _direct = 0
    _eof = False
    host: asyncio.Task[Any] | None = None
    loop: asyncio.AbstractEventLoop | None = None
    trio_sweeper: TrioSweeper | None = None  # under trio: registered with, until the end
    cancels = 0
    active = True
    may_read_ahead = True

    def __init__(
        self,
        mw: DeadlineMiddleware,
        receive: Receive,
        send: Send,
        route: str,
        budget: float,
        started: float,
    ) -> None:
        super().__init__(route, budget, started)
        self._mw = mw
        self._receive = receive
        self._send = send

    @property
    def started(self) -> bool:
        """The response has started: the app sent its start (hints and debug don't count)."""
        last = self._last
        return last is not None and last["type"] not in BEFORE_START

    @property
    def complete(self) -> bool:
        """The response is complete: its last body chunk (its file, its trailers) went out."""
        last = self._last
        if last is None:
            return False
        kind: str = last["type"]
        if kind == "http.response.body":
            if last.get("more_body", False):
                return False
            start = self._start  # a start that promised trailers ends with them
            return start is None or not start.get("trailers", False)
        if kind == "http.response.trailers":
            return not last.get("more_trailers", False)
        return kind == "http.response.pathsend"

    async def failed(
        self,
        exc: BaseException,
        scope: Scope,
        limits_: Limits,
    ) -> tuple[RequestOutcome, BaseException | None]:
        """The app raised `exc`: leave the deadline, answer if we can, settle the outcome.

        Returns the request's outcome and what `__call__` raises: `exc` when it is not
        ours to handle, the `DeadlineExceeded` when the deadline passed after the
        response had started (the server then drops the connection), else None.
        """
        # The app is done: from here on neither the sweeper (`_watch`) nor a caller-left
        # cancellation already queued (`_cancel_host`) may touch the task, which goes on
        # to answer and then to whatever called us.
        self.active = False
        ours = False
        try:
            self.leave(type(exc), exc)
        except DeadlineExceeded as fired:  # our own timer ended the app
            exc, ours = fired, True
        if isinstance(exc, asyncio.CancelledError):
            if not self.cancels:
                return "error", exc
            self._uncancel()
            assert self.host is not None
            if self.host.cancelling():
                return "error", exc  # somebody else cancelled us too (server shutdown)
        elif isinstance(exc, DeadlineExceeded):
            if self.caller_left is None and not self.complete:
                outcome = deadline_outcome(exc)
                if self.started:
                    return outcome, exc
                await self.answer_timeout(scope, limits_)
                return outcome, None
            if self.caller_left is None:
                # After a complete response our timer cut only cleanup; a deadline error
                # the app raised itself there is its own, raised as any other would be.
                return ("ok", None) if ours else ("error", exc)
        elif isinstance(exc, Exception) and self.caller_left is not None:
            # The app failed because its caller went away (a send or read on a closed
            # connection; under trio, an exception group that held the cancellation):
            # nobody is left to tell.
            log.debug("error after the caller left", exc_info=exc)
        else:
            return "error", exc
        await self.answer_gone()
        return "caller_left", None

    async def gated(
        self, gate: Gate, app: ASGIApp, scope: Scope, limits_: Limits
    ) -> RequestOutcome:
        """Run `app` once `gate` lets the request through, else answer the refusal
        (the app never sees a refused request); the outcome so far."""

        async def work() -> bool:
            await app(scope, self.receive, self.send)
            return self.caller_left is None and self._answered_ok()

        refusal = await self.through(gate, work)
        if refusal is None:
            return "ok"
        if refusal.status == 504:
            await self.answer_timeout(scope, limits_)
        else:
            body = refusal.body()
            headers = [*_JSON_HEADERS, (b"content-length", str(len(body)).encode()),
                       (b"retry-after", str(refusal.retry_after).encode())]  # fmt: skip
            await self._answer(refusal.status, headers, body)
        return refusal.outcome

    def _answered_ok(self) -> bool:
        """The app answered, and not with a server error (a service time worth learning)."""
        start = self._start
        return start is not None and answer_outcome(start.get("status", 200)) == "ok"

    async def answer_timeout(self, scope: Scope, limits_: Limits) -> None:
        mw = self._mw
        asked = _inbound.renamed(scope.get("headers") or (), mw.header_bytes)
        body = self.timeout_body(asked, limits_, mw.header)
        headers = [*_JSON_HEADERS, (b"content-length", str(len(body)).encode())]
        await self._answer(504, headers, body)

    async def answer_gone(self) -> None:
        """Complete the exchange for outer middlewares; the server drops the bytes."""
        if not self.started:
            await self._answer(499, [], b"")

    async def _answer(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        """Send a whole response of our own; a caller already gone is nobody to tell."""
        end: Message = {"type": "http.response.body", "body": body, "more_body": False}
        self._last = end
        try:
            await self._send({"type": "http.response.start", "status": status, "headers": headers})
            await self._send(end)
        except OSError:  # ASGI 2.4: send on a closed connection raises an OSError
            pass

    def finish(self, outcome: RequestOutcome) -> None:
        """Report the end; a server error the app answered with is an error."""
        start = self._start
        if outcome == "ok" and start is not None:
            outcome = answer_outcome(start.get("status", 200))
        super().finish(outcome)

    # Watching for the caller leaving.

    def register(self, expect_continue: bool) -> None:
        """Without a running asyncio loop or trio: fail as a `deadlines.scope` would.

        (Under asyncio `__call__` registers with the sweeper inline; `TrioExchange`
        registers with trio's.)
        """
        self.arm(None, None)

    def stop_watching(self) -> None:
        """The request ended while watched: stop the watcher, take back our cancellations."""
        if self.watcher is not None and not self.watcher.done():
            self.watcher.cancel()
        if self.cancels:
            self._uncancel()

    def watch(self) -> None:
        """Due at `watch_after`: arm the deadline if it waited, and start the watcher."""
        if not self.active:  # the app is done; the request is answering on its way out
            return
        if self.timeout is None:  # not armed on arrival: the deadline was far
            self.arm(self.loop, self.host)
        self.start_watcher()

    def start_watcher(self) -> None:
        if not self.active or self._eof or self.complete or self.watcher is not None:
            return
        if self._direct or not self.may_read_ahead:
            self._watcher_wanted = True  # start when the app's own read returns
            return
        self.watcher = self._spawn_watcher()

    def _spawn_watcher(self) -> Any:
        assert self.loop is not None
        return self.loop.create_task(self._run_watcher(), name="deadlines-asgi-watch")

    async def _run_watcher(self) -> None:
        """Read ahead of the app (at most `read_ahead` bytes) until the caller leaves."""
        try:
            while True:
                while self._bytes >= self._mw.read_ahead and self._bytes:
                    await self._room_to_read()
                message = await self._receive()
                if self.buffer is None:
                    self.buffer = deque()
                self.buffer.append(message)
                self._bytes += len(message.get("body", b""))
                self._wake_readers()
                self.note(message)
                if message["type"] == "http.disconnect":
                    return
        except Exception as exc:  # the server's receive failed: hand it to the app
            self._watcher_error = exc
            self._wake_readers()

    # The waiting between the app's reads and the watcher: futures here, trio Events in
    # `TrioExchange`.

    async def _room_to_read(self) -> None:
        """The watcher waits for the app to take body from a full buffer."""
        assert self.loop is not None
        self._room = self.loop.create_future()
        await self._room

    def _made_room(self) -> None:
        room = self._room
        if room is not None and not room.done():
            room.set_result(None)

    async def _arrival(self) -> None:
        """A reader waits for the watcher to buffer the next message."""
        assert self.loop is not None
        waiter = self.loop.create_future()
        if self._waiters is _NO_WAITERS:
            self._waiters = []
        self._waiters.append(waiter)
        try:
            await waiter
        finally:
            if not waiter.done() or waiter.cancelled():  # e.g. is_disconnected() polls
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)

    def _wake_readers(self) -> None:
        waiters, self._waiters = self._waiters, _NO_WAITERS
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def note(self, message: Message) -> None:
        if message["type"] == "http.disconnect":
            self._eof = True
            if not self.complete and self.caller_left is None and self.active:
                self.left()
                if self.loop is not None:
                    # Cancel from the loop, never from inside the request's own task.
                    self.loop.call_soon(self._cancel_host)

    def _cancel_host(self) -> None:
        host = self.host
        if self.active and host is not None and not host.done():
            host.cancel(msg=self.caller_left)
            self.cancels += 1

    def _uncancel(self) -> None:
        while self.cancels and self.host is not None:
            self.host.uncancel()
            self.cancels -= 1

    # What the app sees.

    async def receive(self) -> Message:
        """The next message the server sent: read straight from it until the watcher
        starts, from the watcher's buffer after."""
        if self.watcher is None:  # the app's own read (the watcher waits until it returns)
            self._direct += 1
            try:
                message = await self._receive()
            finally:
                self._direct -= 1
            self.may_read_ahead = True
            if message["type"] == "http.disconnect":
                self.note(message)
            if self._watcher_wanted and not self._direct:
                self._watcher_wanted = False
                self.start_watcher()
            return message
        while True:
            buffer = self.buffer
            if buffer:
                message = buffer[0]
                if message["type"] != "http.disconnect":  # repeat disconnect forever
                    buffer.popleft()
                    self._bytes -= len(message.get("body", b""))
                    self._made_room()
                return message
            if self._watcher_error is not None:
                raise self._watcher_error
            await self._arrival()

    def send(self, message: Message) -> Awaitable[None]:
        """Pass `message` on, keeping it as the last one sent (`started`, `complete`).

        A plain function returning the server's own awaitable: the app awaits that
        directly, with no coroutine of ours in between.
        """
        if message["type"] == "http.response.start":
            frame = self.frame
            if frame is not None and frame.at <= _clock.now():
                # Nobody waits for an answer begun after the deadline (a handler that
                # caught its call's timeout, or ran without a checkpoint): 504, whichever
                # timer the loop ran first.
                raise exceeded(frame)
            self._start = message
        self._last = message
        return self._send(message)


class Sweeper:
    """Starts the watcher of each request that has run for `after` seconds; one per loop.

    An `Alarm` on the loop's clock (`_alarms`), due for the oldest request in flight: a
    request that ends sooner costs a dict insert and delete (made inline by the
    middleware), not a timer. Arrival times are `_clock` readings, the clock a request's
    deadline is on.
    """

    __slots__ = ("_after", "_clock", "entry", "loop", "pending")

    def __init__(self, loop: asyncio.AbstractEventLoop, after: float) -> None:
        self.loop = loop
        self._after = after
        self._clock = clock_for(loop)
        self.pending: dict[Exchange, float] = {}  # insertion order = arrival order
        self.entry: list[Any] | None = None  # on the loop's clock while requests wait

    def close(self) -> None:
        """Its loop is closed (and with it the loop's clock): let go of its requests."""
        self.entry = None
        self.pending.clear()

    def wake(self) -> None:
        """Come round `after` from now: the first request since the sweeper was idle."""
        self.entry = self._clock.arm(self.loop.time() + self._after, self)

    def fire(self) -> None:
        """Start the watchers that are due; come round again for the next one."""
        self.entry = None
        pending = self.pending
        now = _clock.now()
        while pending:
            exchange, arrived = next(iter(pending.items()))
            if arrived > now - self._after:
                due = self.loop.time() + arrived + self._after - now
                self.entry = self._clock.arm(due, self)
                return
            del pending[exchange]
            exchange.watch()
