"""Fuzzing the config loaders: any input is accepted or refused with their own error.

`deadlines plan` and `deadlines sim` turn a loader's error into one line and exit 2;
any other exception would be a traceback. Inputs: random bytes, soups of plausible
lines, and documents built from each loader's own keys with hostile values (NaN, 1e300,
negative, wrong types, unknown units). What a loader accepts must then plan or
simulate without an exception either.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from deadlines.plan import PlanError, as_json, code, load, parse, plan, table
from deadlines.sim import ScenarioError, load_scenario, run_scenario, scenario_from_dict
from deadlines.sim.run import RunTooLong

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FUZZ = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)


@pytest.fixture(scope="module")
def samples() -> Iterator[Path]:
    """A folder with the example sample files a plan may name (csv, prometheus)."""
    folder = Path(tempfile.mkdtemp(prefix="deadlines-fuzz-"))
    for name in ("recs-latency.csv", "orders-db.prom"):
        shutil.copy(EXAMPLES / "plan" / name, folder / name)
    yield folder
    shutil.rmtree(folder)


def toml_value(value: Any) -> str:
    """A value in TOML (inline tables and arrays), for the documents built here."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        # JSON's escapes are TOML's, but for the pairs that spell characters past U+FFFF.
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    inner = ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items())
    return "{" + inner + "}"


def toml_document(data: dict[str, Any]) -> str:
    """Top-level `key = value` lines."""
    return "".join(f"{json.dumps(k)} = {toml_value(v)}\n" for k, v in data.items())


