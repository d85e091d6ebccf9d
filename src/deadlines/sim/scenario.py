"""Scenarios in TOML: loading, variants, and validation with errors that name the key.

    name = "cascade"
    duration = "10s"

    [services.api.routes.home]
    steps = [{ call = ["recs", "price"] }]     # one step: two calls in parallel

    [services.api.calls.recs]
    to = "downstream/recs"
    pool = "shared"

    [[load]]
    to = "api/home"
    rate = 50

    [variants.timeout.services.api.calls.recs]
    timeout = "300ms"
    fallback = true

Times are seconds as numbers, or strings with a unit (``"300ms"``, ``"2s"``, ``"1m"``),
read as `deadlines plan` reads them; ``"none"`` removes a limit. Each
``[variants.NAME]`` table is merged over the base (tables merge key by key, arrays are
replaced). docs/sim.md lists every key.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from deadlines import Retry

from .._tools.toml_lines import Locator, path_of
from . import _read as read
from .model import (
    POLICIES,
    Calls,
    CallSpec,
    DeadlinePolicy,
    Fault,
    LoadSpec,
    LoopCosts,
    Model,
    PoolSpec,
    Route,
    Scenario,
    ServiceSpec,
    Step,
    Work,
)

_TIMING_KEYS = ("duration", "drain", "sample", "window")
_MODEL_KEYS = ("services", "load", "faults")

#: Turns a key's path into the path to report (under the variant that set it, if one did).
_Key = Callable[[str], str]


class ScenarioError(ValueError):
    """A scenario is invalid; `key` is the dotted path of the culprit, `line` its line."""

    def __init__(self, message: str, *, key: str = "", source: str = "", line: int | None = None):
        self.key = key
        self.line = line
        self.source = source
        where = source or "scenario"
        if line is not None:
            where += f", line {line}"
        if key:
            where += f", {key}"
        super().__init__(f"{where}: {message}")


# Loading.


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ScenarioError(f"cannot read it: {exc.strerror or exc}", source=str(path)) from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScenarioError(
            f"cannot read it: expected UTF-8 text, got byte 0x{data[exc.start]:02x}"
            f" at offset {exc.start}",
            source=str(path),
        ) from None
    return parse_scenario(text, source=str(path), default_name=path.stem)


def parse_scenario(text: str, *, source: str = "", default_name: str = "scenario") -> Scenario:
    """Validate a scenario given as TOML text."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"not valid TOML: {exc}", source=source) from exc
    return scenario_from_dict(data, source=source, text=text, default_name=default_name)


def scenario_from_dict(
    data: Mapping[str, Any],
    *,
    source: str = "",
    text: str | None = None,
    default_name: str = "scenario",
) -> Scenario:
    """Validate a scenario given as the dictionary a TOML file parses to."""
    try:
        return _scenario(data, default_name)
    except read.Invalid as exc:
        line = Locator(text).line(path_of(exc.key)) if text is not None and exc.key else None
        raise ScenarioError(exc.message, key=exc.key, source=source, line=line) from None


def with_overrides(
    scenario: Scenario, *, duration: float | None = None, drain: float | None = None
) -> Scenario:
    """The same scenario with every variant's load `duration` and/or `drain` replaced."""
    if duration is None and drain is None:
        return scenario
    variants = {}
    for name, model in scenario.variants.items():
        if duration is not None:
            model = replace(model, duration=_positive(duration, "duration"))
        if drain is not None:
            model = replace(model, drain=_non_negative(drain, "drain"))
        variants[name] = model
    return replace(scenario, variants=variants)


def _positive(value: float, name: str) -> float:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a positive number of seconds, got {value}")
    return float(value)


def _non_negative(value: float, name: str) -> float:
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be >= 0 seconds, got {value}")
    return float(value)


# The scenario and its variants.


