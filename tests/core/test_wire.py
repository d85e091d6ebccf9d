"""Wire codecs: parsing never raises, never extends the server's limit."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from deadlines import wire
from deadlines.wire import (
    ENVOY_HEADER,
    GRPC_HEADER,
    HEADER,
    format_grpc_timeout,
    format_ms,
    header_budget,
    inbound_budget,
    parse_grpc_timeout,
    parse_ms,
)

GARBAGE_MS = [
    "",
    " ",
    " 100",
    "100 ",
    "+100",
    "-100",
    "1.5",
    "1e3",
    "0x10",
    "NaN",
    "nan",
    "Infinity",
    "inf",
    "١٠٠",
    "²",
    "100ms",
    "1_000",
    "9" * 13,
    "\x00",
    "10\n",
]


@pytest.mark.parametrize("value", GARBAGE_MS)
def test_ms_garbage_is_invalid(value: str) -> None:
    """Anything but plain ASCII digits is ignored."""
    assert parse_ms(value) is None
    assert parse_ms(value.encode("utf-8")) is None


@pytest.mark.parametrize(("value", "seconds"), [("0", 0.0), ("1450", 1.45), (b"007", 0.007)])
def test_ms_valid(value: str | bytes, seconds: float) -> None:
    """Digits are milliseconds."""
    assert parse_ms(value) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("1450m", 1.45),
        ("2S", 2.0),
        ("1H", 3600.0),
        ("3M", 180.0),
        ("500u", 0.0005),
        ("99999999n", 0.099999999),
        ("0m", 0.0),
    ],
)
def test_grpc_valid(value: str, seconds: float) -> None:
    """The full gRPC grammar: 1-8 digits and one of H M S m u n."""
    assert parse_grpc_timeout(value) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "value",
    ["", "m", "100", "123456789m", "1.5S", "-1S", "+1S", "1s", "1h", "1 S", "1Sx", "S1", "١S"],
)
def test_grpc_invalid(value: str) -> None:
    """Nine digits, unknown units, signs and decimals are invalid."""
    assert parse_grpc_timeout(value) is None


def test_format_ms_floors_and_clamps() -> None:
    """Remaining time goes out as whole ms rounded down, never negative."""
    assert format_ms(1.4509) == "1450"
    assert format_ms(-3) == "0"
    assert format_ms(float("nan")) == "0"


def test_format_grpc_picks_a_unit_that_fits() -> None:
    """Values use at most 8 digits, rounding down."""
    assert format_grpc_timeout(1.45) == "1450000u"
    assert format_grpc_timeout(0.05) == "50000000n"
    assert format_grpc_timeout(0) == "0n"
    assert format_grpc_timeout(10**9) == "16666666M"


@given(st.binary(max_size=64))
def test_parsers_never_raise_on_bytes(raw: bytes) -> None:
    """No byte string makes a parser raise."""
    parse_ms(raw)
    parse_grpc_timeout(raw)
    inbound_budget([(HEADER.encode(), raw), (GRPC_HEADER.encode(), raw)], default=1, maximum=2)


@given(st.text(max_size=64))
def test_parsers_never_raise_on_text(text: str) -> None:
    """No text makes a parser raise."""
    parse_ms(text)
    parse_grpc_timeout(text)
    inbound_budget({HEADER: text, ENVOY_HEADER: text}, default=1, maximum=2)


@given(st.integers(min_value=0, max_value=10**11))
def test_ms_round_trip(ms: int) -> None:
    """format_ms(parse_ms(x)) == x for every valid value."""
    seconds = parse_ms(str(ms))
    assert seconds is not None
    assert format_ms(seconds) in (str(ms), str(ms - 1))  # float floor may lose 1 ms
    assert abs(int(format_ms(seconds)) - ms) <= 1


@given(st.floats(min_value=0, max_value=10**7, allow_nan=False))
def test_grpc_round_trip_never_grows(seconds: float) -> None:
    """A formatted grpc-timeout parses back to no more than the original."""
    back = parse_grpc_timeout(format_grpc_timeout(seconds))
    assert back is not None
    assert back <= seconds + 1e-9
    # 8 digits: after a change of unit the value keeps at least 5 significant digits.
    assert seconds - back <= max(1e-9, seconds * 1e-5)


@given(
    st.lists(
        st.tuples(
            st.sampled_from([HEADER, GRPC_HEADER, ENVOY_HEADER, "x-other"]), st.binary(max_size=16)
        ),
        max_size=6,
    ),
    st.floats(min_value=0, max_value=100),
    st.floats(min_value=0, max_value=100),
)
def test_budget_never_exceeds_maximum(pairs: list[tuple[str, bytes]], a: float, b: float) -> None:
    """Whatever the headers, the budget is within [0, maximum]."""
    default, maximum = min(a, b), max(a, b)
    budget = inbound_budget(
        [(k.encode(), v) for k, v in pairs], default=default, maximum=maximum, reserve=0.0
    )
    assert 0.0 <= budget <= maximum


@given(
    st.lists(
        st.binary(max_size=12).filter(lambda v: parse_ms(v) is None and b"," not in v),
        max_size=4,
    )
)
def test_garbage_gives_default(values: list[bytes]) -> None:
    """Only invalid values present (no comma lists): the route default applies."""
    budget = inbound_budget([(HEADER.encode(), v) for v in values], default=1.5, maximum=3)
    assert budget == 1.5


def test_budget_rules() -> None:
    """Min of valid headers, capped at maximum, minus reserve; default when none."""
    assert inbound_budget({}, default=1.8, maximum=5, reserve=0.05) == pytest.approx(1.75)
    assert inbound_budget({HEADER: "1450"}, default=1.8, maximum=5) == pytest.approx(1.45)
    assert inbound_budget({HEADER: "99999"}, default=1.8, maximum=5) == 5
    assert inbound_budget({HEADER: "0"}, default=1.8, maximum=5, reserve=0.05) == 0.0
    headers = [
        (b"X-Request-Timeout-Ms", b"900"),
        (b"grpc-timeout", b"1S"),
        (b"x-envoy-expected-rq-timeout-ms", b"700"),
        (b"x-request-timeout-ms", b"x"),
    ]
    assert inbound_budget(headers, default=1.8, maximum=5) == pytest.approx(0.7)


def test_repeated_headers_take_minimum() -> None:
    """Disagreeing repeats (or one folded with commas) take the smallest valid value."""
    pairs = [(b"x-request-timeout-ms", b"800"), (b"x-request-timeout-ms", b"300")]
    assert header_budget(pairs) == pytest.approx(0.3)
    assert header_budget({HEADER: "800, bad, 200"}) == pytest.approx(0.2)
    assert header_budget([(b"x-request-timeout-ms", b"900,\t400")]) == pytest.approx(0.4)
    assert header_budget([(b"x-request-timeout-ms", b"\t400")]) is None


def test_multidict_style_headers() -> None:
    """Objects with getall/get_all (multidict, email.message) are read through it."""
    from email.message import Message

    msg = Message()
    msg["X-Request-Timeout-Ms"] = "400"
    msg["X-Request-Timeout-Ms"] = "250"
    assert header_budget(msg) == pytest.approx(0.25)


def test_budget_validates_its_own_settings() -> None:
    """A default above the maximum is a configuration error."""
    with pytest.raises(ValueError, match="must not exceed maximum"):
        inbound_budget({}, default=5, maximum=1)


def test_outbound_headers() -> None:
    """The outgoing header carries whole ms remaining."""
    assert wire.outbound_headers(1.4509) == {"x-request-timeout-ms": "1450"}
