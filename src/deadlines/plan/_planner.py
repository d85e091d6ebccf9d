"""Walk a route's call tree, propose each call's limits, and list every violation.

The rules are in `_rules`. Checks, each a `Finding`:

* ``inner-shorter`` — every inner limit is shorter than the one around it: browser >
  edge > route deadline > each call's timeout > the callee's own deadline;
* ``retries-fit`` — the configured attempts, each running to its timeout with backoff
  between, fit in the time the call has; and the route's worst case fits its deadline;
* ``above-p99`` — a timeout at or below the callee's p99 fails healthy calls;
* ``connect-syn`` (warning) — a configured connect timeout under 1 s allows no SYN
  retransmission.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Literal

from .._dependency import Dependency, Retry
from .._tools.durations import format_seconds as fmt
from . import _rules
from ._config import Call, Group, Route

Severity = Literal["violation", "warning", "note"]


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing the planner found: a broken rule (violation), a risk, or a remark."""

    severity: Severity
    rule: str
    where: str
    line: int | None
    message: str


@dataclass(frozen=True, slots=True)
class CallPlan:
    """The limits proposed for one call, and the numbers behind them (seconds)."""

    call: Call
    depth: int
    share: float  # the time this call may take: its budget minus its siblings' p99
    target: float  # what the latency alone calls for
    reason: str
    timeout: float  # target, capped by the share and the call's `max`
    connect: float
    attempts: int  # proposed: what is wanted, as far as it fits
    attempts_fit: int
    cut: float  # share of healthy calls slower than `timeout`
    cut_is_bound: bool
    dependency: Dependency


@dataclass(frozen=True, slots=True)
class GroupPlan:
    """A group of calls, with its fan-out tail when they run in parallel."""

    group: Group
    depth: int
    fanout: float | None  # share of requests slowed by any member past its p99


@dataclass(slots=True)
class Plan:
    """Everything `plan()` works out for a route."""

    route: Route
    rows: list[CallPlan | GroupPlan] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)

    @property
    def calls(self) -> list[CallPlan]:
        """The planned calls, in the order of the tree."""
        return [row for row in self.rows if isinstance(row, CallPlan)]

    @property
    def violations(self) -> list[Finding]:
        """The findings that break a rule."""
        return [f for f in self.findings if f.severity == "violation"]

    def call(self, name: str) -> CallPlan:
        """The planned call named `name`."""
        for row in self.calls:
            if row.call.name == name:
                return row
        raise KeyError(name)


def _typical(item: Call | Group) -> float:
    """Time a call or group takes on a bad but normal request: its p99."""
    if isinstance(item, Call):
        return item.latency.p99
    values = [_typical(child) for child in item.items]
    return sum(values) if item.mode == "sequential" else max(values)


def plan(route: Route) -> Plan:
    """Propose limits for every call of `route` and check the configured ones."""
    result = Plan(route)
    _check_layers(route, result)
    budget = route.deadline - route.reserve
    worst = _group(
        result, route.body, budget, depth=0, outer=("route deadline", route.deadline), show=False
    )
    # With one call the per-call check already says it; the route-level one adds up many.
    if worst is not None and worst > budget + 1e-9 and len(route.body.items) > 1:
        result.findings.append(
            Finding(
                "violation",
                "retries-fit",
                route.body.where,
                route.line,
                f"if every attempt runs to its configured timeout the route takes {fmt(worst)},"
                f" more than its {fmt(budget)} budget: a per-call timeout bounds one attempt,"
                " not the request",
            )
        )
    return result


def _check_layers(route: Route, result: Plan) -> None:
    chain = [(layer.name, layer.timeout, layer.line) for layer in route.layers]
    chain.append(("route deadline", route.deadline, route.line))
    for (outer, outer_t, _), (inner, inner_t, line) in itertools.pairwise(chain):
        if inner_t >= outer_t:
            result.findings.append(
                Finding(
                    "violation",
                    "inner-shorter",
                    inner,
                    line,
                    f"{inner} ({fmt(inner_t)}) is not shorter than {outer} ({fmt(outer_t)}):"
                    f" the outer layer gives up first and the inner error reaches nobody",
                )
            )