def _scenario(data: Mapping[str, Any], default_name: str) -> Scenario:
    read.only(data, "", ("name", "description", "seed", *_TIMING_KEYS, *_MODEL_KEYS, "variants"))
    name = read.string(data.get("name", default_name), "name")
    description = read.string(data.get("description", ""), "description", empty=True)
    seed = read.integer(data.get("seed", 1), "seed", low=0)
    raw_variants = read.table(data.get("variants", {}), "variants")
    base = {k: v for k, v in data.items() if k not in ("name", "description", "seed", "variants")}
    variants: dict[str, Model] = {}
    if not raw_variants:
        variants["base"] = _model(base, "")
    for variant, overrides in raw_variants.items():
        prefix = f"variants.{variant}"
        read.name(variant, prefix)
        overrides = read.table(overrides, prefix)
        read.only(overrides, prefix, (*_TIMING_KEYS, *_MODEL_KEYS))
        variants[variant] = _model(_merge(base, overrides), prefix, overrides)
    return Scenario(name=name, variants=variants, description=description, seed=seed)


def _merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` laid on `base`: tables merge key by key; anything else is replaced."""
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _model(
    data: Mapping[str, Any], prefix: str, overrides: Mapping[str, Any] | None = None
) -> Model:
    """One variant's model. Keys are reported under the variant when it set them."""

    def key(path: str) -> str:
        if overrides is not None and _has(overrides, path):
            return f"{prefix}.{path}"
        return path

    duration = read.duration(data.get("duration", 10.0), key("duration"))
    if duration is None or duration <= 0:
        raise read.Invalid(key("duration"), "must be a positive duration")
    drain = read.duration(data.get("drain", 0.0), key("drain")) or 0.0
    sample = read.duration(data.get("sample", max(0.01, duration / 200)), key("sample"))
    window = read.duration(data.get("window", max(0.1, duration / 20)), key("window"))
    if not sample or not window:
        raise read.Invalid(key("sample"), "sample and window must be positive durations")
    services_raw = read.table(data.get("services"), key("services"), required=True)
    services = {name: _service(name, raw, key) for name, raw in services_raw.items()}
    loads = tuple(
        _load(raw, f"load[{i}]", key)
        for i, raw in enumerate(read.array(data.get("load"), key("load"), required=True))
    )
    faults = tuple(
        _fault(raw, f"faults[{i}]", key)
        for i, raw in enumerate(read.array(data.get("faults", []), key("faults")))
    )
    model = Model(
        services=services,
        loads=loads,
        faults=faults,
        duration=duration,
        drain=drain,
        sample=sample,
        window=window,
    )
    _cross_check(model, key)
    return model


def _has(data: Mapping[str, Any], path: str) -> bool:
    node: Any = data
    for part in re.split(r"\.|\[", path):
        part = part.rstrip("]")
        if part.isdigit() and isinstance(node, list):
            index = int(part)
            if index >= len(node):
                return False
            node = node[index]
        elif isinstance(node, Mapping) and part in node:
            node = node[part]
        else:
            return False
    return True


# Services.

_SERVICE_KEYS = (
    "servers",
    "workers",
    "queue_limit",
    "lb",
    "connect_time",
    "routes",
    "pools",
    "calls",
    "deadline",
    "loop",
)


def _service(name: str, raw: Any, key: _Key) -> ServiceSpec:
    path = f"services.{name}"
    read.name(name, key(path))
    raw = read.table(raw, key(path))
    read.only(raw, key(path), _SERVICE_KEYS)
    lb = raw.get("lb", "round_robin")
    if lb not in POLICIES:
        raise read.Invalid(key(f"{path}.lb"), f"must be one of {', '.join(POLICIES)}; got {lb!r}")
    routes_raw = read.table(raw.get("routes"), key(f"{path}.routes"), required=True)
    pools_raw = read.table(raw.get("pools", {}), key(f"{path}.pools"))
    calls_raw = read.table(raw.get("calls", {}), key(f"{path}.calls"))
    deadline = raw.get("deadline", False)
    loop = raw.get("loop")
    return ServiceSpec(
        name=name,
        servers=read.integer(raw.get("servers", 1), key(f"{path}.servers"), low=1, high=10_000),
        workers=read.optional_integer(raw.get("workers"), key(f"{path}.workers")),
        queue_limit=read.optional_integer(
            raw.get("queue_limit"), key(f"{path}.queue_limit"), low=0
        ),
        lb=lb,
        connect_time=read.duration(raw.get("connect_time", 0.0), key(f"{path}.connect_time"))
        or 0.0,
        routes={r: _route(r, v, f"{path}.routes.{r}", key) for r, v in routes_raw.items()},
        pools={p: _pool(p, v, f"{path}.pools.{p}", key) for p, v in pools_raw.items()},
        calls={c: _call(c, v, f"{path}.calls.{c}", key) for c, v in calls_raw.items()},
        deadline=None if deadline is False else _deadline(deadline, f"{path}.deadline", key),
        loop=None if loop is None else _loop(loop, f"{path}.loop", key),
    )


def _route(name: str, raw: Any, path: str, key: _Key) -> Route:
    read.name(name, key(path))
    raw = read.table(raw, key(path))
    read.only(raw, key(path), ("work", "steps", "commit"))
    if ("work" in raw) == ("steps" in raw):
        raise read.Invalid(key(path), "give exactly one of `work` (one step) or `steps` (a list)")
    if "work" in raw:
        steps: tuple[Step, ...] = (Work(read.distribution(raw["work"], key(f"{path}.work"))),)
    else:
        items = raw["steps"]
        if not isinstance(items, list) or not items:
            raise read.Invalid(key(f"{path}.steps"), "must be a non-empty list of steps")
        steps = tuple(_step(item, f"{path}.steps[{i}]", key) for i, item in enumerate(items))
    return Route(name=name, steps=steps, commit=read.boolean(raw.get("commit", False), key(path)))


def _step(raw: Any, path: str, key: _Key) -> Step:
    if not isinstance(raw, Mapping) or len(raw) != 1 or not ({"work", "call"} & set(raw)):
        raise read.Invalid(
            key(path), 'a step is { work = "200ms" } or { call = "name" } or { call = [..] }'
        )
    if "work" in raw:
        return Work(read.distribution(raw["work"], key(path)))
    names = raw["call"]
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise read.Invalid(key(path), "call must name a call, or list calls made in parallel")
    return Calls(tuple(names))


def _pool(name: str, raw: Any, path: str, key: _Key) -> PoolSpec:
    raw = read.table(raw, key(path))
    read.only(raw, key(path), ("size", "wait"))
    return PoolSpec(
        name=name,
        size=read.integer(raw.get("size", 10), key(f"{path}.size"), low=1, high=1_000_000),
        wait=read.duration(raw.get("wait", "none"), key(f"{path}.wait"), allow_none=True),
    )


_CALL_KEYS = (
    "to",
    "pool",
    "pool_wait",
    "connect",
    "timeout",
    "min_useful",
    "propagate",
    "fallback",
    "idempotent",
    "retry",
)


def _call(name: str, raw: Any, path: str, key: _Key) -> CallSpec:
    read.name(name, key(path))
    raw = read.table(raw, key(path))
    read.only(raw, key(path), _CALL_KEYS)
    service, route = read.target(raw.get("to"), key(f"{path}.to"))
    pool = raw.get("pool")
    if pool is not None and not isinstance(pool, str):
        raise read.Invalid(key(f"{path}.pool"), "must name one of the service's pools")

    def limit(field: str) -> float | None:
        return read.duration(raw.get(field, "none"), key(f"{path}.{field}"), allow_none=True)

    retry_raw = raw.get("retry")
    return CallSpec(
        name=name,
        service=service,
        route=route,
        pool=pool,
        pool_wait=limit("pool_wait"),
        connect=limit("connect"),
        timeout=limit("timeout"),
        min_useful=read.duration(raw.get("min_useful", 0.0), key(f"{path}.min_useful")) or 0.0,
        propagate=read.boolean(raw.get("propagate", True), key(f"{path}.propagate")),
        fallback=read.boolean(raw.get("fallback", False), key(f"{path}.fallback")),
        idempotent=read.boolean(raw.get("idempotent", False), key(f"{path}.idempotent")),
        retry=None if retry_raw is None else _retry(retry_raw, key(f"{path}.retry")),
    )


def _retry(raw: Any, path: str) -> Retry:
    raw = read.table(raw, path)
    fields = ("attempts", "backoff", "max_backoff", "multiplier", "jitter", "expected")
    read.only(raw, path, fields)
    args: dict[str, Any] = {}
    for field in fields:
        if field not in raw:
            continue
        value = raw[field]
        if field in ("backoff", "max_backoff", "expected"):
            value = read.duration(value, f"{path}.{field}")
        args[field] = value
    try:
        return Retry(**args)
    except (TypeError, ValueError) as exc:
        raise read.Invalid(path, str(exc)) from None


def _deadline(raw: Any, path: str, key: _Key) -> DeadlinePolicy:
    if raw is True:
        return DeadlinePolicy()
    raw = read.table(raw, key(path))
    flags = ("honor_inbound", "enforce", "shed", "shed_short", "cancel_on_caller_left")
    read.only(raw, key(path), ("default", "max", "reserve", *flags))
    return DeadlinePolicy(
        default=read.duration(raw.get("default", "none"), key(f"{path}.default"), allow_none=True),
        max=read.duration(raw.get("max", "none"), key(f"{path}.max"), allow_none=True),
        reserve=read.duration(raw.get("reserve", 0.0), key(f"{path}.reserve")) or 0.0,
        **{
            flag: read.boolean(raw.get(flag, flag != "shed_short"), key(f"{path}.{flag}"))
            for flag in flags
        },
    )


def _loop(raw: Any, path: str, key: _Key) -> LoopCosts:
    raw = read.table(raw, key(path))
    read.only(raw, key(path), ("arrival", "left", "passes"))
    costs = {}
    for field in ("arrival", "left"):
        cost = read.duration(raw.get(field, 0.0), key(f"{path}.{field}")) or 0.0
        if cost > 1.0:  # a second of CPU per request is a unit mistake, not a service
            raise read.Invalid(key(f"{path}.{field}"), f"must be at most 1s, got {cost:g}s")
        costs[field] = cost
    passes = read.integer(raw.get("passes", 1), key(f"{path}.passes"), low=1, high=100)
    return LoopCosts(arrival=costs["arrival"], left=costs["left"], passes=passes)


# Load and faults.

_LOAD_KEYS = ("name", "to", "rate", "arrival", "start", "count", "timeout", "send_deadline")


def _load(raw: Any, path: str, key: _Key) -> LoadSpec:
    raw = read.table(raw, key(path))
    read.only(raw, key(path), _LOAD_KEYS)
    service, route = read.target(raw.get("to"), key(f"{path}.to"))
    rate = raw.get("rate")
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate <= 1e7:
        raise read.Invalid(key(f"{path}.rate"), f"must be requests per second > 0, got {rate!r}")
    arrival = raw.get("arrival", "uniform")
    if arrival not in ("uniform", "poisson"):
        raise read.Invalid(key(f"{path}.arrival"), f"must be uniform or poisson, got {arrival!r}")
    count = raw.get("count")
    return LoadSpec(
        name=read.string(raw.get("name", route), key(f"{path}.name")),
        service=service,
        route=route,
        rate=float(rate),
        arrival=arrival,
        start=read.duration(raw.get("start", 0.0), key(f"{path}.start")) or 0.0,
        count=None if count is None else read.integer(count, key(f"{path}.count"), low=1),
        timeout=read.duration(raw.get("timeout", "none"), key(f"{path}.timeout"), allow_none=True),
        send_deadline=read.boolean(raw.get("send_deadline", True), key(f"{path}.send_deadline")),
    )


def _fault(raw: Any, path: str, key: _Key) -> Fault:
    raw = read.table(raw, key(path))
    read.only(raw, key(path), ("kind", "service", "at", "until", "server", "route", "factor"))
    kind = raw.get("kind")
    if kind not in ("slow", "hang", "down", "blackhole"):
        raise read.Invalid(
            key(f"{path}.kind"), f"must be slow, hang, down or blackhole; got {kind!r}"
        )
    service = read.string(raw.get("service"), key(f"{path}.service"))
    factor = raw.get("factor", 1.0)
    if kind == "slow" and (
        isinstance(factor, bool) or not isinstance(factor, int | float) or not 0 < factor < 1e6
    ):
        raise read.Invalid(
            key(f"{path}.factor"), f"a slow fault needs a factor > 0, got {factor!r}"
        )
    server = raw.get("server")
    route = raw.get("route")
    if route is not None and (kind != "hang" or not isinstance(route, str)):
        raise read.Invalid(key(f"{path}.route"), "only a hang fault takes a route (a name)")
    return Fault(
        kind=kind,
        service=service,
        at=read.duration(raw.get("at", 0.0), key(f"{path}.at")) or 0.0,
        until=read.duration(raw.get("until", "none"), key(f"{path}.until"), allow_none=True),
        server=None if server is None else read.integer(server, key(f"{path}.server"), low=0),
        route=route,
        factor=float(factor),
    )


def _cross_check(model: Model, key: _Key) -> None:
    """References between parts: targets exist, pools exist, indexes are in range."""
    services = model.services
    for name, service in services.items():
        path = f"services.{name}"
        for call in service.calls.values():
            where = key(f"{path}.calls.{call.name}")
            _check_target(services, call.service, call.route, f"{where}.to")
            if call.pool is not None and call.pool not in service.pools:
                known = ", ".join(service.pools) or "none defined"
                raise read.Invalid(f"{where}.pool", f"no pool {call.pool!r} in {name} ({known})")
        for route in service.routes.values():
            for i, step in enumerate(route.steps):
                if isinstance(step, Calls):
                    for call_name in step.names:
                        if call_name not in service.calls:
                            raise read.Invalid(
                                key(f"{path}.routes.{route.name}.steps[{i}]"),
                                f"no call {call_name!r} in services.{name}.calls"
                                + read.suggest(call_name, service.calls),
                            )
    names = [load.name for load in model.loads]
    for i, load in enumerate(model.loads):
        _check_target(services, load.service, load.route, key(f"load[{i}].to"))
        if names.count(load.name) > 1:
            raise read.Invalid(key(f"load[{i}].name"), f"two loads are named {load.name!r}")
    for i, fault in enumerate(model.faults):
        where = key(f"faults[{i}]")
        if fault.service not in services:
            raise read.Invalid(
                f"{where}.service",
                f"no service {fault.service!r}" + read.suggest(fault.service, services),
            )
        target = services[fault.service]
        if fault.server is not None and fault.server >= target.servers:
            raise read.Invalid(
                f"{where}.server",
                f"{fault.service} has {target.servers} server(s): index 0..{target.servers - 1}",
            )
        if fault.route is not None and fault.route not in target.routes:
            raise read.Invalid(f"{where}.route", f"no route {fault.route!r} in {fault.service}")
        if fault.until is not None and fault.until <= fault.at:
            raise read.Invalid(f"{where}.until", "must be later than `at`")


def _check_target(services: Mapping[str, ServiceSpec], service: str, route: str, key: str) -> None:
    if service not in services:
        raise read.Invalid(key, f"no service {service!r}" + read.suggest(service, services))
    if route not in services[service].routes:
        raise read.Invalid(
            key, f"no route {route!r} in {service}" + read.suggest(route, services[service].routes)
        )
