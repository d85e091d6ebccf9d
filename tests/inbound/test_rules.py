"""The shared inbound rules: the fast budget equals wire.inbound_budget; route patterns."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deadlines import wire
from deadlines._inbound import Limits, RouteTable, limits, limits_of, timeout_body
from deadlines._request import budget

VALUES = st.one_of(
    st.integers(min_value=-5, max_value=10**14).map(str),
    st.sampled_from(["", "abc", "1e3", " 12", "12 ", "1.5", "5S", "700m", "3H", "9u", "0n"]),
    st.integers(min_value=0, max_value=10**9).map(lambda n: f"{n}m"),
    st.text(max_size=12),
    st.lists(st.integers(0, 99999).map(str), min_size=2, max_size=3).map(", ".join),
)
NAMES = st.sampled_from(wire.KNOWN_HEADERS)


@given(
    pairs=st.lists(st.tuples(NAMES, VALUES), max_size=4),
    as_bytes=st.booleans(),
    default=st.floats(min_value=0.001, max_value=10),
    extra=st.floats(min_value=0, max_value=100),
    reserve=st.floats(min_value=0, max_value=1),
)
def test_budget_matches_wire_inbound_budget(
    pairs: list[tuple[str, str]], as_bytes: bool, default: float, extra: float, reserve: float
) -> None:
    """The middlewares' budget is exactly wire.inbound_budget for the same headers."""
    found: list[tuple[object, object]] = list(pairs)
    if as_bytes:
        found = [(k.encode(), v.encode("utf-8", "surrogatepass")) for k, v in pairs]
    maximum = default + extra
    expected = wire.inbound_budget(found, default=default, maximum=maximum, reserve=reserve)
    limits_ = Limits(default=default, maximum=maximum)
    assert budget(wire.header_budget(found), limits_, reserve) == expected


def test_route_table_precedence() -> None:
    """Exact beats prefix, longer prefix beats shorter, a method beats none."""
    one, two, three, four = (Limits(default=n, maximum=n) for n in (1, 2, 3, 4))
    fallback = Limits(default=9, maximum=9)
    table = RouteTable({"/a/*": one, "/a/b/*": two, "POST /a/b/*": three, "/a/b/c": four}, fallback)
    assert table.match("GET", "/a/x") == ("/a/*", one)
    assert table.match("GET", "/a/b/x") == ("/a/b/*", two)
    assert table.match("POST", "/a/b/x") == ("POST /a/b/*", three)
    assert table.match("POST", "/a/b/c") == ("/a/b/c", four)
    assert table.match("GET", "/elsewhere") == (None, fallback)


def test_route_table_head_takes_get_patterns() -> None:
    """HEAD is served by the GET handler, so it takes a GET pattern it has none of its own."""
    get, head, bare, prefix = (Limits(default=n, maximum=n) for n in (1, 2, 3, 4))
    fallback = Limits(default=9, maximum=9)
    table = RouteTable(
        {"GET /r": get, "/r": bare, "HEAD /h": head, "GET /h": get, "GET /p/*": prefix}, fallback
    )
    assert table.match("HEAD", "/r") == ("GET /r", get)  # GET's own beats the method-less
    assert table.match("HEAD", "/h") == ("HEAD /h", head)  # HEAD's own beats GET's
    assert table.match("HEAD", "/p/x") == ("GET /p/*", prefix)
    assert table.match("POST", "/r") == ("/r", bare)
    assert table.match("POST", "/p/x") == (None, fallback)
    # A HEAD pattern of its own wins, whatever order the patterns were given in.
    own = RouteTable({"GET /f/*": get, "HEAD /f/*": head}, fallback)
    assert own.match("HEAD", "/f/x") == ("HEAD /f/*", head)
    assert own.match("GET", "/f/x") == ("GET /f/*", get)


def test_limits_validation_and_marks() -> None:
    """Limits take seconds or timedeltas, refuse default > maximum; the decorator marks."""
    assert Limits(default=timedelta(milliseconds=500), maximum=2).default == 0.5
    with pytest.raises(ValueError, match="must not exceed"):
        Limits(default=3, maximum=2)
    with pytest.raises(ValueError, match="default"):
        Limits(default=0, maximum=2)

    @limits(default=1, maximum=2)
    def handler() -> None:
        return None

    assert limits_of(handler) == Limits(default=1, maximum=2)
    assert limits_of(lambda: None) is None


def test_timeout_body_rounds_to_whole_milliseconds() -> None:
    """A 60 ms header less a 50 ms reserve is 0.00999... s in floating point: 10 ms, not 9."""
    body = json.loads(
        timeout_body(limit="x-request-timeout-ms", budget=0.06 - 0.05, elapsed=0.0119)
    )
    assert (body["budget_ms"], body["elapsed_ms"]) == (10, 12)
