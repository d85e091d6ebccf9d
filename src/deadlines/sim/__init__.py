"""`deadlines.sim`: a discrete-event model of clients, load balancers, servers and pools.

The lab measures real processes for minutes; the simulator answers the same questions
for hours of traffic and for topologies the lab cannot start. A scenario (TOML) names
services, their routes and calls, the load and the faults; each variant changes a few
knobs (a timeout, a pool, a deadline, a load-balancing policy) and runs with the same
seed, so variants differ only by those knobs.

    from deadlines.sim import run_scenario, slow_server_scenario

    result = run_scenario("examples/sim/cascade.toml", seed=1)
    result.variants["no_timeout"].loads["checkout"].ok     # 4
    print(result.table())
    result.write_json("cascade.json")                      # keys match `deadlines lab`

    twin = run_scenario(slow_server_scenario(servers=5, duration=30), seed=7)
    figures = lab_slow_server(servers=3, rate=90)   # the lab's slow-server JSON shape

Only the standard library is needed; `Result.plot` needs matplotlib.
"""

from __future__ import annotations

from .model import (
    Calls,
    CallSpec,
    DeadlinePolicy,
    Distribution,
    Fault,
    LoadSpec,
    LoopCosts,
    Model,
    PoolSpec,
    Route,
    Scenario,
    ServiceSpec,
    Work,
)
from .result import (
    CallSummary,
    LoadSummary,
    Result,
    RouteSummary,
    Series,
    ServerSummary,
    ServiceSummary,
    TraceSummary,
    VariantResult,
)
from .run import run_scenario
from .scenario import (
    ScenarioError,
    load_scenario,
    parse_scenario,
    scenario_from_dict,
    with_overrides,
)
from .slow_server import lab_slow_server, slow_server_scenario

__all__ = [
    "CallSpec",
    "CallSummary",
    "Calls",
    "DeadlinePolicy",
    "Distribution",
    "Fault",
    "LoadSpec",
    "LoadSummary",
    "LoopCosts",
    "Model",
    "PoolSpec",
    "Result",
    "Route",
    "RouteSummary",
    "Scenario",
    "ScenarioError",
    "Series",
    "ServerSummary",
    "ServiceSpec",
    "ServiceSummary",
    "TraceSummary",
    "VariantResult",
    "Work",
    "lab_slow_server",
    "load_scenario",
    "parse_scenario",
    "run_scenario",
    "scenario_from_dict",
    "slow_server_scenario",
    "with_overrides",
]
