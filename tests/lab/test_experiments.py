"""The experiments' figures have the chapter's shape (one quick run of `deadlines lab`)."""

from __future__ import annotations

import re

import pytest

from deadlines.lab import chain, defaults, slow_server

from .helpers import QuickAll, processes_with

# The shared quick run (about a minute, more on a loaded machine) is set up by the first test.
pytestmark = [pytest.mark.slow, pytest.mark.realtime, pytest.mark.timeout(300)]

ROW_KEYS = {"client", "setup", "server", "outcome", "error", "elapsed_ms", "connection_closed"}
CASCADE_KEYS = {
    "home_in_flight_end",
    "home_in_flight_series",
    "checkout_ok",
    "checkout_failed",
    "checkout_p99_ms",
    "downstream_open_max",
}
CHAIN_KEYS = {
    "a_answered_ms",
    "a_status",
    "b_gave_up_ms",
    "c_budget_ms",
    "c_stopped_ms",
    "c_finished_ms",
    "c_committed",
}


def _row(rows: list[dict], client: str, setup_start: str, server: str) -> dict:
    return next(
        r
        for r in rows
        if r["client"] == client and r["setup"].startswith(setup_start) and r["server"] == server
    )


def test_quick_run_leaves_no_process_behind(quick_all: QuickAll) -> None:
    """After `deadlines lab --quick` exits, none of the processes it started is alive."""
    assert processes_with(quick_all.run.token) == []


def test_defaults_rows_have_the_issue_schema(quick_all: QuickAll) -> None:
    """Every defaults row has exactly the agreed keys, for every client and server."""
    rows = quick_all.data["defaults"]["rows"]
    assert {tuple(sorted(r)) for r in rows} == {tuple(sorted(ROW_KEYS))}
    assert {r["server"] for r in rows} == set(defaults.SERVERS)
    assert {r["client"] for r in rows} == {"httpx", "aiohttp", "requests", "urllib", "deadlines"}


def test_requests_timeout_never_stops_a_trickle_but_a_deadline_does(quick_all: QuickAll) -> None:
    """requests' timeout is per read: a trickle outlives the cap; deadlines stops at its limit."""
    result = quick_all.data["defaults"]
    limit_ms = result["params"]["limit"] * 1000.0
    rows = result["rows"]
    raw = _row(rows, "requests", "requests.get(url, timeout=", "trickle")
    assert raw["outcome"] == defaults.STILL_WAITING
    assert raw["connection_closed"] is False
    lib = _row(rows, "deadlines", "the same, in deadlines.scope", "trickle")
    assert lib["outcome"] == "error"
    assert lib["error"].startswith("deadlines.DeadlineExceeded")
    assert limit_ms - 10 <= lib["elapsed_ms"] <= limit_ms + 1500
    assert lib["connection_closed"] is True


def _by_key(result: dict, key: str, server: str) -> dict:
    words = {s.key: s.words for s in defaults.setups(result["params"]["limit"])}
    return next(r for r in result["rows"] if r["setup"] == words[key] and r["server"] == server)


def test_the_rows_the_chapter_lacked(quick_all: QuickAll) -> None:
    """aiohttp's sock_read never stops a trickle; a pool wait and a read limit add up;
    anyio.fail_after stops httpx at its limit; a thread under wait_for keeps the process
    from exiting."""
    result = quick_all.data["defaults"]
    limit_ms = result["params"]["limit"] * 1000.0
    assert _by_key(result, "sock_read", "trickle")["outcome"] == defaults.STILL_WAITING
    assert _by_key(result, "sock_read", "silent")["outcome"] == "error"
    pooled = _by_key(result, "pool", "silent")
    assert pooled["outcome"] == "error" and pooled["error"].startswith("httpx.ReadTimeout")
    assert pooled["elapsed_ms"] >= limit_ms * 1.5  # 3/4 of a limit in the pool, then a limit
    for server in defaults.SERVERS:
        anyio_row = _by_key(result, "fail_after", server)
        assert anyio_row["outcome"] == "error", server
        assert limit_ms - 10 <= anyio_row["elapsed_ms"] <= limit_ms + 1500, server
    for key in ("to_thread", "run_in_executor"):
        stuck = _by_key(result, key, "silent")
        assert stuck["outcome"] == defaults.NO_EXIT, key
        assert limit_ms - 10 <= stuck["elapsed_ms"] <= limit_ms + 1500, key


def test_every_table_sets_the_chapter_beside_the_measurement(quick_all: QuickAll) -> None:
    """Each table printed has the chapter's rows and a verdict, and fits 100 columns."""
    out = quick_all.run.stdout
    tables = [block for block in out.split("\n\n") if block.strip() and "Chapter: " in block]
    assert len(tables) == 4
    for block in tables:
        assert max(len(line) for line in block.splitlines()) <= 100, block
        verdict = block[block.index("Chapter: ") + 9 :]
        assert verdict.startswith(("agrees: ", "differs: "))
        assert "chapter" in block.split("Chapter: ")[0].lower()
    report = quick_all.report.read_text()
    assert report.count("**Chapter:** ") == 4
    assert "defaults, in detail" in report


