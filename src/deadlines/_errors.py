"""The error taxonomy: one root, a family per phase, and what each failure allows next.

Every timeout is a `TimeoutError` (so `except TimeoutError` catches them) and none is a
`ConnectionError` or `OSError` (so a broad `except OSError` around I/O does not eat
them). Each error carries the phase it fired in, the limit, the time spent, and whether
the request had been sent: a failure before sending is safe to retry, even for a POST;
after sending, the outcome is unknown.
"""

from __future__ import annotations

from typing import Literal, TypeVar

Phase = Literal["pool", "connect", "headers", "body"]

#: Phases that end before the request reaches the server.
UNSENT_PHASES: frozenset[str] = frozenset({"pool", "connect"})


def _fmt(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds * 1000:.0f} ms"


class DeadlinesError(Exception):
    """Root of every error this library raises."""


class DeadlineExceeded(DeadlinesError, TimeoutError):
    """The request's deadline passed: the binding limit was the whole budget.

    Attributes say where it hit: `phase` (None outside an outbound call),
    `request_sent` (None when unknown or not a call), `limit` (the budget that
    was given, in seconds), `elapsed` (seconds spent), `dependency`, `pool_wait`.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        limit: float | None = None,
        elapsed: float | None = None,
        phase: Phase | None = None,
        dependency: str | None = None,
        request_sent: bool | None = None,
        pool_wait: float | None = None,
    ) -> None:
        self.limit = limit
        self.elapsed = elapsed
        self.phase: Phase | None = phase
        self.dependency = dependency
        self.request_sent = request_sent
        self.pool_wait = pool_wait
        super().__init__(message or self._describe())

    @property
    def retry_safe(self) -> bool:
        """True only when the request certainly never reached the server."""
        return self.request_sent is False

    def _describe(self) -> str:
        where = f"{self.dependency}: " if self.dependency else ""
        during = f" during {self.phase}" if self.phase else ""
        text = (
            f"{where}deadline exceeded{during} after {_fmt(self.elapsed)}"
            f" (budget {_fmt(self.limit)})"
        )
        return text + _sent_clause(self.request_sent, self.pool_wait)


class BudgetExhausted(DeadlineExceeded):
    """Too little of the budget is left for the call to be useful; nothing was sent.

    Raised before a call starts when the remaining time is below the dependency's
    `min_useful`. Failing fast sheds work that could not finish anyway.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        remaining: float,
        min_useful: float,
        dependency: str | None = None,
    ) -> None:
        self.remaining = remaining
        self.min_useful = min_useful
        where = f"{dependency}: " if dependency else ""
        super().__init__(
            message
            or f"{where}budget exhausted: {_fmt(remaining)} left, the call needs"
            f" {_fmt(min_useful)}; nothing was sent",
            limit=min_useful,
            elapsed=0.0,
            dependency=dependency,
            request_sent=False,
        )


class CallTimeout(DeadlinesError, TimeoutError):
    """One phase of an outbound call hit the dependency's own cap for that phase."""

    #: Which phase fired; subclasses fix it, `TotalTimeout` takes the phase in progress.
    phase: Phase

    def __init__(
        self,
        message: str | None = None,
        *,
        limit: float,
        elapsed: float,
        dependency: str | None = None,
        phase: Phase | None = None,
        request_sent: bool | None = None,
        pool_wait: float | None = None,
    ) -> None:
        if phase is not None:
            self.phase = phase
        self.limit = limit
        self.elapsed = elapsed
        self.dependency = dependency
        self.request_sent = (
            self.phase not in UNSENT_PHASES if request_sent is None else request_sent
        )
        self.pool_wait = pool_wait
        super().__init__(message or self._describe())

    @property
    def retry_safe(self) -> bool:
        """True when the request never reached the server, so any method may retry."""
        return not self.request_sent

    def _describe(self) -> str:
        where = f"{self.dependency}: " if self.dependency else ""
        return (
            f"{where}{self.kind} timeout in phase {self.phase} after {_fmt(self.elapsed)}"
            f" (limit {_fmt(self.limit)})" + _sent_clause(self.request_sent, self.pool_wait)
        )

    @property
    def kind(self) -> str:
        """Short name of the limit that fired, e.g. ``"connect"`` or ``"total"``."""
        return self.phase


