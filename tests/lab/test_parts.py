"""The lab's parts: process harness, open-loop load, the small HTTP server, balancer, report."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time

import pytest

from deadlines.lab import report
from deadlines.lab._http import HttpServer, Request, Response
from deadlines.lab.harness import AppFailed, Processes
from deadlines.lab.load import run_open_loop, schedule
from deadlines.lab.slow_server import Balancer
from testservers import Postgres

from .helpers import TOKEN_VAR, processes_with, run_lab


def test_processes_are_stopped_even_when_the_block_fails() -> None:
    """An error inside `with Processes()` still terminates and reaps every child."""
    procs = Processes()
    with pytest.raises(RuntimeError, match="boom"), procs:
        child = procs.start("cascade.downstream")
        assert child.port > 0 and child.process.poll() is None
        raise RuntimeError("boom")
    assert child.process.poll() is not None
    assert procs.children == []


def test_an_app_that_cannot_start_is_reported_with_its_stderr() -> None:
    """A child that exits before announcing readiness raises AppFailed with what it said."""
    with Processes() as procs, pytest.raises(AppFailed, match="--variant"):
        procs.start("cascade.api")  # --variant is required


def test_a_child_exits_when_the_lab_process_dies(tmp_path) -> None:
    """Killing the lab outright (no cleanup) still ends its servers: they watch their parent."""
    script = (
        "import sys, time\n"
        "from deadlines.lab.harness import Processes\n"
        "p = Processes()\n"
        "c = p.start('cascade.downstream')\n"
        "print(c.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    parent.kill()
    parent.wait(5)
    parent.stdout.close()
    end = time.monotonic() + 5
    while time.monotonic() < end:
        try:
            with open(f"/proc/{child_pid}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break
        except FileNotFoundError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"child {child_pid} outlived its parent")


@pytest.mark.anyio
async def test_open_loop_holds_the_requested_rate() -> None:
    """Starts leave on schedule whatever the handler does: achieved rate within 2 %."""

    async def fire(kind: str, index: int) -> tuple[int | None, str | None]:
        await asyncio.sleep(0.05 if kind == "a" else 0.2)  # slow answers do not slow the load
        return 200, None

    run = await run_open_loop({"a": 100.0, "b": 20.0}, 1.0, fire, drain=1.0)
    assert len(run.of("a")) == 100 and len(run.of("b")) == 20
    for kind, rate in (("a", 100.0), ("b", 20.0)):
        assert abs(run.achieved_rate(kind) - rate) / rate <= 0.02
    assert all(s.ok for s in run.shots)
    assert run.rate_report()["a"]["sent"] == 100


@pytest.mark.anyio
async def test_open_loop_cancels_what_is_still_waiting_after_the_drain() -> None:
    """Requests unanswered after the drain are cancelled and keep no end time."""

    async def fire(kind: str, index: int) -> tuple[int | None, str | None]:
        await asyncio.sleep(10 if kind == "hang" else 0)
        return 200, None

    start = time.monotonic()
    run = await run_open_loop({"hang": 10.0, "ok": 10.0}, 0.5, fire, drain=5.0, wait_for=("ok",))
    assert time.monotonic() - start < 3.0
    assert all(s.ended is None for s in run.of("hang"))
    assert all(s.ok for s in run.of("ok"))


def test_schedule() -> None:
    """Evenly spaced starts per stream."""
    plan = schedule({"x": 4.0}, 1.0)
    assert [t for t, _, _ in plan] == [0.0, 0.25, 0.5, 0.75]
    with pytest.raises(ValueError, match="rate"):
        schedule({"x": -1.0}, 1.0)


@pytest.mark.anyio
async def test_http_server_counts_connections_and_cancels_on_close() -> None:
    """The lab's server counts open connections and cancels a handler whose client left."""
    cancelled = asyncio.Event()

    async def handle(request: Request) -> Response:
        if request.path == "/hang":
            try:
                await asyncio.Event().wait()
            finally:
                cancelled.set()
        return Response.json({"path": request.path})

    server = HttpServer(handle)
    port = await server.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /ok HTTP/1.1\r\nhost: x\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        writer.write(b"GET /hang HTTP/1.1\r\nhost: x\r\n\r\n")
        await writer.drain()
        await asyncio.sleep(0.1)
        assert server.counters.open == 1 and server.counters.in_progress == 1
        writer.close()
        await asyncio.wait_for(cancelled.wait(), 2.0)
        await asyncio.sleep(0.05)
        assert server.counters.open == 0 and server.counters.max_open == 1
    finally:
        await server.close()


