"""The planning rules on the reference chapter's worked examples."""

from __future__ import annotations

import math

import pytest

from deadlines import Retry
from deadlines.plan import (
    Latency,
    attempts_that_fit,
    choose_timeout,
    connect_timeout,
    fanout_tail,
    round_up,
)

PRICING = Latency(p50=0.040, p99=0.180, p999=0.310, source="chapter")


def test_pricing_timeout_is_500_ms() -> None:
    """Pricing p50 40 ms, p99 180 ms, p99.9 310 ms gets a 500 ms timeout."""
    timeout, why = choose_timeout(PRICING, critical=True)
    assert timeout == pytest.approx(0.5)
    assert "p99.9" in why


def test_timeout_is_above_p999_and_within_two_to_three_p99() -> None:
    """The critical-call timeout sits above p99.9 and in the 2-3x p99 band for a normal tail."""
    for p99, p999 in [(0.1, 0.15), (0.18, 0.31), (0.05, 0.09), (1.0, 1.6)]:
        timeout, _ = choose_timeout(Latency(0.01, p99, p999, "t"))
        assert timeout > p999
        assert 2 * p99 <= timeout <= 3.4 * p99


def test_long_tail_is_held_to_one_and_a_half_p999() -> None:
    """A p99.9 far above p99 does not run away: at most 1.5x p99.9 before rounding."""
    timeout, why = choose_timeout(Latency(0.01, 0.1, 2.0, "t"))
    assert timeout == pytest.approx(3.0)
    assert "1.5 x p99.9" in why


def test_without_p999_three_times_p99() -> None:
    """Without a trustworthy p99.9 the timeout is 3x p99, rounded up."""
    timeout, why = choose_timeout(Latency(0.02, 0.1, None, "t"))
    assert timeout == pytest.approx(0.3)
    assert "3 x p99" in why


def test_optional_call_is_tighter_but_above_p99() -> None:
    """An optional call gets a tighter timeout than a critical one, still above p99."""
    optional, _ = choose_timeout(PRICING, critical=False)
    critical, _ = choose_timeout(PRICING, critical=True)
    assert PRICING.p99 < optional < critical
    assert optional == pytest.approx(0.4)  # just above p99.9 (310 ms), rounded up


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [(0.440, 0.5), (0.5, 0.5), (0.501, 0.6), (0.0011, 0.0012), (1.7, 2.0), (0.09, 0.1), (7.5, 8.0)],
)
def test_round_up_to_a_round_value(seconds: float, expected: float) -> None:
    """Values round up to the 1-1.2-1.5-2-2.5-3-4-5-6-8 series."""
    assert round_up(seconds) == pytest.approx(expected)


def test_two_second_route_fits_three_attempts_of_500_ms() -> None:
    """A 2 s route with a 500 ms critical call fits at most three attempts, with backoff."""
    assert attempts_that_fit(0.5, 2.0) == 3
    assert attempts_that_fit(0.5, 2.0, Retry(backoff=0.0, jitter=False)) == 4
    assert attempts_that_fit(0.5, 0.4) == 0


def test_five_parallel_calls_make_about_five_percent_slow() -> None:
    """Five parallel calls each over p99 1% of the time slow about 4.9% of requests."""
    assert fanout_tail(5) == pytest.approx(0.049, abs=0.0005)
    assert fanout_tail(1) == pytest.approx(0.01)
    assert fanout_tail(0) == 0.0
    with pytest.raises(ValueError, match="probability"):
        fanout_tail(3, within=1.5)


def test_connect_timeouts_survive_a_lost_syn() -> None:
    """Connect caps leave room for a SYN retransmission (~1 s on Linux)."""
    assert 1.0 < connect_timeout("region") <= 3.0
    assert 3.0 <= connect_timeout("internet") <= 5.0


def test_fraction_over_bounds_from_quantiles() -> None:
    """Bare quantiles give bounds on how many healthy calls a limit cuts."""
    assert PRICING.fraction_over(0.5) == (pytest.approx(0.001), True)
    assert PRICING.fraction_over(0.2) == (pytest.approx(0.01), True)
    assert PRICING.fraction_over(0.18) == (pytest.approx(0.5), True)
    assert PRICING.fraction_over(0.01) == (1.0, True)
    assert not math.isnan(PRICING.fraction_over(1.0)[0])
