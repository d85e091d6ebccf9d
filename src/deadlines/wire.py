"""Wire codecs: the deadline travels between services as *time remaining*.

Three headers are understood:

* ``x-request-timeout-ms`` — ours: whole milliseconds remaining, rounded down;
* ``grpc-timeout`` — gRPC's: 1–8 digits and a unit (``H M S m u n``);
* ``x-envoy-expected-rq-timeout-ms`` — set by Envoy on requests it forwards.

Parsers never raise: anything that is not a valid value is ignored, and a server
that gets no valid value falls back to its own default. A caller can never extend a
server's own maximum.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from . import _validate

HEADER = "x-request-timeout-ms"
GRPC_HEADER = "grpc-timeout"
ENVOY_HEADER = "x-envoy-expected-rq-timeout-ms"

#: Header names `inbound_budget` reads, lower-case.
KNOWN_HEADERS: tuple[str, ...] = (HEADER, GRPC_HEADER, ENVOY_HEADER)

_MAX_MS_DIGITS = 12  # about 31 years in ms; longer is garbage, not a budget
_GRPC_UNITS = {"H": 3600.0, "M": 60.0, "S": 1.0, "m": 1e-3, "u": 1e-6, "n": 1e-9}
_DIGITS = frozenset("0123456789")

HeadersLike = Mapping[str, str] | Mapping[bytes, bytes] | Iterable[tuple[bytes, bytes]] | Any


def _text(value: str | bytes) -> str | None:
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("ascii")
        except UnicodeDecodeError:
            return None
    return value if isinstance(value, str) else None


def _is_digits(text: str) -> bool:
    # str.isdigit() accepts "²" and Arabic-Indic digits; the wire allows ASCII only.
    return bool(text) and all(ch in _DIGITS for ch in text)


def parse_ms(value: str | bytes) -> float | None:
    """Seconds from a milliseconds header value (ours or Envoy's), or None if invalid.

    Valid is plain ASCII decimal digits, nothing else: no sign, space, point, exponent.
    """
    text = _text(value)
    if text is None or not _is_digits(text) or len(text) > _MAX_MS_DIGITS:
        return None
    return int(text) / 1000.0


def format_ms(seconds: float) -> str:
    """Whole milliseconds remaining, rounded down, never negative."""
    ms = seconds * 1000.0
    return str(int(ms)) if ms > 0.0 else "0"  # NaN fails the test; int() floors a positive


def parse_grpc_timeout(value: str | bytes) -> float | None:
    """Seconds from a ``grpc-timeout`` value such as ``1450m``, or None if invalid.

    The grammar is 1 to 8 ASCII digits followed by one of ``H M S m u n``.
    """
    text = _text(value)
    if text is None or len(text) < 2 or len(text) > 9:
        return None
    digits, unit = text[:-1], text[-1]
    if unit not in _GRPC_UNITS or not _is_digits(digits):
        return None
    return int(digits) * _GRPC_UNITS[unit]


def format_grpc_timeout(seconds: float) -> str:
    """A ``grpc-timeout`` value for `seconds`, in the finest unit that fits 8 digits.

    Rounds down, so the receiver never gets more time than the sender had.
    """
    if math.isnan(seconds) or seconds <= 0:
        return "0n"
    for unit in ("n", "u", "m", "S", "M", "H"):
        amount = math.floor(seconds / _GRPC_UNITS[unit])
        if amount < 100_000_000:
            return f"{amount}{unit}"
    return "99999999H"


_PARSERS: dict[str, Any] = {HEADER: parse_ms, ENVOY_HEADER: parse_ms}
_PARSERS[GRPC_HEADER] = parse_grpc_timeout
_PARSERS_BYTES: dict[bytes, Any] = {name.encode(): fn for name, fn in _PARSERS.items()}


def _pairs(headers: HeadersLike) -> Iterable[Any]:
    """(name, value) pairs, repeats included: ASGI lists, dicts, multidicts, Starlette,
    ``email.message.Message`` (all of whose ``items()`` keep repeated headers)."""
    items = getattr(headers, "items", None)
    if items is not None:
        try:
            return items()  # type: ignore[no-any-return]
        except TypeError:
            return ()
    return headers


def _split(value: object) -> list[str | bytes]:
    """The elements of a header value; a proxy may fold repeats into one comma list.

    Only list elements lose their surrounding spaces (RFC 9110 list syntax); a lone
    value is taken as it is, so " 100" stays invalid.
    """
    if isinstance(value, bytes | bytearray):
        raw = bytes(value)
        return [p.strip(b" \t") for p in raw.split(b",")] if b"," in raw else [raw]
    if isinstance(value, str):
        return [p.strip(" \t") for p in value.split(",")] if "," in value else [value]
    return []


def header_budget(headers: HeadersLike) -> float | None:
    """The smallest valid remaining time, in seconds, among the known headers, or None."""
    best: float | None = None
    try:
        pairs = iter(_pairs(headers))
    except TypeError:
        return None
    for pair in pairs:
        try:
            key, value = pair
        except (TypeError, ValueError):
            continue
        if isinstance(key, bytes):
            parse = _PARSERS_BYTES.get(key.lower())
        elif isinstance(key, str):
            parse = _PARSERS.get(key.lower())
        else:
            continue
        if parse is None:
            continue
        for part in _split(value):
            seconds = parse(part)
            if seconds is not None and (best is None or seconds < best):
                best = seconds
    return best


def inbound_budget(
    headers: HeadersLike,
    *,
    default: float,
    maximum: float,
    reserve: float = 0.0,
) -> float:
    """Seconds this server may spend on a request, from its headers and its own limits.

    The smallest valid value among the known headers, capped at `maximum` (a caller
    can never extend the server's own limit), or `default` when none is valid; minus
    `reserve` for the time on the wire and for writing the reply. Never negative:
    0.0 means the request arrived already expired.

    `headers` may be ASGI-style ``(bytes, bytes)`` pairs or a mapping of str or bytes.
    """
    default = _validate.seconds(default, "default")
    maximum = _validate.seconds(maximum, "maximum")
    reserve = _validate.seconds(reserve, "reserve")
    if default > maximum:
        raise ValueError(f"default ({default} s) must not exceed maximum ({maximum} s)")
    return capped_budget(header_budget(headers), default=default, maximum=maximum, reserve=reserve)


def capped_budget(found: float | None, *, default: float, maximum: float, reserve: float) -> float:
    """`inbound_budget`'s rule on a deadline already read from the headers (None: none).

    For the inbound middlewares, which read the headers their own way and validated
    their limits once: ``min(found, maximum)``, or `default`, minus `reserve`; >= 0.
    """
    chosen = default if found is None else (found if found < maximum else maximum)
    chosen -= reserve
    return chosen if chosen > 0.0 else 0.0


def outbound_headers(seconds: float) -> dict[str, str]:
    """The header that tells the next hop it has `seconds` left."""
    return {HEADER: format_ms(seconds)}