def test_least_outstanding_routes_around_a_busy_backend() -> None:
    """Round robin rotates blindly; least outstanding picks the emptiest backend."""
    rr = Balancer(["a", "b", "c"], "round_robin")
    assert [rr.pick() for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    lo = Balancer(["a", "b", "c"], "least_outstanding+deadlines")
    lo.outstanding = [0, 9, 0]
    assert {lo.pick() for _ in range(10)} == {0, 2}


def test_table_renders_text_and_markdown() -> None:
    """Tables align in text and escape pipes in Markdown."""
    table = report.Table("t", ["a", "bb"], [["1", "x|y"]], note="n")
    assert table.text().splitlines()[1].startswith("a  bb")
    assert "x\\|y" in table.markdown()
    two_lines = report.Table("run: C = 10/s\nrun: timeouts", ["a"]).markdown()
    assert two_lines.startswith("**run: C = 10/s**  \n**run: timeouts**\n")  # each line bold
    assert report.ms(2004.4) == "2,004 ms" and report.ms(None) == "-"


@pytest.mark.realtime
def test_defaults_alone_writes_rows_json_and_png(tmp_path) -> None:
    """`deadlines lab defaults --json --plot` writes the list of rows and a PNG."""
    out, png = tmp_path / "d.json", tmp_path / "d.png"
    run = run_lab(
        ["defaults", "--quiet", "--cap", "1.5", "--limit", "0.5", "--interval", "0.2",
         "--json", str(out), "--plot", str(png)],
        timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    rows = json.loads(out.read_text())
    from deadlines.lab import defaults

    assert isinstance(rows, list) and len(rows) == sum(len(s.servers) for s in defaults.setups(0.5))
    assert png.read_bytes()[:4] == b"\x89PNG"
    table = run.stdout.split("\n\n")[0].splitlines()
    assert max(len(line) for line in table) <= 100
    rows = table[3 : table.index("the chapter (Node 22):")]
    [requests_row] = [line for line in rows if line.startswith("requests timeout=0.5")]
    assert "on time" in requests_row and "never" in requests_row  # silent; trickle
    assert processes_with(run.token) == []


def test_sigterm_stops_the_lab_and_every_server_it_started() -> None:
    """SIGTERM in the middle of an experiment: exit 130 soon, no server left behind."""
    import os
    import uuid

    token = uuid.uuid4().hex
    proc = subprocess.Popen(
        [sys.executable, "-m", "deadlines", "lab", "cascade", "--quick", "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=dict(os.environ, **{TOKEN_VAR: token}),
        text=True,
    )
    end = time.monotonic() + 30
    while len(processes_with(token)) < 3 and time.monotonic() < end:  # lab + 2 servers
        time.sleep(0.1)
    assert len(processes_with(token)) >= 3
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=15)
    assert proc.returncode == 130, err[-2000:]
    # A server forked in the instant the signal arrived is not yet tracked by the lab;
    # it sees its parent gone and exits by itself within half a second.
    end = time.monotonic() + 3
    while processes_with(token) and time.monotonic() < end:
        time.sleep(0.05)
    assert processes_with(token) == []


def test_bad_flags_are_refused_with_the_flag_named() -> None:
    """A negative rate or an unknown variant stops the lab before it starts anything."""
    run = run_lab(["cascade", "--home-rate", "-3"], timeout=30)
    assert run.returncode != 0 and "--home-rate must be a positive number" in run.stderr
    run = run_lab(["slow-server", "--policies", "random"], timeout=30)
    assert run.returncode != 0 and "--policies must name some of" in run.stderr
    run = run_lab(["defaults", "--cap", "1", "--limit", "2"], timeout=30)
    assert run.returncode != 0 and "must be shorter than --cap" in run.stderr


@pytest.mark.postgres
@pytest.mark.realtime
def test_chain_commits_into_postgres_with_dsn(pg_server: Postgres) -> None:
    """With --dsn the fixed chain's commit lands in Postgres; the propagated one does not."""
    import psycopg

    from deadlines.lab import chain

    dsn = pg_server.url()
    try:
        fixed = chain.run_variant(chain.Params(dsn=dsn), "fixed")
        assert fixed["c_committed"] is True
        propagated = chain.run_variant(chain.Params(dsn=dsn), "propagated")
        assert propagated["c_committed"] is False and propagated["c_stopped_ms"] is not None
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP TABLE IF EXISTS deadlines_lab_chain")


def test_a_variant_whose_modules_are_missing_is_pending_not_faked(monkeypatch) -> None:
    """Without the library's integrations the deadlines variant is reported pending, no figures."""
    from deadlines.lab import cascade
    from deadlines.lab.cascade import _deadlines as cascade_deadlines
    from deadlines.lab.progress import Progress

    monkeypatch.setattr(cascade_deadlines, "missing", lambda: "waiting for deadlines.aiohttp")
    result = cascade.run(cascade.Params(variants=("deadlines",)), Progress(quiet=True))
    assert result["variants"] == {}
    assert result["pending"] == {"deadlines": "waiting for deadlines.aiohttp"}
    rows = cascade.tables(result)[0].rows
    assert rows[0][1] == "pending"


def test_flags_reach_the_experiment_they_belong_to() -> None:
    """Flags override the chapter's defaults; --variants splits across cascade and chain."""
    from deadlines.__main__ import build_parser
    from deadlines.lab import cli

    words = ["lab", "--variants", "fixed,timeout", "--pool-size", "7"]
    args = build_parser("lab").parse_args(words)
    assert args.experiment == "all"
    assert cli.params_for("chain", args).variants == ("fixed",)
    cascade = cli.params_for("cascade", args)
    assert cascade.variants == ("timeout",) and cascade.pool_size == 7
    quick = build_parser("lab").parse_args(["lab", "slow-server", "--quick", "--rate", "40"])
    params = cli.params_for("slow-server", quick)
    assert params.rate == 40 and params.run_for == 3.0


def test_marks_set_each_outcome_beside_its_limit() -> None:
    """on time within 50 ms of the limit it passed, +late otherwise, its time before any."""
    from deadlines.lab.defaults import STILL_WAITING, Setup, cell, mark

    assert mark(2.02, (2.0,)) == "on time"
    assert mark(2.53, (2.0,)) == "+0.53 s"
    assert mark(10.02, (2.0, 10.0, 30.0)) == "on time"
    assert mark(3.51, (2.0,)) == "+1.51 s"
    assert mark(0.40, (2.0,)) == "0.40 s"
    setup = Setup("x", "k", "w", "w", "2 s/read", (2.0,))
    waiting = {"outcome": STILL_WAITING, "elapsed_ms": 15000.0, "connection_closed": False}
    assert cell(waiting, setup, 15.0) == "never"
    long = Setup("x", "k", "w", "w", "2/10/30 s", (2.0, 10.0, 30.0), total=30.0)
    assert cell(waiting, long, 15.0) == "> cap"  # its total would end it, after the cap
    left_open = {"outcome": "error", "elapsed_ms": 2010.0, "connection_closed": False}
    assert cell(left_open, setup, 15.0) == "on time*"


def test_chain_verdict_explains_the_propagated_difference() -> None:
    """The chapter's fixed figures agree; the propagated chain's earlier stop is explained."""
    from deadlines.lab import chain

    params = {"user_wait": 2.0, "a_work": 0.2, "b_work": 0.3, "c_work": 3.0, "ab_timeout": 1.8,
              "bc_timeout": 2.0, "reserve": 0.05}  # fmt: skip
    fixed = {"a_answered_ms": 2006.0, "a_status": 504, "b_gave_up_ms": 2509.0,
             "c_budget_ms": None, "c_stopped_ms": None, "c_finished_ms": 3518.0,
             "c_committed": True, "c_stop_reason": None}  # fmt: skip
    propagated = {"a_answered_ms": 1858.0, "a_status": 504, "b_gave_up_ms": 1856.0,
                  "c_budget_ms": 1395, "c_stopped_ms": 1853.0, "c_finished_ms": None,
                  "c_committed": False, "c_stop_reason": "deadline"}  # fmt: skip
    text = chain.verdict({"params": params, "variants": {"fixed": fixed}})
    assert text.startswith("agrees: fixed: 2,006 / 2,509 / 3,518 ms") and "within 8 ms" in text
    text = chain.verdict({"params": params, "variants": {"propagated": propagated}})
    assert text.startswith("differs: propagated: the same shape")
    assert "113 ms earlier" in text and "C is told 1,395 ms" in text
    assert "is 1,850 ms" in text  # 2,000 ms less three 50 ms reserves
    table = chain.tables({"params": params, "variants": {"fixed": fixed, "propagated": propagated}})
    rows = [row[0].strip() for row in table[0].rows]
    assert rows == ["fixed timeouts", "the chapter (Node)", "propagated (deadlines)",
                    "the chapter (Node)"]  # fmt: skip
    assert max(len(line) for line in table[0].text().splitlines()) <= 100


def test_an_experiment_does_not_import_its_processes() -> None:
    """Importing an experiment leaves its processes' modules to `python -m` (one copy each)."""
    code = (
        "import sys, importlib\n"
        "for name in ('cascade', 'chain', 'defaults', 'slow_server'):\n"
        "    importlib.import_module(f'deadlines.lab.{name}')\n"
        "lab = [m for m in sys.modules if m.startswith('deadlines.lab.')]\n"
        "print(sorted(m for m in lab if m.count('.') == 3))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
