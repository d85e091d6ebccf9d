"""The reference chapter's measured figures, to set beside the lab's measurements.

The chapter (*Timeouts and Deadlines*) measured Node 22: Part 2 its clients' defaults,
Part 3 the cascade, Part 4 the three-hop chain. Its slow-server simulation gives no
figures, only a prediction. Each experiment's tables show these figures in rows of
their own and end with a verdict: the measurement agrees with the chapter, or differs,
and why.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: Part 2: Node 22's clients against the chapter's servers: a label, the limits set, and
#: per server (the lab's names) either (seconds the call took, the limit that ended it)
#: or a word for what happened instead.
DEFAULTS: tuple[tuple[str, str, dict[str, tuple[float, float] | str]], ...] = (
    ("Node fetch, no options", "10 s/300 s",
     {"silent": (300.9, 300.0), "tls-never": (10.0, 10.0), "blackhole": (10.5, 10.0)}),
    ("Node undici bodyTimeout 2 s", "2 s/read", {"trickle": "never"}),
    ("Node AbortSignal.timeout", "2 s or 3 s", {"silent": (2.007, 2.0), "trickle": (3.004, 3.0)}),
    ("Node headers 2 s, connect 1 s", "2 s, 1 s",
     {"silent": (2.502, 2.0), "blackhole": (1.501, 1.0)}),
    ("Node http, no options", "none", {"blackhole": "75 s (OS)"}),
    ("Node http, timeout 1 s", "1 s event", {"silent": "runs on"}),
)  # fmt: skip


@dataclass(frozen=True)
class CascadeRun:
    """Part 3, one variant: /home in flight after 10 s, and /checkout's outcome."""

    in_flight: int
    growing: bool
    in_flight_text: str
    checkout_ok: int
    checkout_sent: int
    checkout_p99_ms: float | None


CASCADE: dict[str, CascadeRun] = {
    "no_timeout": CascadeRun(479, True, "479, growing ~48/s", 4, 99, None),
    "timeout": CascadeRun(15, False, "15, flat", 99, 99, 10.0),
    "bulkhead": CascadeRun(480, True, "480, still growing", 99, 99, 11.0),
}
#: Part 3: the downstream "had 20 open requests the whole time" without a timeout.
CASCADE_DOWNSTREAM_OPEN = 20
#: The chapter's cascade parameters; with others, only the shape can be compared.
CASCADE_PARAMS = {"duration": 10.0, "home_rate": 50.0, "checkout_rate": 10.0,
                  "pool_size": 20, "recs_timeout": 0.3, "checkout_timeout": 5.0}  # fmt: skip


@dataclass(frozen=True)
class ChainRun:
    """Part 4, one variant: what each hop did, in ms since the user's request."""

    a_answered_ms: float
    b_gave_up_ms: float
    c_budget_ms: float | None
    c_ended_ms: float
    c_committed: bool
    c_stop_reason: str | None


CHAIN: dict[str, ChainRun] = {
    "fixed": ChainRun(2004.0, 2509.0, None, 3510.0, True, None),
    "propagated": ChainRun(1966.0, 1963.0, 1448.0, 1966.0, False, "caller left"),
}
#: The chapter's chain parameters (its Node middleware keeps RESERVE_MS = 50 per hop).
CHAIN_PARAMS = {"user_wait": 2.0, "a_work": 0.2, "b_work": 0.3, "c_work": 3.0,
                "ab_timeout": 1.8, "bc_timeout": 2.0, "reserve": 0.05}  # fmt: skip

#: The slow-server simulation's prediction (the chapter gives no figures for it).
SLOW_SERVER = (
    "the chapter's simulation gives no figures: one server 5× slower stays healthy, round"
    " robin keeps sending it its share, and its queue and p99 grow"
)


def same_params(params: Mapping[str, object], chapter: Mapping[str, object]) -> bool:
    """Whether a run used the chapter's parameters (else only shapes compare)."""
    return all(params.get(key) == value for key, value in chapter.items())


def verdict(agrees: bool, text: str) -> str:
    """``agrees: ...`` or ``differs: ...``."""
    return f"{'agrees' if agrees else 'differs'}: {text}"
