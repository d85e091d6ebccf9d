"""The planning rules: each number the planner proposes, and why (reference chapter, Part 5).

Per-call timeout, for a critical call:

    timeout = round_up(max(min(p99.9 + (p99.9 − p99), 1.5 × p99.9), 2 × p99))

  * ``p99.9 + (p99.9 − p99)`` extends the tail by one more "nine": in most latency
    tails each nine adds about as much as the one before, so this estimates p99.99 and
    the timeout fires for broken calls, not for slow but normal ones. It is held to
    at most 1.5 × p99.9 ("a little above p99.9") so a freak p99.9 cannot run away.
  * ``2 × p99`` is the floor of the usual "2–3× p99" band.
  * Without a trustworthy p99.9 (under 1,000 observations) it is ``3 × p99``: the top
    of the band, because less is known about the tail.
  * ``round_up`` goes to the next value of 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 × 10ⁿ ms,
    so the number is one a person can defend and alert on.

  Pricing (p50 40 ms, p99 180 ms, p99.9 310 ms): min(440, 465) = 440 ≥ 360 → 500 ms.

An optional call (the page renders without it) gets ``round_up(max(p99.9, 1.5 × p99))``
(``2 × p99`` without p99.9): tighter, since a fallback is cheap, yet still above p99.

Then the timeout is capped by the call's share of the deadline: the budget left
after every sequential sibling takes its p99.
"""

from __future__ import annotations

import math

from .._dependency import Retry
from ._latency import Latency

#: One lost SYN is retransmitted after ~1 s on Linux; 1.5 s lets it, and a TLS
#: handshake, still succeed inside one attempt.
CONNECT_IN_REGION = 1.5
#: Across the internet: two lost SYNs (1 s + 2 s) and the extra round trips.
CONNECT_INTERNET = 4.0
#: Below this a connect timeout leaves no room for the first SYN retransmission.
SYN_RETRANSMIT = 1.0

_NICE = (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0)


def round_up(seconds: float) -> float:
    """The next "round" value at or above `seconds` (1-1.2-1.5-2-2.5-3-4-5-6-8 series, in ms)."""
    ms = max(seconds * 1000.0, 1.0)
    exponent = math.floor(math.log10(ms))
    scale = 10.0**exponent
    mantissa = ms / scale
    step = next(s for s in _NICE if s >= mantissa - 1e-9)
    return round(step * scale, 6) / 1000.0


def choose_timeout(latency: Latency, *, critical: bool = True) -> tuple[float, str]:
    """The per-attempt timeout the latency calls for (before any cap), and the rule used."""
    p99, p999 = latency.p99, latency.p999
    if critical:
        if p999 is not None:
            extended = p999 + (p999 - p99)
            tail, why = (extended, "p99.9 + (p99.9 - p99)")
            if extended > 1.5 * p999:
                tail, why = (1.5 * p999, "1.5 x p99.9 (long tail, held down)")
            raw = max(tail, 2.0 * p99)
            if raw > tail:
                why = "2 x p99"
        else:
            raw, why = 3.0 * p99, "3 x p99 (no trustworthy p99.9)"
    elif p999 is not None:
        raw = max(p999, 1.5 * p99)
        why = "optional: just above p99.9" if raw == p999 else "optional: 1.5 x p99"
    else:
        raw, why = 2.0 * p99, "optional: 2 x p99 (no trustworthy p99.9)"
    return round_up(raw), f"{why} = {raw * 1000:.0f} ms, rounded up"


def connect_timeout(network: str) -> float:
    """The connect cap for a network: ``"region"`` 1.5 s, ``"internet"`` 4 s."""
    return CONNECT_INTERNET if network == "internet" else CONNECT_IN_REGION


def worst_case(timeout: float, attempts: int, retry: Retry) -> float:
    """Time `attempts` attempts take if each runs to its timeout, backoff sleeps included."""
    sleeps = sum(retry.backoff_for(n) for n in range(1, attempts))
    return attempts * timeout + sleeps


def attempts_that_fit(timeout: float, available: float, retry: Retry | None = None) -> int:
    """How many attempts of `timeout` each, with backoff between them, fit in `available`.

    The worst case counts: every attempt runs to its timeout and every backoff sleeps
    its full length (jitter only shortens it). A 2 s route with a 500 ms critical call
    fits three: four would need 2 s of attempts plus 150 ms of backoff.
    """
    policy = retry if retry is not None else Retry(jitter=False)
    policy = Retry(
        attempts=100,
        backoff=policy.backoff,
        max_backoff=policy.max_backoff,
        multiplier=policy.multiplier,
        jitter=False,
    )
    count = 0
    while count < 100 and worst_case(timeout, count + 1, policy) <= available + 1e-9:
        count += 1
    return count


def fanout_tail(calls: int, within: float = 0.99) -> float:
    """Share of requests slowed by at least one of `calls` parallel calls: 1 − within^n.

    Five calls, each over its p99 1% of the time: 1 − 0.99⁵ ≈ 4.9%.
    """
    if calls < 0:
        raise ValueError(f"expected a number of calls >= 0, got {calls}")
    if not 0.0 <= within <= 1.0:
        raise ValueError(f"expected a probability in [0, 1], got {within}")
    return 1.0 - within**calls
