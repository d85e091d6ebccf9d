"""`deadlines lab slow-server --sim`: the same flags drive the simulated twin (no processes)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from deadlines.__main__ import main
from deadlines.lab import slow_server
from deadlines.lab.load import LoadRun, Shot
from deadlines.sim import lab_slow_server


def _lab(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(["lab", *args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_sim_prints_the_simulated_table_and_writes_json_and_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--sim --quick prints the lab's table marked simulated; --json and --plot are written."""
    out_json, out_png = tmp_path / "ss.json", tmp_path / "ss.png"
    args = ["slow-server", "--sim", "--quick", "--quiet", "--json", str(out_json)]
    code, out, _ = _lab([*args, "--plot", str(out_png)], capsys)
    assert code == 0
    assert out.startswith("slow-server (simulated): 3 backends, 90 req/s")
    assert "Simulated by deadlines.sim" in " ".join(out.split())  # notes wrap at 100
    for policy in slow_server.POLICIES:
        assert f"\n{policy} " in out
    data = json.loads(out_json.read_text())
    assert data["simulated"] is True
    quick = dataclasses.asdict(slow_server.quick())
    assert data["params"].items() >= {**quick, "policies": list(quick["policies"])}.items()
    assert list(data["policies"]) == list(slow_server.POLICIES)
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sim_is_driven_by_the_experiments_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--servers, --rate, --run-for and --policies reach the simulation."""
    out_json = tmp_path / "ss.json"
    code, out, _ = _lab(
        ["slow-server", "--sim", "--quiet", "--servers", "4", "--rate", "60", "--run-for", "2",
         "--slow-factor", "10", "--policies", "least_outstanding+deadlines",
         "--json", str(out_json)],
        capsys,
    )  # fmt: skip
    assert code == 0
    assert "4 backends, 60 req/s; backend 1 becomes 10× slower" in out
    data = json.loads(out_json.read_text())
    assert list(data["policies"]) == ["least_outstanding+deadlines"]
    figures = data["policies"]["least_outstanding+deadlines"]
    assert len(figures["queue_series"]) == len(figures["served"]) == 4
    assert figures["ok"] + figures["failed"] == 120 == figures["load"]["req"]["sent"]


@pytest.mark.parametrize("experiment", ["cascade", "chain", "defaults", "all"])
def test_sim_is_refused_where_there_is_no_twin(
    experiment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--sim on another experiment exits 2 with a message, before starting anything."""
    code, out, err = _lab([experiment, "--sim", "--quiet"], capsys)
    assert code == 2
    assert "--sim is for slow-server only" in err
    assert out == ""


def test_twin_takes_exactly_the_labs_params_with_the_same_defaults() -> None:
    """Every field of the lab's slow-server Params is a keyword of the twin, same default."""
    twin = inspect.signature(lab_slow_server).parameters
    for f in dataclasses.fields(slow_server.Params):
        assert f.name in twin, f.name
        assert twin[f.name].kind is inspect.Parameter.KEYWORD_ONLY
        assert twin[f.name].default == getattr(slow_server.Params(), f.name), f.name


def test_twin_answers_in_the_labs_summary_shape() -> None:
    """A policy's figures have the keys (and the load's nested keys) the lab's summary has."""
    p = slow_server.Params(run_for=1.0, rate=10.0, slow_at=0.5)
    shots = [
        Shot("req", i, i / 10, started=i / 10, ended=i / 10 + 0.02, status=200) for i in range(10)
    ]
    run = LoadRun({"req": p.rate}, p.run_for, shots)
    queues: list[list[list[float]]] = [[[0.0, 0.0]] for _ in range(p.servers)]
    final = [{"served": 3, "wasted": 0, "dropped": 0}] * p.servers
    lab = slow_server._summarise(p, run, {i: i % 3 for i in range(10)}, queues, final)
    sim = lab_slow_server(run_for=1.0, rate=10.0, slow_at=0.5)
    assert sim.keys() >= {"params", "slow_server", "policies"}
    for figures in sim["policies"].values():
        assert figures.keys() == lab.keys()
        assert figures["load"].keys() == lab["load"].keys()
        assert figures["load"]["req"].keys() == lab["load"]["req"].keys()
        assert len(figures["latency_series"]) == len(lab["latency_series"]) == 2
        assert sum(figures["served"]) == 10
    assert slow_server.tables(sim)[0].title.startswith("slow-server (simulated)")


def test_twin_counts_work_for_nobody_as_served_like_the_lab() -> None:
    """`served` counts every completed request, `wasted` (client gone) included, as the lab's."""
    rr = lab_slow_server(**dataclasses.asdict(slow_server.quick()))["policies"]["round_robin"]
    assert rr["wasted"][1] > 0
    assert sum(rr["served"]) - sum(rr["wasted"]) == rr["ok"]


def test_sim_needs_none_of_the_labs_libraries() -> None:
    """The twin starts no process: it runs with aiohttp (the real experiment's) refused."""
    code = (
        "import sys; sys.modules['aiohttp'] = None\n"
        "from deadlines.__main__ import main\n"
        "sys.exit(main(['lab', 'slow-server', '--sim', '--quick', '--quiet']))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "slow-server (simulated)" in done.stdout
