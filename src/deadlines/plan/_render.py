"""The plan as people read it (a table and findings), as code to paste, and as JSON."""

from __future__ import annotations

import json
import re
from typing import Any

from .._tools.durations import format_seconds as fmt
from ._planner import CallPlan, Finding, GroupPlan, Plan
from ._rules import SYN_RETRANSMIT, connect_timeout


def _percent(value: float, bound: bool, count: int | None = None) -> str:
    if value == 0 and not bound and count:
        return f"< {1 / count:.2%}"  # none of the samples: say how fine the sample is
    text = f"{value:.2%}" if value < 0.1 else f"{value:.0%}"
    return ("≤ " if bound else "") + text


def table(result: Plan) -> str:
    """A text table: the layers, one row per call, then the findings."""
    route = result.route
    lines = [f"{route.name}: deadline {fmt(route.deadline)}, reserve {fmt(route.reserve)}"]
    if route.layers:
        chain = " > ".join(f"{layer.name} {fmt(layer.timeout)}" for layer in route.layers)
        lines.append(f"layers: {chain} > route {fmt(route.deadline)}")
    lines.append("")
    header = (
        "call",
        "kind",
        "p50",
        "p99",
        "p99.9",
        "budget",
        "timeout",
        "connect",
        "attempts",
        "healthy cut",
    )
    rows: list[tuple[str, ...]] = [header]
    for row in result.rows:
        if isinstance(row, GroupPlan):
            indent = "  " * row.depth
            tail = f"tail {row.fanout:.1%}" if row.fanout is not None else ""
            rows.append(
                (
                    f"{indent}[{row.group.mode}] {row.group.name}",
                    "",
                    "",
                    "",
                    "",
                    "",
                    "",
                    "",
                    "",
                    tail,
                )
            )
            continue
        latency = row.call.latency
        rows.append(
            (
                "  " * row.depth + row.call.name,
                "critical" if row.call.critical else "optional",
                fmt(latency.p50),
                fmt(latency.p99),
                "-" if latency.p999 is None else fmt(latency.p999),
                fmt(row.share),
                fmt(row.timeout),
                fmt(row.connect) + ("!" if 0 < row.connect < SYN_RETRANSMIT else ""),
                f"{row.attempts} (fit {row.attempts_fit})",
                _percent(row.cut, row.cut_is_bound, latency.count),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        lines.append(
            "  ".join(cell.ljust(width) for cell, width in zip(r, widths, strict=True)).rstrip()
        )
    lines.append("")
    lines.append("timeouts: " + "; ".join(f"{row.call.name}: {row.reason}" for row in result.calls))
    lines.append("")
    lines.extend(findings(result))
    return "\n".join(lines)


def findings(result: Plan) -> list[str]:
    """One line per finding, violations first, located by file and line."""
    order = {"violation": 0, "warning": 1, "note": 2}
    ordered = sorted(result.findings, key=lambda f: order[f.severity])
    violations = len(result.violations)
    lines = [f"{violations} violation{'s' if violations != 1 else ''}"]
    for finding in ordered:
        lines.append(
            f"  {_location(result, finding)}{finding.severity} [{finding.rule}] {finding.message}"
        )
    return lines


def _location(result: Plan, finding: Finding) -> str:
    if finding.line is None:
        return f"{result.route.file}: "
    return f"{result.route.file}:{finding.line}: "


def _identifier(name: str) -> str:
    text = re.sub(r"[^0-9A-Za-z]+", "_", name).strip("_").upper() or "DEPENDENCY"
    return f"_{text}" if text[0].isdigit() else text


def _seconds(value: float) -> str:
    return repr(round(float(value), 6))


def code(result: Plan) -> str:
    """Ready-to-paste ``deadlines.Dependency(...)`` definitions, one per call."""
    route = result.route
    lines = [
        f"# Planned by `deadlines plan {route.file}` for {route.name}.",
        "import deadlines",
        "",
        f"ROUTE_DEADLINE = {_seconds(route.deadline)}  # deadlines.scope(ROUTE_DEADLINE)",
    ]
    for row in result.calls:
        lines.extend(["", *_dependency_code(row)])
    return "\n".join(lines) + "\n"


def _connect_note(row: CallPlan) -> str:
    rule = connect_timeout(row.call.network)
    where = "in-region" if row.call.network == "region" else "across the internet"
    if row.connect < SYN_RETRANSMIT:
        return "under the 1 s SYN retransmit (held to the total): a lost SYN fails the attempt"
    if row.connect < rule:
        return f"{where} {fmt(rule)}, held to the call's total"
    return f"{where}: survives a lost SYN"


def _dependency_code(row: CallPlan) -> list[str]:
    dep = row.dependency
    latency = row.call.latency
    lines = [
        f"{_identifier(dep.name)} = deadlines.Dependency(",
        f"    {json.dumps(dep.name)},",
        f"    connect={_seconds(dep.connect)},  # {_connect_note(row)}",
        f"    headers={_seconds(dep.headers)},",
        f"    total={_seconds(dep.total)},  # {row.reason}",
        f"    min_useful={_seconds(dep.min_useful)},  # p50: with less left, fail fast",
    ]
    if dep.retry is None:
        why = "optional: use the fallback" if not row.call.critical else "no room for a retry"
        lines.append(f"    retry=None,  # {why}")
    else:
        lines.append(
            f"    retry=deadlines.Retry(attempts={dep.retry.attempts},"
            f" backoff={_seconds(dep.retry.backoff)}, expected={_seconds(latency.p99)}),"
            f"  # {row.attempts_fit} fit in {fmt(row.share)}"
        )
    lines.append(")")
    return lines


def as_json(result: Plan) -> str:
    """The plan as JSON: route, calls, groups, findings and the code."""
    calls: list[dict[str, Any]] = []
    groups: list[dict[str, Any]] = []
    for row in result.rows:
        if isinstance(row, GroupPlan):
            groups.append(
                {
                    "name": row.group.name,
                    "mode": row.group.mode,
                    "calls": len(row.group.items),
                    "fanout_tail": row.fanout,
                }
            )
            continue
        latency = row.call.latency
        calls.append(
            {
                "name": row.call.name,
                "where": row.call.where,
                "line": row.call.line,
                "critical": row.call.critical,
                "p50": latency.p50,
                "p99": latency.p99,
                "p999": latency.p999,
                "latency_source": latency.source,
                "share": row.share,
                "target": row.target,
                "timeout": row.timeout,
                "reason": row.reason,
                "connect": row.connect,
                "attempts": row.attempts,
                "attempts_fit": row.attempts_fit,
                "healthy_cut": row.cut,
                "healthy_cut_is_bound": row.cut_is_bound,
            }
        )
    route = result.route
    document = {
        "route": {
            "name": route.name,
            "file": route.file,
            "deadline": route.deadline,
            "reserve": route.reserve,
        },
        "layers": [{"name": layer.name, "timeout": layer.timeout} for layer in route.layers],
        "calls": calls,
        "groups": groups,
        "findings": [
            {
                "severity": f.severity,
                "rule": f.rule,
                "where": f.where,
                "line": f.line,
                "message": f.message,
            }
            for f in result.findings
        ],
        "code": code(result),
    }
    return json.dumps(document, indent=2, ensure_ascii=False)