def test_executor_timeout_stops_the_waiter_not_the_worker(quick_all: QuickAll) -> None:
    """result(timeout=...) returns at the limit while the request and its socket live on."""
    result = quick_all.data["defaults"]
    limit_ms = result["params"]["limit"] * 1000.0
    row = _row(result["rows"], "requests", "executor.submit", "silent")
    assert row["outcome"] == "waiter stopped, worker still running"
    assert row["connection_closed"] is False
    assert limit_ms - 10 <= row["elapsed_ms"] <= limit_ms + 1500


def test_cascade_timeouts_keep_in_flight_flat_and_no_timeout_grows(quick_all: QuickAll) -> None:
    """timeout and deadlines keep /home flat and /checkout healthy; no_timeout piles up."""
    variants = quick_all.data["cascade"]["variants"]
    assert set(variants) == {"no_timeout", "timeout", "bulkhead", "deadlines"}
    for figures in variants.values():
        assert set(figures) >= CASCADE_KEYS
        for point in figures["home_in_flight_series"]:
            assert len(point) == 2
    for name in ("timeout", "deadlines"):
        v = variants[name]
        assert v["home_in_flight_end"] <= 30, name
        assert v["checkout_failed"] == 0, name
        assert v["checkout_ok"] > 0, name
    grow = variants["no_timeout"]
    assert grow["home_in_flight_end"] > 3 * variants["timeout"]["home_in_flight_end"]
    counts = [n for _, n in grow["home_in_flight_series"]]
    assert counts[-1] > counts[len(counts) // 2] > counts[1]
    assert grow["checkout_failed"] > grow["checkout_ok"]
    assert grow["downstream_open_max"] <= quick_all.data["cascade"]["params"]["pool_size"]
    assert variants["bulkhead"]["checkout_failed"] == 0


def test_load_generator_holds_the_rate_within_two_percent(quick_all: QuickAll) -> None:
    """The open-loop load achieved each requested rate within 2 %, in every run."""
    loads = [v["load"] for v in quick_all.data["cascade"]["variants"].values()]
    loads += [v["load"] for v in quick_all.data["slow-server"]["policies"].values()]
    for load in loads:
        for stream, figures in load.items():
            if isinstance(figures, dict):
                assert abs(figures["error_pct"]) <= 2.0, (stream, figures)


def test_chain_fixed_commits_for_nobody_propagated_stops(quick_all: QuickAll) -> None:
    """fixed: C commits after A answered; propagated: C stops near the deadline, no commit."""
    result = quick_all.data["chain"]
    user_ms = result["params"]["user_wait"] * 1000.0
    fixed, prop = result["variants"]["fixed"], result["variants"]["propagated"]
    assert set(fixed) >= CHAIN_KEYS and set(prop) >= CHAIN_KEYS
    assert fixed["c_committed"] is True
    assert fixed["c_finished_ms"] > fixed["a_answered_ms"] >= user_ms - 50
    assert fixed["c_budget_ms"] is None and fixed["c_stopped_ms"] is None
    assert prop["c_committed"] is False
    assert prop["c_finished_ms"] is None
    assert prop["c_stopped_ms"] <= user_ms + 500
    assert 0 < prop["c_budget_ms"] < user_ms
    assert prop["a_status"] == 504 and prop["a_answered_ms"] <= user_ms + 500


def test_slow_server_round_robin_queues_least_outstanding_does_not(quick_all: QuickAll) -> None:
    """Round robin piles work on the slow backend; least outstanding and deadlines bound it."""
    result = quick_all.data["slow-server"]
    policies = result["policies"]
    assert set(policies) == set(slow_server.POLICIES)
    slow = result["slow_server"]
    rr, lo = policies["round_robin"], policies["least_outstanding"]
    shed = policies["round_robin+deadlines"]
    assert rr["queue_max"][slow] > 3 * max(lo["queue_max"][slow], 1)
    assert rr["p99_ms_after_slowdown"] > 2 * lo["p99_ms_after_slowdown"]
    assert sum(shed["dropped"]) > 0 and sum(rr["dropped"]) == 0
    assert shed["queue_max"][slow] < rr["queue_max"][slow]
    deadline_ms = result["params"]["request_deadline"] * 1000.0
    assert shed["p99_ms_after_slowdown"] <= deadline_ms + 500


def test_all_writes_a_markdown_report_with_pictures(quick_all: QuickAll) -> None:
    """The report has a section, a table and an existing PNG per experiment; its path is printed."""
    text = quick_all.report.read_text()
    assert f"Report: {quick_all.report}" in quick_all.run.stdout
    pictures = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(pictures) == 5
    for picture in pictures:
        png = quick_all.report.parent / picture
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    headings = ("Part 2", "Part 3", "Part 4", "Slow is worse than down", "Beyond the chapter")
    for heading in headings:
        assert f"## {heading}" in text
    assert text.count("| --- |") >= 4
    assert "pending" not in quick_all.data["cascade"] or not quick_all.data["cascade"]["pending"]


def test_chain_quick_uses_the_chapters_numbers() -> None:
    """The quick chain is the chapter's chain: 2 s user, 3 s of work in C."""
    p = chain.quick()
    assert (p.user_wait, p.a_work, p.b_work, p.c_work) == (2.0, 0.2, 0.3, 3.0)
