"""The planner's input: a route's call tree in TOML, loaded and validated.

    [route]
    name = "GET /checkout"
    deadline = "2s"                  # the API route's deadline
    mode = "sequential"              # how its calls run (or "parallel")

    [[layers]]                       # the outer layers, outermost first
    name = "browser"
    timeout = "10s"

    [[route.calls]]
    name = "pricing"
    critical = true
    latency = { p50 = "40ms", p99 = "180ms", p999 = "310ms" }

    [[route.calls]]                  # a group: `mode` and `calls`, no latency
    name = "shards"
    mode = "parallel"
    [[route.calls.calls]]
    name = "shard-1"
    latency = { csv = "shard1.csv", unit = "ms" }

A call may have its own ``calls``: the callee's downstream calls, planned inside the
callee's budget. Every error names the file, the line and what was expected. A bare
number is seconds; one too large to be meant as seconds (``deadline = 2000``) is kept
and reported in `Route.warnings`.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from .._tools import durations as _durations
from .._tools.toml_lines import Locator
from .._tools.toml_lines import Path as KeyPath
from . import _latency
from ._errors import PlanError
from ._latency import Latency

Mode = Literal["sequential", "parallel"]
Network = Literal["region", "internet"]

#: Outer layers in the chapter's order; the route deadline must be shorter than all.
_ROUTE_KEYS = {"name", "deadline", "reserve", "mode", "network", "calls", "backoff"}
_LAYER_KEYS = {"name", "timeout"}
_CALL_KEYS = {
    "name",
    "latency",
    "critical",
    "timeout",
    "connect",
    "attempts",
    "max",
    "network",
    "deadline",
    "mode",
    "calls",
    "backoff",
}
_GROUP_KEYS = {"name", "mode", "calls"}
_LATENCY_KEYS = {
    "p50",
    "p99",
    "p999",
    "p99.9",
    "csv",
    "column",
    "unit",
    "prometheus",
    "metric",
    "labels",
}


@dataclass(frozen=True, slots=True)
class Layer:
    """One outer layer (browser, edge, load balancer) and its timeout in seconds."""

    name: str
    timeout: float
    line: int | None


@dataclass(frozen=True, slots=True)
class Call:
    """One outbound call: the callee's measured latency and what is configured today.

    `timeout`, `connect` and `attempts` are the values in production now (None when
    not given); the planner checks them and proposes its own. `max` is a product
    limit (recommendations may not take more than 300 ms). `calls` are the callee's
    own downstream calls, planned inside `deadline` (the callee's own limit).
    """

    name: str
    where: str
    line: int | None
    latency: Latency
    critical: bool
    timeout: float | None
    connect: float | None
    attempts: int | None
    max: float | None
    network: Network
    backoff: float
    deadline: float | None
    calls: Group | None


@dataclass(frozen=True, slots=True)
class Group:
    """Calls that run one after another (``sequential``) or all at once (``parallel``)."""

    name: str
    where: str
    line: int | None
    mode: Mode
    items: tuple[Call | Group, ...]


@dataclass(frozen=True, slots=True)
class Route:
    """A route: its deadline, the layers in front of it, and its call tree.

    `warnings` are located lines (``FILE:LINE: WHERE: warning: ...``) about values that
    were accepted but look like a mistake.
    """

    name: str
    file: str
    line: int | None
    deadline: float
    reserve: float
    layers: tuple[Layer, ...]
    body: Group
    warnings: tuple[str, ...] = ()


class _Reader:
    """Validation helpers that turn a wrong value into a located `PlanError`."""

    def __init__(self, file: str, text: str, base: Path) -> None:
        self.file = file
        self.base = base
        self.locator = Locator(text)
        self.warnings: list[str] = []

    def error(self, path: KeyPath, message: str) -> PlanError:
        return PlanError(message, file=self.file, line=self.locator.line(path), where=_dotted(path))

    def warn(self, path: KeyPath, message: str) -> None:
        self.warnings.append(str(self.error(path, f"warning: {message}")))

    def table(self, value: object, path: KeyPath, allowed: set[str]) -> Mapping[str, Any]:
        if not isinstance(value, dict):
            raise self.error(path, f"expected a table, got {_kind(value)}")
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise self.error(
                (*path, unknown[0]),
                f"unknown key {unknown[0]!r}; expected one of: {', '.join(sorted(allowed))}",
            )
        return value

    def string(self, table: Mapping[str, Any], key: str, path: KeyPath) -> str:
        value = table.get(key)
        if not isinstance(value, str) or not value.strip():
            got = "nothing" if key not in table else repr(value)
            raise self.error((*path, key), f"expected a non-empty string, got {got}")
        return value

    def duration(
        self, table: Mapping[str, Any], key: str, path: KeyPath, *, required: bool = False
    ) -> float | None:
        if key not in table:
            if required:
                raise self.error(path, f"expected {key} = {_durations.EXPECTED}, got nothing")
            return None
        try:
            seconds = _durations.parse(table[key])
        except ValueError as exc:
            raise self.error((*path, key), str(exc)) from None
        doubt = _durations.implausible_bare(table[key])
        if doubt is not None:
            self.warn((*path, key), doubt)
        return seconds

    def positive(self, table: Mapping[str, Any], key: str, path: KeyPath) -> float | None:
        value = self.duration(table, key, path)
        if value is not None and value <= 0:
            raise self.error((*path, key), f"expected a duration > 0, got {table[key]!r}")
        return value

    def boolean(self, table: Mapping[str, Any], key: str, path: KeyPath, default: bool) -> bool:
        value = table.get(key, default)
        if not isinstance(value, bool):
            raise self.error((*path, key), f"expected true or false, got {value!r}")
        return value

    def choice(
        self, table: Mapping[str, Any], key: str, path: KeyPath, options: tuple[str, ...]
    ) -> str:
        value = table.get(key, options[0])
        if value not in options:
            expected = " or ".join(repr(o) for o in options)
            raise self.error((*path, key), f"expected {expected}, got {value!r}")
        return str(value)


def _dotted(path: KeyPath) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def _kind(value: object) -> str:
    names = {dict: "a table", list: "an array", str: "a string", bool: "a boolean"}
    return names.get(type(value), f"{type(value).__name__} {value!r}")


def load(path: str | Path) -> Route:
    """Read and validate a plan file; raises `PlanError` naming the file and line."""
    file = Path(path)
    return parse(read_text(file, "the plan"), file=str(path), base=file.parent)


def read_text(file: Path, what: str) -> str:
    """The UTF-8 text of `file`; `PlanError` naming it when it cannot be read as such."""
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise PlanError(f"cannot read {what}: {exc.strerror}", file=str(file)) from exc
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PlanError(
            f"cannot read {what}: expected UTF-8 text, got byte 0x{data[exc.start]:02x}"
            f" at offset {exc.start}",
            file=str(file),
        ) from None


def parse(text: str, *, file: str = "<plan>", base: Path | None = None) -> Route:
    """Validate plan text; sample files are looked up relative to `base`."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # Python 3.11 has the position only in the message: "... (at line 3, column 12)".
        found = re.search(r"\(at line (\d+), column \d+\)", str(exc))
        line = int(found.group(1)) if found else None
        message = str(exc).split(" (at line")[0]
        raise PlanError(f"expected valid TOML: {message}", file=file, line=line) from exc
    reader = _Reader(file, text, base if base is not None else Path.cwd())
    unknown = sorted(set(data) - {"route", "layers"})
    if unknown:
        raise reader.error(
            (unknown[0],), f"unknown top-level key {unknown[0]!r}; expected [route] and [[layers]]"
        )
    if "route" not in data:
        raise PlanError("expected a [route] table, got none", file=file)
    route_path: KeyPath = ("route",)
    route = reader.table(data["route"], route_path, _ROUTE_KEYS)
    deadline = reader.positive(route, "deadline", route_path)
    if deadline is None:
        raise reader.error(route_path, f"expected deadline = {_durations.EXPECTED}, got nothing")
    reserve = reader.duration(route, "reserve", route_path) or 0.0
    if reserve >= deadline:
        raise reader.error(
            (*route_path, "reserve"), f"expected a reserve shorter than the deadline ({deadline} s)"
        )
    layers = _layers(reader, data.get("layers", []))
    defaults = {
        "network": reader.choice(route, "network", route_path, ("region", "internet")),
        "backoff": reader.duration(route, "backoff", route_path),
    }
    body = _group(
        reader, route, route_path, defaults, name=reader.string(route, "name", route_path)
    )
    if not body.items:
        raise reader.error(route_path, "expected at least one [[route.calls]], got none")
    return Route(
        name=body.name,
        file=file,
        line=reader.locator.line(route_path),
        deadline=deadline,
        reserve=reserve,
        layers=layers,
        body=body,
        warnings=tuple(reader.warnings),
    )


def _layers(reader: _Reader, value: object) -> tuple[Layer, ...]:
    if not isinstance(value, list):
        raise reader.error(("layers",), f"expected [[layers]] tables, got {_kind(value)}")
    layers = []
    for index, item in enumerate(value):
        path: KeyPath = ("layers", index)
        table = reader.table(item, path, _LAYER_KEYS)
        timeout = reader.positive(table, "timeout", path)
        if timeout is None:
            raise reader.error(path, f"expected timeout = {_durations.EXPECTED}, got nothing")
        layers.append(Layer(reader.string(table, "name", path), timeout, reader.locator.line(path)))
    return tuple(layers)


def _group(
    reader: _Reader,
    table: Mapping[str, Any],
    path: KeyPath,
    defaults: Mapping[str, Any],
    *,
    name: str,
) -> Group:
    mode = reader.choice(table, "mode", path, ("sequential", "parallel"))
    raw = table.get("calls", [])
    if not isinstance(raw, list):
        raise reader.error((*path, "calls"), f"expected [[calls]] tables, got {_kind(raw)}")
    items: list[Call | Group] = []
    for index, item in enumerate(raw):
        item_path: KeyPath = (*path, "calls", index)
        if not isinstance(item, dict):
            raise reader.error(item_path, f"expected a table, got {_kind(item)}")
        if "latency" in item:
            items.append(_call(reader, item, item_path, defaults))
        elif "calls" in item or "mode" in item:
            group_table = reader.table(item, item_path, _GROUP_KEYS)
            group = _group(
                reader,
                group_table,
                item_path,
                defaults,
                name=reader.string(group_table, "name", item_path),
            )
            if not group.items:
                raise reader.error(item_path, "expected calls in this group, got none")
            items.append(group)
        else:
            raise reader.error(
                item_path,
                "expected a call (with latency = {...}) or a group (with mode and calls)",
            )
    return Group(name, _dotted(path), reader.locator.line(path), mode, tuple(items))  # type: ignore[arg-type]


def _call(
    reader: _Reader, item: Mapping[str, Any], path: KeyPath, defaults: Mapping[str, Any]
) -> Call:
    table = reader.table(item, path, _CALL_KEYS)
    name = reader.string(table, "name", path)
    attempts = table.get("attempts")
    if attempts is not None and (
        isinstance(attempts, bool) or not isinstance(attempts, int) or not 1 <= attempts <= 100
    ):
        raise reader.error((*path, "attempts"), f"expected an integer 1-100, got {attempts!r}")
    network = (
        reader.choice(table, "network", path, ("region", "internet"))
        if ("network" in table)
        else defaults["network"]
    )
    backoff = reader.duration(table, "backoff", path)
    if backoff is None:
        backoff = defaults["backoff"] if defaults["backoff"] is not None else 0.05
    child_defaults = {**defaults, "network": network}
    calls = None
    if "calls" in table:
        calls = _group(reader, table, path, child_defaults, name=name)
    return Call(
        name=name,
        where=_dotted(path),
        line=reader.locator.line(path),
        latency=_latency_of(reader, table.get("latency"), (*path, "latency")),
        critical=reader.boolean(table, "critical", path, True),
        timeout=reader.positive(table, "timeout", path),
        connect=reader.positive(table, "connect", path),
        attempts=attempts,
        max=reader.positive(table, "max", path),
        network=network,  # type: ignore[arg-type]
        backoff=backoff,
        deadline=reader.positive(table, "deadline", path),
        calls=calls,
    )


def _latency_of(reader: _Reader, value: object, path: KeyPath) -> Latency:
    table = reader.table(value, path, _LATENCY_KEYS)
    sources = [key for key in ("p99", "csv", "prometheus") if key in table]
    if len(sources) != 1:
        raise reader.error(
            path,
            "expected exactly one of: p50/p99/p999 quantiles, csv = FILE, prometheus = FILE;"
            f" got {', '.join(sources) or 'none'}",
        )
    unit = table.get("unit")
    if unit is not None and unit not in ("ms", "s", "us"):
        raise reader.error((*path, "unit"), f'expected "ms", "s" or "us", got {unit!r}')
    if "p99" in table:
        return _inline(reader, table, path)
    key = sources[0]
    name = table[key]
    if not isinstance(name, str) or not name:
        raise reader.error((*path, key), f"expected a file name, got {name!r}")
    file = reader.base / name
    try:
        text = read_text(file, "the samples")
    except PlanError as exc:
        raise reader.error((*path, key), f"{file}: {exc.message}") from exc
    if key == "csv":
        column = table.get("column")
        if column is not None and (isinstance(column, bool) or not isinstance(column, str | int)):
            raise reader.error((*path, "column"), f"expected a name or number, got {column!r}")
        latency = _latency.read_csv(text, file=str(file), column=column, unit=unit)
    else:
        labels = table.get("labels", {})
        if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
            raise reader.error((*path, "labels"), f"expected a table of strings, got {labels!r}")
        metric = table.get("metric")
        if metric is not None and not isinstance(metric, str):
            raise reader.error((*path, "metric"), f"expected a metric name, got {metric!r}")
        latency = _latency.read_prometheus(
            text, file=str(file), metric=metric, labels=labels, unit=unit
        )
    slowest = max(latency.p99, latency.p999 or 0.0)
    if slowest > _durations.LONGEST:
        raise reader.error(
            (*path, key), f"{file}: expected latencies of at most a year, got {slowest:g} s"
        )
    return latency


def _inline(reader: _Reader, table: Mapping[str, Any], path: KeyPath) -> Latency:
    extra = sorted(set(table) & {"csv", "column", "prometheus", "metric", "labels", "unit"})
    if extra:
        raise reader.error((*path, extra[0]), f"{extra[0]!r} does not go with inline quantiles")
    p50 = reader.duration(table, "p50", path, required=True)
    p99 = reader.duration(table, "p99", path, required=True)
    if "p999" in table and "p99.9" in table:
        raise reader.error(path, "expected p999 or p99.9, not both")
    p999 = reader.duration(table, "p999" if "p999" in table else "p99.9", path)
    assert p50 is not None
    assert p99 is not None
    try:
        _latency.check_quantiles(p50, p99, p999)
    except ValueError as exc:
        raise reader.error(path, str(exc)) from None
    return Latency(p50=p50, p99=p99, p999=p999, source="measured quantiles")
