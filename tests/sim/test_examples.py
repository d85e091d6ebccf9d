"""The shipped examples run (shortened) from the command line, with JSON and a PNG."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from deadlines.__main__ import main
from deadlines.sim import lab_slow_server, load_scenario, run_scenario, slow_server_scenario
from deadlines.sim.slow_server import LAB_POLICIES

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples" / "sim").glob("*.toml"))


def test_every_example_is_found() -> None:
    """The three chapter scenarios ship as examples."""
    assert {p.stem for p in EXAMPLES} >= {"cascade", "chain", "slow-server"}


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs_shortened_from_the_cli(
    path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`deadlines sim EXAMPLE --duration 2s` prints a table and writes valid JSON (and a PNG)."""
    out_json, out_png = tmp_path / "r.json", tmp_path / "r.png"
    plot = path.stem == "chain"  # matplotlib is slow to draw: one example is proof enough
    args = ["sim", str(path), "--duration", "2s", "--drain", "1s", "--json", str(out_json)]
    code = main(args + (["--plot", str(out_png)] if plot else []))
    assert code == 0
    printed = capsys.readouterr().out
    data = json.loads(out_json.read_text())
    scenario = load_scenario(path)
    assert set(data["variants"]) == set(scenario.variants)
    for name, variant in data["variants"].items():
        assert f"== {name}:" in printed
        assert variant["duration_s"] == 2.0
        assert sum(load["requests"] for load in variant["loads"].values()) >= 1
    if plot:
        assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_reports_a_bad_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A broken scenario exits 2 with the file, line and key on stderr, and no traceback."""
    bad = tmp_path / "bad.toml"
    bad.write_text('[services.s.routes.r]\nwork = "5 ms"\n\n[[load]]\nto = "s/r"\nrate = "x"\n')
    assert main(["sim", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"{bad}, line 6, load[0].rate: must be requests per second" in err


def test_cli_runs_one_variant_with_a_seed(capsys: pytest.CaptureFixture[str]) -> None:
    """--variant picks variants; --seed is reported."""
    path = next(p for p in EXAMPLES if p.stem == "slow-server")
    code = main(["sim", str(path), "--variant", "p2c", "--seed", "9", "--duration", "1s"])
    assert code == 0
    out = capsys.readouterr().out
    assert "seed 9" in out and "== p2c:" in out and "round_robin" not in out


def test_sim_imports_no_third_party_module() -> None:
    """The simulator needs only the standard library (matplotlib only for a PNG)."""
    code = (
        "import sys; import deadlines.sim, deadlines.sim.cli; "
        "bad = [m for m in ('simpy', 'matplotlib', 'httpx') if m in sys.modules]; "
        "print(bad)"
    )
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_slow_server_builder_is_the_example() -> None:
    """`slow_server_scenario()` builds exactly examples/sim/slow-server.toml."""
    path = next(p for p in EXAMPLES if p.stem == "slow-server")
    assert slow_server_scenario() == load_scenario(path)


def test_slow_server_twin_figures() -> None:
    """The lab's twin: round robin's p99 and slow-server queue explode; shedding bounds them."""
    scenario = slow_server_scenario(servers=4, rate=400, duration=10, timeout=1.0)
    result = run_scenario(scenario, seed=2)
    data = result.to_dict()
    assert data["scenario"] == "slow-server" and data["seed"] == 2
    rr, rr_dl = result.variants["round_robin"], result.variants["round_robin_deadlines"]
    lo = result.variants["least_outstanding"]
    slow_queue = [sample[1] for sample in rr.series.queue["backend"]]
    assert max(slow_queue) > 200  # server 1's queue grows without end
    assert max(s.queue_max for i, s in enumerate(rr.services["backend"].servers) if i != 1) < 20
    assert rr.loads["clients"].p99_ms == 1000.0  # clients time out
    assert lo.loads["clients"].failed == 0
    assert lo.loads["clients"].p99_ms is not None and lo.loads["clients"].p99_ms < 300
    # Deadlines drop expired work: the slow server's queue holds about one budget of
    # arrivals (100/s x 1 s), not everything since the slowdown.
    assert rr_dl.services["backend"].servers[1].queue_max < 150
    assert rr_dl.loads["clients"].failed < rr.loads["clients"].failed
    latency = data["variants"]["p2c"]["series"]["latency"]["clients"]
    assert len(latency["t_s"]) == len(latency["p99_ms"]) > 10


LAB_SLOW_SERVER_KEYS = {
    "latency_series",
    "queue_series",
    "ok",
    "failed",
    "p50_ms_after_slowdown",
    "p99_ms_after_slowdown",
    "ok_pct_after_slowdown",
    "share_sent_to_slow_pct",
    "queue_max",
    "served",
    "wasted",
    "dropped",
    "load",
}


def test_lab_slow_server_twin_has_the_labs_shape_and_story() -> None:
    """`lab_slow_server` answers in the lab's JSON shape, and tells the chapter's story."""
    data = lab_slow_server(run_for=5.0, policies=(*LAB_POLICIES, "p2c+deadlines"))
    json.dumps(data, allow_nan=False)
    assert data["slow_server"] == 1 and data["simulated"] is True
    policies = data["policies"]
    assert list(policies) == [*LAB_POLICIES, "p2c+deadlines"]
    for figures in policies.values():
        assert figures.keys() == LAB_SLOW_SERVER_KEYS
        assert len(figures["latency_series"]) == 10  # 5 s in 0.5 s windows
        assert len(figures["queue_series"]) == 3  # one per backend
        assert figures["ok"] + figures["failed"] == 450
    rr, lo = policies["round_robin"], policies["least_outstanding"]
    rr_dl = policies["round_robin+deadlines"]
    assert rr["share_sent_to_slow_pct"] == pytest.approx(33.3, abs=0.1)
    assert rr["queue_max"][1] > 50 and rr["wasted"][1] > 0  # work done for nobody
    assert rr["p99_ms_after_slowdown"] == 3000.0  # the client timeout
    assert lo["failed"] == 0 and lo["share_sent_to_slow_pct"] < 20
    assert rr_dl["wasted"] == [0, 0, 0] and rr_dl["dropped"][1] > 0
    assert rr_dl["p99_ms_after_slowdown"] == 1000.0  # the deadline, not the timeout
    with pytest.raises(ValueError, match="unknown policy"):
        lab_slow_server(policies=("random",))


def test_public_names_are_exported() -> None:
    """`deadlines.sim.__all__` is sorted and names exactly what the package exports."""
    import deadlines.sim as sim

    assert sim.__all__ == sorted(sim.__all__)
    for name in sim.__all__:
        assert getattr(sim, name) is not None
