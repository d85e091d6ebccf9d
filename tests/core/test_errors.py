"""The error taxonomy: what each failure is, says, and allows."""

from __future__ import annotations

import pytest

import deadlines
from deadlines import (
    BudgetExhausted,
    CallerLeft,
    CallTimeout,
    ConnectTimeout,
    DeadlineExceeded,
    DeadlinesError,
    HeadersTimeout,
    IdleTimeout,
    PoolTimeout,
    TotalTimeout,
)


@pytest.mark.parametrize(
    ("cls", "phase", "sent"),
    [
        (PoolTimeout, "pool", False),
        (ConnectTimeout, "connect", False),
        (HeadersTimeout, "headers", True),
        (IdleTimeout, "body", True),
        (TotalTimeout, "body", True),
    ],
)
def test_phase_errors(cls: type[CallTimeout], phase: str, sent: bool) -> None:
    """Each phase error knows its phase, whether the request was sent, and if a retry is safe."""
    err = cls(limit=1.0, elapsed=1.002, dependency="pricing")
    assert err.phase == phase
    assert err.request_sent is sent
    assert err.retry_safe is (not sent)
    assert isinstance(err, TimeoutError)
    assert isinstance(err, DeadlinesError)
    assert not isinstance(err, ConnectionError)


def test_message_names_limit_and_time() -> None:
    """The message says which limit fired, its value, the time spent, and what it means."""
    err = HeadersTimeout(limit=2.0, elapsed=2.0031, dependency="pricing", pool_wait=0.25)
    text = str(err)
    assert "pricing: headers timeout in phase headers after 2003 ms (limit 2000 ms)" in text
    assert "250 ms waiting for a pooled connection" in text
    assert "outcome unknown" in text


def test_total_timeout_takes_phase_in_progress() -> None:
    """A total cap that fires while waiting for headers reports the headers phase."""
    err = TotalTimeout(limit=5.0, elapsed=5.0, phase="headers")
    assert err.phase == "headers"
    assert err.kind == "total"
    assert "total timeout in phase headers" in str(err)


def test_timeouts_are_not_connection_errors() -> None:
    """A broad `except OSError` around I/O must not eat a deadline (TimeoutError is one)."""
    for cls in (DeadlineExceeded, CallTimeout, ConnectTimeout):
        assert not issubclass(cls, ConnectionError)


def test_deadline_exceeded_says_where() -> None:
    """DeadlineExceeded carries the phase and whether the request was sent, when known."""
    err = DeadlineExceeded(limit=1.5, elapsed=1.5, phase="body", dependency="c", request_sent=True)
    assert err.retry_safe is False
    assert "c: deadline exceeded during body after 1500 ms (budget 1500 ms)" in str(err)
    assert DeadlineExceeded().retry_safe is False
    assert "budget ? ms" not in str(DeadlineExceeded(limit=1.0, elapsed=1.0))


def test_budget_exhausted_is_a_deadline_error_and_retry_safe() -> None:
    """Fail-fast is a kind of deadline exceeded in which nothing was sent."""
    err = BudgetExhausted(remaining=0.01, min_useful=0.04, dependency="pricing")
    assert isinstance(err, DeadlineExceeded)
    assert err.request_sent is False
    assert err.retry_safe
    assert str(err) == (
        "pricing: budget exhausted: 10 ms left, the call needs 40 ms; nothing was sent"
    )


def test_caller_left_is_not_a_timeout() -> None:
    """The caller leaving is its own condition, not a timeout."""
    assert issubclass(CallerLeft, DeadlinesError)
    assert not issubclass(CallerLeft, TimeoutError)


def test_all_errors_exported() -> None:
    """Every error is importable from the package root."""
    for name in (
        "DeadlineExceeded",
        "CallTimeout",
        "PoolTimeout",
        "ConnectTimeout",
        "HeadersTimeout",
        "IdleTimeout",
        "TotalTimeout",
        "BudgetExhausted",
        "CallerLeft",
        "DeadlinesError",
    ):
        assert issubclass(getattr(deadlines, name), Exception)
