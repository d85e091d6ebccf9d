"""The ASGI middleware under trio (hypercorn's trio worker): `TrioExchange` and the
`TrioSweeper`, one system task per trio run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._exchange import BEFORE_START, Exchange, Message, Receive, Send, log

if TYPE_CHECKING:
    from ._middleware import DeadlineMiddleware

_HTTP1 = frozenset({"1.0", "1.1"})  # versions whose sends `TrioExchange` shields


class TrioExchange(Exchange):
    """`Exchange` under trio: the watcher cancels the cancel scope the app runs in.

    The watcher is a trio system task (a request's task has no nursery to start it in)
    with its own cancel scope, closed when the request ends; readers and the watcher
    wait on trio Events where the asyncio exchange uses futures.
    """

    __slots__ = ("_arrived", "_gone", "_shield", "_space", "_trio")

    def __init__(
        self,
        mw: DeadlineMiddleware,
        receive: Receive,
        send: Send,
        route: str,
        budget: float,
        started: float,
        trio: Any,
        http_version: str | None,
    ) -> None:
        super().__init__(mw, receive, send, route, budget, started)
        self._trio = trio
        self._gone: Any = None  # the CancelScope around the app (the deadline's)
        self._arrived: Any = None  # Event: a message reached the buffer (readers wait)
        self._space: Any = None  # Event: the app took body from the buffer (the watcher waits)
        # Shield the server's send (`send`): over HTTP/1, until the headers are through.
        self._shield = http_version in _HTTP1

    def register(self, expect_continue: bool) -> None:
        """Register with the trio sweeper, then arm the deadline at once (a trio CancelScope).

        The caller leaving cancels the deadline's own CancelScope (one scope per
        request, not two: each costs microseconds); its exit then raises
        DeadlineExceeded, which `caller_left` turns into that outcome.
        """
        # With "Expect: 100-continue", read ahead only after the app asked.
        self.may_read_ahead = not expect_continue
        self.trio_sweeper = self._mw.trio_sweeper_for(self._trio)
        self.trio_sweeper.add(self)
        self.arm(None, None)
        assert self.canceller is not None
        self._gone = self.canceller.cancel_scope

    def stop_watching(self) -> None:
        if self.watcher is not None:
            self.watcher.cancel()

    async def send(self, message: Message) -> None:
        """Pass `message` on, as `Exchange.send` does (which answers 504 for a start
        after the deadline), with a guard trio needs.

        Over HTTP/1, until a message after the start is through, the server's send is
        shielded: hypercorn writes the headers with the first body message, and cut half
        way there, its state and h11's part ways and its trio worker dies trying to
        answer 500 on a response h11 has begun. (Over HTTP/2 that send may wait for the
        caller's flow-control window: it stays cancellable.) No checkpoint before the
        start: a scope of the app's own, cancelled around its send, is not ours to act on.
        """
        kind = message["type"]
        if not self._shield:
            await super().send(message)
            return
        with self._trio.CancelScope(shield=True):
            await super().send(message)
        self._shield = kind == "http.response.start" or kind in BEFORE_START

    def _spawn_watcher(self) -> Any:
        """A system task (a request's task has no nursery), in a CancelScope of its own."""
        scope = self._trio.CancelScope()
        self._trio.lowlevel.spawn_system_task(self._watch_in, scope, name="deadlines-asgi-watch")
        return scope

    async def _watch_in(self, scope: Any) -> None:
        with scope:
            await self._run_watcher()

    async def _room_to_read(self) -> None:
        space = self._space = self._trio.Event()
        await space.wait()

    def _made_room(self) -> None:
        space, self._space = self._space, None
        if space is not None:
            space.set()

    async def _arrival(self) -> None:
        arrived = self._arrived
        if arrived is None:
            arrived = self._arrived = self._trio.Event()
        await arrived.wait()

    def _wake_readers(self) -> None:
        arrived, self._arrived = self._arrived, None
        if arrived is not None:
            arrived.set()

    def note(self, message: Message) -> None:
        super().note(message)
        if self.caller_left is not None and self._gone is not None:
            self._gone.cancel()  # from any task, the request's own included


class TrioSweeper:
    """`Sweeper` under trio: one system task per trio run starts the due watchers.

    A request that ends within `after` costs a dict insert and delete, and wakes the
    task only when it was idle.
    """

    __slots__ = ("_after", "_idle", "_trio", "pending")

    def __init__(self, trio: Any, after: float) -> None:
        self._trio = trio
        self._after = after
        self.pending: dict[Exchange, float] = {}  # insertion order = arrival order
        self._idle: Any = None  # the Event the task waits on while nothing is pending
        trio.lowlevel.spawn_system_task(self._run, name="deadlines-asgi-sweeper")

    def add(self, exchange: TrioExchange) -> None:
        self.pending[exchange] = self._trio.current_time()
        idle, self._idle = self._idle, None
        if idle is not None:
            idle.set()

    async def _run(self) -> None:
        trio, pending = self._trio, self.pending
        while True:
            if not pending:
                idle = self._idle = trio.Event()
                await idle.wait()
                continue
            exchange, arrived = next(iter(pending.items()))
            due = arrived + self._after
            if due > trio.current_time():
                await trio.sleep_until(due)
                continue
            del pending[exchange]
            try:
                exchange.start_watcher()
            except Exception:  # never let a system task fail: that ends the whole run
                log.exception("could not start the caller-left watcher")
