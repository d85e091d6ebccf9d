"""The ASGI middleware's one-pass header scan gives exactly wire's budget."""

from __future__ import annotations

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