def _group(
    result: Plan,
    group: Group,
    budget: float,
    *,
    depth: int,
    outer: tuple[str, float],
    show: bool = True,
) -> float | None:
    """Plan a group; returns its configured worst case, or None if nothing is configured.

    With `show`, the group gets a row at `depth` and its members go one level deeper.
    """
    fanout = None
    if group.mode == "parallel" and len(group.items) > 1:
        fanout = _rules.fanout_tail(len(group.items))
    if show:
        result.rows.append(GroupPlan(group, depth, fanout))
    child_depth = depth + 1 if show else depth
    worsts: list[float] = []
    configured = False
    typical = [_typical(item) for item in group.items]
    for index, item in enumerate(group.items):
        others = sum(typical) - typical[index] if group.mode == "sequential" else 0.0
        share = max(0.0, budget - others)
        if isinstance(item, Call):
            worst, has_config = _call(result, item, share, depth=child_depth, outer=outer)
        else:
            sub = _group(result, item, share, depth=child_depth, outer=outer)
            worst, has_config = (sub or 0.0), sub is not None
        configured = configured or has_config
        worsts.append(worst)
    if fanout is not None:
        result.findings.append(
            Finding(
                "note",
                "fan-out",
                group.where,
                group.line,
                f"{group.name}: {len(group.items)} calls in parallel, each slower than its p99"
                f" 1% of the time: 1 - 0.99^{len(group.items)} = {fanout:.1%} of requests wait"
                " on at least one slow call",
            )
        )
    if not configured:
        return None
    return sum(worsts) if group.mode == "sequential" else max(worsts)


def _call(
    result: Plan, call: Call, share: float, *, depth: int, outer: tuple[str, float]
) -> tuple[float, bool]:
    """Plan one call; returns (worst case with configured values, whether any was given)."""
    latency = call.latency
    target, reason = _rules.choose_timeout(latency, critical=call.critical)
    cap = min(share, call.max if call.max is not None else math.inf)
    timeout = min(target, math.floor(cap * 1000 + 1e-6) / 1000)
    retry = Retry(backoff=call.backoff, jitter=False)
    fit = _rules.attempts_that_fit(timeout, share, retry) if timeout > 0 else 0
    wanted = call.attempts if call.attempts is not None else (3 if call.critical else 1)
    attempts = max(1, min(wanted, fit))
    connect = min(_rules.connect_timeout(call.network), timeout) if timeout > 0 else 0.0
    cut, bound = latency.fraction_over(timeout)
    _findings_for(result, call, share, target, timeout, outer)
    if 0 < connect < _rules.SYN_RETRANSMIT and call.connect is None:
        result.findings.append(_short_connect(call, connect, attempts))
    dependency = _dependency(call, timeout, connect, attempts)
    result.rows.append(
        CallPlan(
            call=call,
            depth=depth,
            share=share,
            target=target,
            reason=reason,
            timeout=timeout,
            connect=connect,
            attempts=attempts,
            attempts_fit=fit,
            cut=cut,
            cut_is_bound=bound,
            dependency=dependency,
        )
    )
    if call.calls is not None:
        inner_budget = min(call.timeout or timeout, call.deadline or math.inf)
        _group(
            result,
            call.calls,
            inner_budget,
            depth=depth + 1,
            outer=(call.name, call.timeout or timeout),
            show=False,
        )
    has_config = call.timeout is not None or call.attempts is not None
    used_timeout = call.timeout if call.timeout is not None else timeout
    # Retries not stated are not assumed: the configured view counts one attempt.
    used_attempts = call.attempts if call.attempts is not None else (1 if has_config else attempts)
    return _rules.worst_case(used_timeout, used_attempts, retry), has_config


def _dependency(call: Call, timeout: float, connect: float, attempts: int) -> Dependency:
    retry = None
    if attempts > 1:
        retry = Retry(attempts=attempts, backoff=call.backoff, expected=round(call.latency.p99, 3))
    safe = max(timeout, 0.001)
    return Dependency(
        call.name,
        connect=max(connect, 0.001),
        headers=safe,
        total=safe,
        min_useful=min(round(call.latency.p50, 3), safe),
        retry=retry,
    )


