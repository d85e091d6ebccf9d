"""The timeout planner: choose each call's limits from measured latency and the deadline.

    route = deadlines.plan.load("checkout.toml")   # the call tree, latencies, config
    result = deadlines.plan.plan(route)             # proposed limits and violations
    print(deadlines.plan.table(result))
    print(deadlines.plan.code(result))              # deadlines.Dependency(...) to paste

The rules (`choose_timeout`, `attempts_that_fit`, `fanout_tail`, `connect_timeout`)
follow the reference chapter's Part 5; `docs/plan.md` states each one and why.
From the command line: ``deadlines plan CONFIG.toml``.
"""

from __future__ import annotations

from ._config import Call, Group, Layer, Route, load, parse
from ._errors import PlanError
from ._latency import Latency, histogram_quantile, read_csv, read_prometheus
from ._planner import CallPlan, Finding, GroupPlan, Plan, plan
from ._render import as_json, code, table
from ._rules import attempts_that_fit, choose_timeout, connect_timeout, fanout_tail, round_up

__all__ = [
    "Call",
    "CallPlan",
    "Finding",
    "Group",
    "GroupPlan",
    "Latency",
    "Layer",
    "Plan",
    "PlanError",
    "Route",
    "as_json",
    "attempts_that_fit",
    "choose_timeout",
    "code",
    "connect_timeout",
    "fanout_tail",
    "histogram_quantile",
    "load",
    "parse",
    "plan",
    "read_csv",
    "read_prometheus",
    "round_up",
    "table",
]
