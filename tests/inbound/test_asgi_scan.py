"""The ASGI middleware's one-pass header scan gives exactly wire's budget."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deadlines import wire
from deadlines._inbound import renamed
from deadlines.asgi import DeadlineMiddleware

from .test_rules import VALUES


async def _app(scope: object, receive: object, send: object) -> None:
    """An ASGI app that is never called: the scan alone is under test."""


NAMES = st.sampled_from([*wire.KNOWN_HEADERS, "x-my-timeout", "expect", "host"])
RAW = st.binary(max_size=14)


@given(
    pairs=st.lists(st.tuples(NAMES, st.one_of(VALUES.map(str.encode), RAW)), max_size=5),
    header=st.sampled_from([wire.HEADER, "x-my-timeout"]),
)
def test_scan_matches_wire_header_budget(pairs: list[tuple[str, bytes]], header: str) -> None:
    """Inline parsing of our header agrees with wire.header_budget, renamed header included."""
    mw = DeadlineMiddleware(_app, default=1, maximum=2, header=header)
    headers = [(name.encode(), value) for name, value in pairs]
    found, expect = mw._scan({"headers": headers})
    known = {header.encode(), wire.GRPC_HEADER.encode(), wire.ENVOY_HEADER.encode()}
    ours = [pair for pair in headers if pair[0] in known]
    assert found == wire.header_budget(renamed(ours, header.encode()))
    expects = [value for name, value in headers if name == b"expect"]
    assert expect == (bool(expects) and expects[-1].lower() == b"100-continue")


@given(values=st.lists(st.one_of(VALUES.map(str.encode), RAW), max_size=20))
def test_scan_remembers_plain_values_and_reads_them_alike(values: list[bytes]) -> None:
    """A value seen before (parsed from the cache) gives what wire gives, every time."""
    mw = DeadlineMiddleware(_app, default=1, maximum=2)
    header = wire.HEADER.encode()
    for value in values + values:
        found, _ = mw._scan({"headers": [(b"host", b"x"), (header, value)]})
        assert found == wire.header_budget([(header, value)])


def test_scan_cache_stays_bounded() -> None:
    """Distinct values, as from an attacker, never grow the cache past its bound."""
    mw = DeadlineMiddleware(_app, default=1, maximum=2)
    header = wire.HEADER.encode()
    for ms in range(3000):
        found, _ = mw._scan({"headers": [(header, str(ms).encode())]})
        assert found == ms / 1000
        assert len(mw._plain) <= 1024
    assert mw._plain  # it does remember


OURS = wire.HEADER.encode()


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        # No name repeated, ours the only known one (or none at all).
        ([(b"host", b"x"), (b"accept", b"*/*")], (None, False)),
        ([(b"host", b"x"), (OURS, b"1500")], (1.5, False)),
        ([(OURS, b"1500, 900")], (0.9, False)),  # a list: wire reads it
        ([(OURS, b"soon")], (None, False)),
        # Repeated names: a repeated other name, then ours repeated (each value counts).
        ([(b"cookie", b"a"), (b"cookie", b"b")], (None, False)),
        ([(b"cookie", b"a"), (OURS, b"1500"), (b"cookie", b"b")], (1.5, False)),
        ([(OURS, b"1500"), (b"host", b"x"), (OURS, b"700")], (0.7, False)),
        ([(OURS, b"700"), (OURS, b"soon")], (0.7, False)),
        # Another known name with ours, or alone.
        ([(OURS, b"1500"), (b"grpc-timeout", b"800m")], (0.8, False)),
        ([(b"grpc-timeout", b"800m"), (OURS, b"600")], (0.6, False)),
        ([(b"x-envoy-expected-rq-timeout-ms", b"300")], (0.3, False)),
        ([(b"expect", b"100-Continue"), (OURS, b"1500")], (1.5, True)),
        ([(b"expect", b"100-continue")], (None, True)),
        ([(b"expect", b"100-continue"), (b"expect", b"other")], (None, False)),
    ],
)
def test_scan_examples(
    headers: list[tuple[bytes, bytes]], expected: tuple[float | None, bool]
) -> None:
    """Repeated names, ours among other known ones or alone: read as wire reads them."""
    mw = DeadlineMiddleware(_app, default=1, maximum=2)
    assert mw._scan({"headers": headers}) == expected
    assert mw._scan({"headers": headers}) == expected  # again, from the cache if kept


@pytest.mark.parametrize(
    "scope",
    [
        {},
        {"headers": None},
        {"headers": iter([(b"host", b"x"), (OURS, b"1500")])},
        {"headers": [(b"host", b"x", b"extra"), (OURS, b"1500")]},
        {"headers": [[b"host", b"x"], [OURS, b"1500"]]},
    ],
)
def test_scan_odd_headers(scope: dict[str, object]) -> None:
    """No headers, an iterator, lists as pairs, a malformed unknown pair."""
    mw = DeadlineMiddleware(_app, default=1, maximum=2)
    expected = 1.5 if scope.get("headers") else None
    assert mw._scan(scope) == (expected, False)