def _short_connect(call: Call, connect: float, attempts: int) -> Finding:
    """The proposed connect limit is under the first SYN retransmit: say what that costs."""
    if attempts > 1:
        recovery = f"{attempts} attempts fit, so a retry reconnects"
    elif not call.critical:
        recovery = "the fallback covers it"
    else:
        recovery = "no retry fits: a longer deadline, or a retry, would cover it"
    return Finding(
        "warning",
        "connect-syn",
        call.where,
        call.line,
        f"{call.name}: proposed connect {fmt(connect)} (held to the call's timeout) is under"
        f" the kernel's first SYN retransmit ({fmt(_rules.SYN_RETRANSMIT)}): one lost SYN"
        f" fails the attempt; {recovery}",
    )


def _findings_for(
    result: Plan,
    call: Call,
    share: float,
    target: float,
    timeout: float,
    outer: tuple[str, float],
) -> None:
    add = result.findings.append
    p99 = call.latency.p99
    where, line, name = call.where, call.line, call.name
    outer_name, outer_limit = outer
    for note in call.latency.notes:
        add(Finding("note", "latency", where, line, f"{name}: {note}"))
    if timeout < target:
        add(
            Finding(
                "note",
                "capped",
                where,
                line,
                f"{name}: the latency calls for {fmt(target)}, capped at {fmt(timeout)}"
                f" by the time the call has ({fmt(share)}) or its max",
            )
        )
    if timeout <= p99:
        add(
            Finding(
                "violation",
                "above-p99",
                where,
                line,
                f"{name}: only {fmt(timeout)} is left for this call, at or below its p99"
                f" ({fmt(p99)}): it fails healthy calls; give the route more time or move"
                " the call off the critical path",
            )
        )
    if call.timeout is not None:
        configured = call.timeout
        if configured <= p99:
            add(
                Finding(
                    "violation",
                    "above-p99",
                    where,
                    line,
                    f"{name}: configured timeout {fmt(configured)} is at or below p99"
                    f" ({fmt(p99)}): it fails at least 1% of healthy calls; proposed"
                    f" {fmt(timeout)}",
                )
            )
        if configured >= outer_limit:
            add(
                Finding(
                    "violation",
                    "inner-shorter",
                    where,
                    line,
                    f"{name}: configured timeout {fmt(configured)} is not shorter than the"
                    f" {outer_name} ({fmt(outer_limit)}): the outer limit fires first",
                )
            )
    if call.deadline is not None and call.deadline >= (call.timeout or timeout):
        add(
            Finding(
                "violation",
                "inner-shorter",
                where,
                line,
                f"{name}: the callee's own deadline ({fmt(call.deadline)}) is not shorter than"
                f" its caller's timeout ({fmt(call.timeout or timeout)}): it keeps working after"
                " the caller gave up",
            )
        )
    if call.attempts is not None and call.attempts > 1:
        used = call.timeout if call.timeout is not None else timeout
        retry = Retry(backoff=call.backoff, jitter=False)
        fit = _rules.attempts_that_fit(used, share, retry)
        if call.attempts > fit:
            add(
                Finding(
                    "violation",
                    "retries-fit",
                    where,
                    line,
                    f"{name}: {call.attempts} attempts x {fmt(used)} plus backoff take"
                    f" {fmt(_rules.worst_case(used, call.attempts, retry))}, more than the"
                    f" {fmt(share)} this call has: "
                    + (f"at most {fit} fit" if fit else "not even one fits"),
                )
            )
    if call.connect is not None and call.connect < _rules.SYN_RETRANSMIT:
        add(
            Finding(
                "warning",
                "connect-syn",
                where,
                line,
                f"{name}: connect timeout {fmt(call.connect)} is under 1 s: one lost SYN"
                " (retransmitted after ~1 s on Linux) fails the attempt",
            )
        )
