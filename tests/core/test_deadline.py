"""Deadline: an immutable instant on the monotonic clock."""

from __future__ import annotations

import math
import time
from datetime import timedelta

import pytest

from deadlines import Deadline
from deadlines.testing import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    """Every test here runs on the fake clock."""
    with FakeClock(start=100.0) as fake:
        yield fake


def test_after_counts_down(clock: FakeClock) -> None:
    """remaining() falls as the clock advances and never goes below zero."""
    d = Deadline.after(2.0)
    assert d.remaining() == 2.0
    clock.advance(0.5)
    assert d.remaining() == 1.5
    assert not d.expired
    clock.advance(5)
    assert d.remaining() == 0.0
    assert d.expired


def test_after_accepts_timedelta(clock: FakeClock) -> None:
    """A timedelta is taken as its total seconds."""
    assert Deadline.after(timedelta(milliseconds=1500)).remaining() == 1.5


def test_zero_is_already_expired(clock: FakeClock) -> None:
    """A zero budget is an expired deadline, not an error."""
    assert Deadline.after(0).expired


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (float("nan"), ValueError, "seconds must be a number of seconds, not NaN"),
        (-1, ValueError, "seconds must be >= 0 seconds, got -1.0"),
        (math.inf, ValueError, "seconds must be finite"),
        (10**9, ValueError, "more than a year; did you pass milliseconds as seconds?"),
        ("2", TypeError, "seconds must be a number of seconds or a timedelta, not '2'"),
        (True, TypeError, "not True"),
    ],
)
def test_after_rejects_bad_values(value: object, error: type[Exception], message: str) -> None:
    """NaN, negative, infinite, absurd and non-numeric budgets are refused clearly."""
    with pytest.raises(error, match=message.replace("?", r"\?").replace(".", r"\.")):
        Deadline.after(value)  # type: ignore[arg-type]


def test_ordering_and_min(clock: FakeClock) -> None:
    """Deadlines order by instant, so min() picks the earliest."""
    early, late = Deadline.after(1), Deadline.after(2)
    assert early < late
    assert late > early
    assert min(late, early) is early
    assert Deadline(early.instant) == early
    assert hash(Deadline(early.instant)) == hash(early)
    assert early != "1"


def test_shrink_never_extends(clock: FakeClock) -> None:
    """shrink() returns the earlier of the two instants."""
    d = Deadline.after(1)
    assert d.shrink(5) is d
    assert d.shrink(0.25).remaining() == 0.25


def test_remaining_ms_rounds_down(clock: FakeClock) -> None:
    """On the wire, milliseconds are rounded down so the callee never gets extra time."""
    assert Deadline.after(1.4509).remaining_ms() == 1450


def test_wall_round_trip() -> None:
    """to_wall() and from_wall() agree within clock-reading jitter."""
    d = Deadline.after(30)
    back = Deadline.from_wall(d.to_wall())
    assert abs(back.instant - d.instant) < 0.01
    assert abs(d.to_wall() - (time.time() + 30)) < 0.05


def test_from_wall_in_the_past_is_expired() -> None:
    """A stored deadline that already passed is expired on arrival."""
    assert Deadline.from_wall(time.time() - 5).expired


@pytest.mark.parametrize("bad", [math.nan, math.inf, "x"])
def test_constructors_reject_garbage(bad: object) -> None:
    """Non-finite and non-numeric instants are refused."""
    with pytest.raises((TypeError, ValueError)):
        Deadline(bad)  # type: ignore[arg-type]
    with pytest.raises((TypeError, ValueError)):
        Deadline.from_wall(bad)  # type: ignore[arg-type]


def test_repr_shows_time_left(clock: FakeClock) -> None:
    """The repr says how long is left, which is what a reader wants in a log."""
    assert repr(Deadline.after(1.5)) == "<Deadline in 1.500s>"