class PoolTimeout(CallTimeout):
    """No pooled connection became free in time; the request was never sent."""

    phase: Phase = "pool"


class ConnectTimeout(CallTimeout):
    """DNS, TCP connect or the TLS handshake did not finish in time; nothing was sent."""

    phase: Phase = "connect"


class HeadersTimeout(CallTimeout):
    """The request was sent but the response did not start in time: outcome unknown."""

    phase: Phase = "headers"


class IdleTimeout(CallTimeout):
    """The response body went silent for longer than the idle limit."""

    phase: Phase = "body"

    @property
    def kind(self) -> str:
        """``"idle"``."""
        return "idle"


class TotalTimeout(CallTimeout):
    """The call as a whole, body included, took longer than its total cap."""

    phase: Phase = "body"

    @property
    def kind(self) -> str:
        """``"total"``."""
        return "total"


class FirstItemTimeout(HeadersTimeout):
    """The stream's first item (an LLM's first token) did not come within `first`.

    Phase ``"headers"``: the request was sent, nothing usable came back. Nothing was
    shown to the user yet, so this is the moment to fail over to another provider.
    """

    @property
    def kind(self) -> str:
        """``"first item"``."""
        return "first item"


class StreamIdleTimeout(IdleTimeout):
    """The stream went silent for longer than `idle` between two items (phase ``"body"``)."""


class CallerLeft(DeadlinesError):
    """The caller went away (its connection closed), so the work under it was stopped."""


def _sent_clause(request_sent: bool | None, pool_wait: float | None) -> str:
    text = ""
    if pool_wait:
        text += f"; {_fmt(pool_wait)} waiting for a pooled connection"
    if request_sent is True:
        text += "; request was sent, outcome unknown"
    elif request_sent is False:
        text += "; request was not sent, safe to retry"
    return text


_E = TypeVar("_E", bound=BaseException)
#: The classes `also` has made, by (our class, the client's class).
_ALSO: dict[tuple[type[BaseException], type[BaseException]], type[BaseException]] = {}


def also(error: _E, theirs: type[BaseException]) -> _E:
    """`error`, as an instance of a class that is both its own and `theirs`.

    For integrations: an error raised from inside a client's call is also that client's
    own exception for the case (``httpx.ReadTimeout``, ``aiohttp.SocketTimeoutError``,
    ...), so a caller's existing ``except`` for "the call timed out" catches it, while it
    stays a `deadlines` error with every attribute. Each pair's class is made once; it
    keeps our class's name.
    """
    ours = type(error)
    if issubclass(ours, theirs):
        return error
    cls = _ALSO.get((ours, theirs))
    if cls is None:
        cls = _ALSO[ours, theirs] = type(
            ours.__name__,
            (ours, theirs),
            {
                "__module__": ours.__module__,
                "__doc__": ours.__doc__,
                "__qualname__": ours.__qualname__,
            },
        )
    dual = cls.__new__(cls, *error.args)
    BaseException.__init__(dual, *error.args)
    dual.__dict__.update(error.__dict__)
    return dual  # type: ignore[return-value]


#: Why a call was refused before it went out: the adaptive throttle, the adaptive limit.
RefusalReason = Literal["throttled", "limit"]


class CallRefused(DeadlinesError):
    """The client refused the call itself, to protect an overloaded dependency; nothing was sent.

    `reason` is ``"throttled"`` (the dependency's `deadlines.Throttle` drew a refusal)
    or ``"limit"`` (its `deadlines.AdaptiveLimit` is reached). Not retried: a retry
    would add the load the refusal is there to take away. Answer with a fallback, or
    pass the overload on (a 503).
    """

    request_sent = False

    def __init__(
        self, message: str | None = None, *, reason: RefusalReason, dependency: str | None = None
    ) -> None:
        self.reason: RefusalReason = reason
        self.dependency = dependency
        where = f"{dependency}: " if dependency else ""
        why = (
            "the adaptive throttle refused it"
            if reason == "throttled"
            else "its concurrency limit is reached"
        )
        super().__init__(message or f"{where}call refused, {why}; nothing was sent")