#: Valid durations in seconds, from a microsecond to a year.
SECONDS = st.one_of(st.floats(min_value=1e-6, max_value=3e7), st.integers(1, 3 * 10**7))
#: Valid durations, with and without units.
DURATIONS = st.one_of(
    st.sampled_from(["40ms", "180ms", "310ms", "2s", "1.5 s", "300us", "1m", "2 min", ".5s"]),
    SECONDS,
)
#: What a mutation puts in place of any value: wrong types, units, signs and sizes.
HOSTILE = st.one_of(
    st.sampled_from(["2h", "-1s", "none", "forever", "1e3ms", "0", "0s", "", "a/b/c", "parallel"]),
    st.floats(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.text(st.characters(exclude_categories=("Cs",)), max_size=6),  # TOML has no surrogates
    st.booleans(),
    st.lists(st.integers(), max_size=2),
    st.just({}),
)


def _maybe(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional=fields)


def _places(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a document a value sits (keys of tables, items of arrays)."""
    children = value.items() if isinstance(value, dict) else enumerate(value)
    for key, child in children:
        yield (*path, key)
        if isinstance(child, dict | list):
            yield from _places(child, (*path, key))


@st.composite
def mutated(draw: st.DrawFn, documents: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    """A valid document, half the time with one or two values replaced or keys added."""
    document = copy.deepcopy(draw(documents))
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
        *parent_path, key = draw(st.sampled_from(sorted(_places(document), key=repr)))
        parent = document
        for part in parent_path:
            parent = parent[part]
        if isinstance(parent, dict) and draw(st.booleans()):
            key = draw(st.sampled_from(["timeout", "extra", "calls", "deadline", "rate"]))
        parent[key] = draw(HOSTILE)
    return document


QUANTILES = st.lists(SECONDS, min_size=3, max_size=3)
LATENCY = st.one_of(
    QUANTILES.map(sorted).map(lambda q: {"p50": q[0], "p99": q[1], "p999": q[2]}),
    QUANTILES.map(sorted).map(lambda q: {"p50": q[0], "p99": q[1]}),
    st.builds(lambda unit: {"csv": "recs-latency.csv", **unit}, _maybe(unit=st.just("ms"))),
    st.just(
        {
            "prometheus": "orders-db.prom",
            "metric": "db_statement_duration_seconds",
            "labels": {"statement": "insert_order"},
        }
    ),
)
MODES = st.sampled_from(["sequential", "parallel"])
CALL = st.builds(
    lambda name, latency, rest: {"name": name, "latency": latency, **rest},
    st.sampled_from(["pricing", "recs", "db"]),
    LATENCY,
    _maybe(
        critical=st.booleans(),
        timeout=DURATIONS,
        connect=DURATIONS,
        attempts=st.integers(1, 100),
        max=DURATIONS,
        network=st.sampled_from(["region", "internet"]),
        deadline=DURATIONS,
        backoff=DURATIONS,
    ),
)
CALLS = st.recursive(
    CALL,
    lambda inner: st.builds(
        lambda group, calls: {**group, "calls": calls},
        st.one_of(CALL, st.builds(lambda m: {"name": "group", "mode": m}, MODES)),
        st.lists(inner, min_size=1, max_size=3),
    ),
    max_leaves=6,
)
PLAN_DOCUMENT = mutated(
    st.builds(
        lambda route, layers: {"route": route, **layers},
        st.builds(
            lambda deadline, calls, rest: {
                "name": "GET /x",
                "deadline": deadline,
                "calls": calls,
                **rest,
            },
            DURATIONS,
            st.lists(CALLS, min_size=1, max_size=4),
            _maybe(reserve=st.just("10ms"), mode=MODES, network=st.just("internet")),
        ),
        _maybe(layers=st.lists(st.builds(lambda t: {"name": "edge", "timeout": t}, DURATIONS))),
    )
)

PLAN_LINES = [
    "[route]",
    'name = "GET /x"',
    'deadline = "2s"',
    "deadline = 2000",
    "[[layers]]",
    'timeout = "10s"',
    "[[route.calls]]",
    'name = "pricing"',
    'latency = { p50 = "40ms", p99 = "180ms", p999 = "310ms" }',
    'latency = { csv = "recs-latency.csv" }',
    'mode = "parallel"',
    "[[route.calls.calls]]",
    "[route.calls.latency]",
    '"p99.9" = "1s"',
    'x = """',
    "]]",
]


def _soup(lines: list[str]) -> st.SearchStrategy[str]:
    line = st.one_of(st.sampled_from(lines), st.text(max_size=12))
    return st.lists(line, max_size=14).map("\n".join)


def _plan_all_of(text: str, base: Path) -> None:
    try:
        route = parse(text, file="fuzz.toml", base=base)
    except PlanError:
        event("refused")
        return
    event("planned")
    result = plan(route)
    table(result)
    code(result)
    as_json(result)


@FUZZ
@given(data=st.binary(max_size=300))
def test_plan_files_of_any_bytes(data: bytes, samples: Path) -> None:
    """Any bytes in a plan file: a plan, or a PlanError naming the file."""
    path = samples / "fuzz.toml"
    path.write_bytes(data)
    try:
        route = load(path)
    except PlanError as exc:
        message = str(exc)
    else:
        plan(route)
        return
    assert message.startswith(str(path))


@FUZZ
@given(text=_soup(PLAN_LINES))
def test_plan_text_soups(text: str, samples: Path) -> None:
    """Lines a plan is made of, in any order, with junk between: planned or a PlanError."""
    _plan_all_of(text, samples)


@FUZZ
@given(document=PLAN_DOCUMENT)
def test_plan_documents_with_hostile_values(document: dict[str, Any], samples: Path) -> None:
    """Valid plans, some with values swapped for NaN, 1e300, wrong types: planned or refused."""
    _plan_all_of(toml_document(document), samples)


WORK = st.one_of(
    DURATIONS,
    st.just("forever"),
    st.builds(lambda mean: {"dist": "exp", "mean": mean}, DURATIONS),
    st.builds(lambda q: {"dist": "uniform", "low": q[0], "high": q[1]}, QUANTILES.map(sorted)),
    st.builds(lambda q: {"dist": "lognormal", "median": q[0], "p99": q[2]}, QUANTILES.map(sorted)),
)
SIM_CALL = st.builds(
    lambda rest: {"to": "db/q", **rest},
    _maybe(
        pool=st.just("p"),
        pool_wait=DURATIONS,
        connect=DURATIONS,
        timeout=DURATIONS,
        min_useful=DURATIONS,
        propagate=st.booleans(),
        fallback=st.booleans(),
        idempotent=st.booleans(),
        retry=_maybe(
            attempts=st.integers(1, 4), backoff=DURATIONS, jitter=st.booleans(), expected=DURATIONS
        ),
    ),
)
SERVER_KNOBS = _maybe(
    servers=st.integers(1, 4),
    workers=st.one_of(st.integers(1, 8), st.just("unbounded")),
    queue_limit=st.integers(0, 50),
    lb=st.sampled_from(["round_robin", "least_outstanding", "p2c"]),
    connect_time=DURATIONS,
    deadline=st.one_of(
        st.just(True),
        _maybe(
            default=DURATIONS,
            max=DURATIONS,
            reserve=st.just("5ms"),
            shed=st.booleans(),
            shed_short=st.booleans(),
        ),
    ),
)
API = st.builds(
    lambda knobs, steps, a, b, pool: {
        **knobs,
        "routes": {"home": {"steps": steps}},
        "calls": {"a": a, "b": b},
        "pools": {"p": pool},
    },
    SERVER_KNOBS,
    st.lists(
        st.one_of(
            st.builds(lambda c: {"call": c}, st.sampled_from(["a", ["a", "b"]])),
            st.builds(lambda w: {"work": w}, WORK),
        ),
        min_size=1,
        max_size=3,
    ),
    SIM_CALL,
    SIM_CALL,
    _maybe(size=st.integers(1, 30), wait=DURATIONS),
)
DB = st.builds(
    lambda knobs, work, commit: {**knobs, "routes": {"q": {"work": work, **commit}}},
    SERVER_KNOBS,
    WORK,
    _maybe(commit=st.booleans()),
)
LOAD = st.builds(
    lambda name, rate, rest: {"name": name, "to": "api/home", "rate": rate, **rest},
    st.sampled_from(["clients", "more"]),
    st.one_of(st.sampled_from([1, 10, 100, 1000]), st.floats(1e-3, 1e7)),
    _maybe(
        arrival=st.sampled_from(["uniform", "poisson"]),
        start=DURATIONS,
        count=st.integers(1, 100),
        timeout=DURATIONS,
        send_deadline=st.booleans(),
    ),
)
FAULT = st.builds(
    lambda kind, rest: {"kind": kind, "service": "db", **rest},
    st.sampled_from(["slow", "hang", "down", "blackhole"]),
    _maybe(
        at=st.floats(0, 1),
        server=st.just(0),
        factor=st.floats(0.1, 10),
    ),
)
SCENARIO = mutated(
    st.builds(
        lambda api, db, loads, rest: {"services": {"api": api, "db": db}, "load": loads, **rest},
        API,
        DB,
        st.lists(LOAD, min_size=1, max_size=2, unique_by=lambda load: load["name"]),
        _maybe(
            seed=st.integers(0, 100),
            duration=DURATIONS,
            drain=DURATIONS,
            sample=DURATIONS,
            window=DURATIONS,
            faults=st.lists(FAULT, max_size=2),
            variants=st.dictionaries(
                st.sampled_from(["v1", "v2"]),
                _maybe(duration=DURATIONS, services=st.just({"api": {"lb": "p2c"}})),
                max_size=2,
            ),
        ),
    )
)

SIM_LINES = [
    'duration = "1s"',
    "[services.api.routes.home]",
    'work = "10ms"',
    'steps = [{ call = ["a"] }]',
    "[services.api.calls.a]",
    'to = "db/q"',
    "[services.db.routes.q]",
    "[[load]]",
    'to = "api/home"',
    "rate = 50",
    "[[faults]]",
    'kind = "hang"',
    'service = "db"',
    "[variants.fast]",
]


def _simulate_small(scenario: Any) -> None:
    """Run what the loader accepted, shortened, unless even that is estimated too long."""
    try:
        run_scenario(scenario, duration=0.2, drain=0.5, max_seconds=0.5)
    except RunTooLong:
        event("loaded, too long to run here")
        return
    event("loaded and run")


@FUZZ
@given(data=st.binary(max_size=300))
def test_scenario_files_of_any_bytes(data: bytes, samples: Path) -> None:
    """Any bytes in a scenario file: a Scenario, or a ScenarioError naming the file."""
    path = samples / "fuzz-scenario.toml"
    path.write_bytes(data)
    try:
        load_scenario(path)
    except ScenarioError as exc:
        message = str(exc)
    else:
        return
    assert message.startswith(str(path))


@FUZZ
@given(text=_soup(SIM_LINES))
def test_scenario_text_soups(text: str, samples: Path) -> None:
    """Lines a scenario is made of, in any order, with junk: loaded and run, or refused."""
    path = samples / "soup.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        scenario = load_scenario(path)
    except ScenarioError:
        event("refused")
        return
    _simulate_small(scenario)


@FUZZ
@given(data=SCENARIO)
def test_scenarios_with_hostile_values(data: dict[str, Any]) -> None:
    """The simulator's own keys with hostile values: loaded and run, or a ScenarioError."""
    try:
        scenario = scenario_from_dict(data, source="fuzz")
    except ScenarioError:
        event("refused")
        return
    _simulate_small(scenario)
