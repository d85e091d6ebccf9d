"""The engine's rules, each on a small scenario: pools, timeouts, retries, balancing, faults."""

from __future__ import annotations

from typing import Any

import pytest

from deadlines.sim import VariantResult, run_scenario


def one(
    services: dict[str, Any],
    load: dict[str, Any] | list[dict[str, Any]],
    *,
    seed: int = 1,
    **top: Any,
) -> VariantResult:
    """Run a one-variant scenario and return its figures."""
    scenario = {
        "name": "t",
        "duration": 1.0,
        "drain": 2.0,
        **top,
        "services": services,
        "load": load if isinstance(load, list) else [load],
    }
    return run_scenario(scenario, seed=seed).variants["base"]


def test_same_seed_same_figures_other_seed_other_figures() -> None:
    """A run is deterministic for its seed, and the seed matters."""
    services = {"s": {"workers": 2, "routes": {"r": {"work": {"dist": "exp", "mean": "10ms"}}}}}
    load = {"to": "s/r", "rate": 150, "arrival": "poisson"}
    first = one(services, load, seed=3).to_dict()
    again = one(services, load, seed=3).to_dict()
    other = one(services, load, seed=4).to_dict()
    for data in (first, again, other):
        data.pop("wall_s")
    assert first == again
    assert first != other


def test_workers_queue_fifo_and_queue_limit_rejects() -> None:
    """One worker, 100 ms work, 4 requests at once: FIFO waits; a full queue rejects at once."""
    services = {
        "s": {"workers": 1, "queue_limit": 2, "routes": {"r": {"work": "100ms"}}},
    }
    load = {"to": "s/r", "rate": 1000, "count": 4}
    v = one(services, load)
    clients = v.loads["r"]
    assert clients.ok == 3
    assert clients.causes == {"rejected": 1}
    route = v.services["s"].routes["r"]
    # Waits of 0, ~99 and ~198 ms (arrivals 1 ms apart) average ~99 ms.
    assert route.queue_wait_mean_ms == pytest.approx(99.0, abs=1.0)
    assert v.services["s"].servers[0].queue_max == 2


def _pooled(pool: dict[str, Any], call: dict[str, Any]) -> dict[str, Any]:
    return {
        "api": {
            "routes": {"r": {"steps": [{"call": "db"}]}},
            "pools": {"p": pool},
            "calls": {"db": {"to": "db/q", "pool": "p", **call}},
        },
        "db": {"routes": {"q": {"work": "100ms"}}},
    }


def test_pool_wait_cap_fails_before_sending_and_is_reported_apart() -> None:
    """A pool of 1 with a 150 ms wait cap: the third caller gives up in the pool."""
    v = one(_pooled({"size": 1, "wait": "150ms"}, {}), {"to": "api/r", "rate": 1000, "count": 3})
    assert v.loads["r"].ok == 2
    assert v.loads["r"].causes == {"pool_timeout": 1}
    db = v.calls["api"]["db"]
    assert db.causes == {"pool_timeout": 1}
    assert db.pool_wait_max_ms == pytest.approx(99.0, abs=1.0)  # the second one's wait
    assert v.services["db"].requests == 2  # the failed call never reached the server


def test_timeout_covers_the_pool_wait() -> None:
    """The call's total limit counts time in the pool: 120 ms total fails the one that queued."""
    v = one(_pooled({"size": 1}, {"timeout": "120ms"}), {"to": "api/r", "rate": 1000, "count": 2})
    assert v.loads["r"].ok == 1
    assert v.loads["r"].causes == {"timeout": 1}
    assert v.loads["r"].max_ms == pytest.approx(120.0)


def test_retry_after_pool_timeout_then_succeeds() -> None:
    """A pool failure is safe to retry (nothing was sent): the retry gets a connection."""
    call = {"pool_wait": "60ms", "retry": {"attempts": 3, "backoff": "50ms", "jitter": False}}
    v = one(_pooled({"size": 1}, call), {"to": "api/r", "rate": 1000, "count": 2})
    assert v.loads["r"].ok == 2
    db = v.calls["api"]["db"]
    assert db.retries == 1 and db.attempts == 3  # 60 ms wait + 50 ms sleep, then granted


def test_no_retry_after_send_unless_idempotent() -> None:
    """A timeout after sending has an unknown outcome: retried only for idempotent calls."""
    retry = {"attempts": 3, "backoff": "10ms", "jitter": False}
    services: dict[str, Any] = {
        "api": {
            "routes": {"r": {"steps": [{"call": "slow"}]}},
            "calls": {"slow": {"to": "db/q", "timeout": "50ms", "retry": retry}},
        },
        "db": {"routes": {"q": {"work": "100ms"}}},
    }
    once = one(services, {"to": "api/r", "rate": 10, "count": 1})
    assert once.calls["api"]["slow"].attempts == 1
    services["api"]["calls"]["slow"]["idempotent"] = True
    thrice = one(services, {"to": "api/r", "rate": 10, "count": 1})
    assert thrice.calls["api"]["slow"].attempts == 3
    assert thrice.loads["r"].max_ms == pytest.approx(3 * 50 + 10 + 20, abs=0.5)
    assert thrice.services["db"].in_flight_max == 2  # an abandoned attempt works on


def test_retries_stop_when_the_deadline_cannot_cover_them() -> None:
    """With 120 ms of budget and 50 ms attempts, no third attempt is started."""
    retry = {"attempts": 5, "backoff": "10ms", "jitter": False}
    services = {
        "api": {
            "deadline": True,
            "routes": {"r": {"steps": [{"call": "slow"}]}},
            "calls": {"slow": {"to": "db/q", "timeout": "50ms", "retry": retry,
                               "idempotent": True}},
        },
        "db": {"routes": {"q": {"work": "100ms"}}},
    }  # fmt: skip
    v = one(services, {"to": "api/r", "rate": 10, "count": 1, "timeout": "120ms"})
    assert v.calls["api"]["slow"].attempts == 2
    assert v.loads["r"].causes == {"timeout": 1}


def test_fallback_turns_a_failed_call_into_success() -> None:
    """A call with a fallback fails, yet the handler goes on and succeeds."""
    services = {
        "api": {
            "routes": {"r": {"steps": [{"call": "opt"}, {"work": "1ms"}]}},
            "calls": {"opt": {"to": "db/q", "timeout": "10ms", "fallback": True}},
        },
        "db": {"routes": {"q": {"work": "forever"}}},
    }
    v = one(services, {"to": "api/r", "rate": 10, "count": 3})
    assert v.loads["r"].ok == 3
    assert v.calls["api"]["opt"].fallbacks == 3
    assert v.loads["r"].p50_ms == pytest.approx(11.0)


def test_min_useful_fails_fast_without_sending() -> None:
    """Below min_useful of budget left, the call is not made (BudgetExhausted)."""
    services = {
        "api": {
            "deadline": True,
            "routes": {"r": {"steps": [{"work": "80ms"}, {"call": "db"}]}},
            "calls": {"db": {"to": "db/q", "min_useful": "30ms"}},
        },
        "db": {"routes": {"q": {"work": "5ms"}}},
    }
    v = one(services, {"to": "api/r", "rate": 10, "count": 1, "timeout": "100ms"})
    assert v.loads["r"].causes == {"budget_exhausted": 1}
    assert v.services["db"].requests == 0
    assert v.loads["r"].max_ms == pytest.approx(80.0)


def test_deadline_sheds_expired_queued_work() -> None:
    """With deadlines, a queued request whose budget ran out is dropped, not worked on."""
    services = {
        "s": {"workers": 1, "deadline": {"enforce": False, "cancel_on_caller_left": False},
              "routes": {"r": {"work": "100ms"}}},
    }  # fmt: skip
    v = one(services, {"to": "s/r", "rate": 1000, "count": 3, "timeout": "150ms"})
    route = v.services["s"].routes["r"]
    assert route.ok == 2  # the first, and the second (started at 100 ms, before expiry)
    assert route.causes == {"shed": 1}  # the third expired at ~152 ms, while queued
    assert v.loads["r"].causes == {"client_timeout": 2}


def test_caller_left_stops_work_only_where_noticed() -> None:
    """When the client gives up, a server with deadlines stops; one without works on."""
    base = {"s": {"routes": {"r": {"work": "1s"}}}}
    load = {"to": "s/r", "rate": 10, "count": 1, "timeout": "200ms", "send_deadline": False}
    ignored = one(base, load)
    assert ignored.services["s"].routes["r"].ok == 1  # finished at 1 s, for nobody
    noticed = one({"s": {**base["s"], "deadline": True}}, load)
    assert noticed.services["s"].routes["r"].causes == {"caller_left": 1}


def _farm(lb: str, slow_factor: float = 5.0) -> VariantResult:
    services = {
        "s": {"servers": 4, "workers": 1, "lb": lb,
              "routes": {"r": {"work": {"dist": "exp", "mean": "10ms"}}}},
    }  # fmt: skip
    faults = [{"kind": "slow", "service": "s", "server": 2, "at": 0, "factor": slow_factor}]
    load = {"to": "s/r", "rate": 150, "arrival": "poisson"}
    return one(services, load, duration=20.0, faults=faults)


def test_round_robin_shares_evenly_even_with_a_slow_server() -> None:
    """Round robin sends each server the same share, slow or not."""
    servers = _farm("round_robin").services["s"].servers
    counts = [s.requests for s in servers]
    assert max(counts) - min(counts) <= 1


@pytest.mark.parametrize("lb", ["least_outstanding", "p2c"])
def test_load_aware_policies_avoid_the_slow_server(lb: str) -> None:
    """Least outstanding and power of two choices send the slow server less, cutting p99."""
    aware = _farm(lb)
    counts = [s.requests for s in aware.services["s"].servers]
    assert counts[2] < 0.6 * min(c for i, c in enumerate(counts) if i != 2)
    blind = _farm("round_robin")
    assert aware.loads["r"].p99_ms is not None and blind.loads["r"].p99_ms is not None
    assert aware.loads["r"].p99_ms < blind.loads["r"].p99_ms / 2


def test_down_is_routed_around_and_blackhole_needs_a_connect_limit() -> None:
    """A down server is skipped by the balancer; a blackholed one fails only by connect cap."""
    services = {
        "api": {
            "routes": {"r": {"steps": [{"call": "db"}]}},
            "calls": {"db": {"to": "db/q", "connect": "50ms"}},
        },
        "db": {"servers": 2, "routes": {"q": {"work": "5ms"}}},
    }
    load = {"to": "api/r", "rate": 100, "count": 10}
    down = one(services, load, faults=[{"kind": "down", "service": "db", "server": 0}])
    assert down.loads["r"].ok == 10
    assert [s.requests for s in down.services["db"].servers] == [0, 10]
    hole = one(services, load, faults=[{"kind": "blackhole", "service": "db", "server": 0}])
    assert hole.loads["r"].causes == {"connect_timeout": 5}
    assert hole.loads["r"].ok == 5


def test_fault_window_ends() -> None:
    """A hang with `until` affects only work started inside the window."""
    services = {"s": {"routes": {"r": {"work": "10ms"}}}}
    faults = [{"kind": "hang", "service": "s", "at": 0.2, "until": 0.5}]
    v = one(services, {"to": "s/r", "rate": 10}, faults=faults)
    assert v.loads["r"].ok == 7  # t = 0.2, 0.3, 0.4 hang
    assert v.loads["r"].unfinished == 3


def test_shed_short_drops_work_the_budget_cannot_cover() -> None:
    """With `shed_short`, a request is dropped when less time is left than its work needs."""
    services = {
        "s": {"workers": 1, "deadline": {"shed_short": True}, "routes": {"r": {"work": "100ms"}}},
    }
    v = one(services, {"to": "s/r", "rate": 1000, "count": 3, "timeout": "250ms"})
    server = v.services["s"].servers[0]
    # Starts at 0, ~100 and ~200 ms; the third would have ~52 ms left for 100 ms of work.
    assert (server.served, server.dropped, server.wasted) == (2, 1, 0)
    assert v.services["s"].routes["r"].causes == {"shed": 1}


def test_progress_reports_the_run_without_changing_it() -> None:
    """With a progress callback the figures are the same; `done` rises to 1 over variants."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples/sim/cascade.toml"
    seen: list[tuple[str, float]] = []
    watched = run_scenario(path, duration=2.0, progress=lambda v, done: seen.append((v, done)))
    plain = run_scenario(path, duration=2.0)
    figures = [watched.to_dict(), plain.to_dict()]
    for data in figures:
        for variant in data["variants"].values():
            variant.pop("wall_s")
    assert figures[0] == figures[1]
    dones = [done for _, done in seen]
    assert dones == sorted(dones) and dones[-1] == pytest.approx(1.0)
    assert [v for v, _ in seen][:: len(seen) // len(plain.variants)] == list(plain.variants)


def test_a_run_estimated_over_the_limit_is_refused_before_it_starts() -> None:
    """`max_seconds` refuses a run of 10 M requests/s for an hour at once, saying how long."""
    import time

    from deadlines.sim.run import RunTooLong

    scenario = {
        "duration": "60m",
        "services": {"s": {"routes": {"r": {"work": "1ms"}}}},
        "load": [{"to": "s/r", "rate": 1e7}],
    }
    started = time.monotonic()
    with pytest.raises(RunTooLong, match=r"about 3\.6e\+10 requests, about 10 days") as info:
        run_scenario(scenario, max_seconds=3600)
    assert time.monotonic() - started < 1.0
    assert info.value.requests == pytest.approx(3.6e10)


def test_loop_server_reads_requests_between_jobs_and_pays_each_arrival() -> None:
    """A loop server: 10 ms to read each request, then its 100 ms of CPU work, in turn."""
    services = {
        "s": {"workers": 1, "loop": {"arrival": "10ms"}, "routes": {"r": {"work": "100ms"}}},
    }
    v = one(services, {"to": "s/r", "rate": 1000, "count": 3})
    # Read at 10, 20, 30 ms (the core reads all three before the first job can begin at
    # 30 ms); jobs 30-130, 130-230, 230-330 ms; sent at 0, 1 and 2 ms.
    assert v.loads["r"].p50_ms == pytest.approx(229.0)
    assert v.loads["r"].p99_ms == pytest.approx(328.0, abs=0.1)
    plain = one({"s": {"workers": 1, "routes": {"r": {"work": "100ms"}}}}, {"to": "s/r",
                "rate": 1000, "count": 3})  # fmt: skip
    assert plain.loads["r"].p50_ms == pytest.approx(199.0)


def test_loop_server_starts_a_deadline_when_it_reads_the_request() -> None:
    """The work blocks the loop: a request sent meanwhile gets its budget from when it is read."""

    def run(loop: dict[str, str] | None) -> tuple[int, int]:
        service: dict[str, Any] = {
            "workers": 1,
            "deadline": {"shed_short": True, "enforce": False, "cancel_on_caller_left": False},
            "routes": {"r": {"work": "300ms"}},
        }
        if loop is not None:
            service["loop"] = loop
        v = one({"s": service}, {"to": "s/r", "rate": 10, "count": 2, "timeout": "450ms"})
        server = v.services["s"].servers[0]
        return server.wasted, server.dropped

    # The second request, sent at 0.1 s, is read at 0.3 s with 450 ms left, enough for its
    # 300 ms: served, after its client left at 0.55 s. Read at once, it has 250 ms: shed.
    assert run({"arrival": "0s"}) == (1, 0)
    assert run(None) == (0, 1)


def test_loop_server_costs_take_capacity() -> None:
    """10 ms of work and 2 ms per arrival at 100 requests/s: 1.2 × capacity, a queue."""
    service = {"workers": 1, "routes": {"r": {"work": "10ms"}}}
    load = {"to": "s/r", "rate": 100, "count": 100}
    plain = one({"s": service}, load)
    costly = one({"s": {**service, "loop": {"arrival": "2ms"}}}, load)
    assert plain.loads["r"].p99_ms == pytest.approx(10.0)
    # The 100th request is read at 1.2 s - 10 ms and answered 10 ms later; it was sent at 0.99 s.
    assert costly.loads["r"].p99_ms == pytest.approx(200.0, abs=12.0)


def test_loop_server_pays_for_a_caller_that_leaves() -> None:
    """`left`: each client that gives up costs the core, and delays the next job."""
    service = {"workers": 1, "routes": {"r": {"work": "100ms"}}}
    load = [{"name": "gone", "to": "s/r", "rate": 1000, "count": 5, "timeout": "50ms"},
            {"name": "late", "to": "s/r", "start": "0.6s", "rate": 1, "count": 1}]  # fmt: skip
    free = one({"s": {**service, "loop": {"left": "0s"}}}, load)
    costly = one({"s": {**service, "loop": {"left": "100ms"}}}, load)
    # Five jobs of 100 ms for callers gone at 50 ms: the core is free at 0.5 s; with
    # 100 ms per leaving caller (paid at 50 ms, before the second job), at 1.0 s.
    assert free.loads["late"].p50_ms == pytest.approx(100.0)
    assert costly.loads["late"].p50_ms == pytest.approx(500.0)


def test_loop_server_reads_a_request_after_its_passes() -> None:
    """`passes`: a request is read after that many turns of the loop; a job runs in each."""

    def run(passes: int) -> tuple[int, int]:
        service = {
            "workers": 1,
            "loop": {"passes": passes},
            "deadline": {"shed_short": True, "enforce": False, "cancel_on_caller_left": False},
            "routes": {"r": {"work": "100ms"}},
        }
        queue = [{"name": f"q{i}", "to": "s/r", "rate": 1, "count": 1} for i in range(4)]
        late = {"name": "late", "to": "s/r", "start": "50ms", "rate": 1, "count": 1,
                "timeout": "350ms"}  # fmt: skip
        server = one({"s": service}, [*queue, late]).services["s"].servers[0]
        return server.wasted, server.dropped

    # Four requests read at 0 s: jobs 0-0.1, 0.1-0.2, 0.2-0.3, 0.3-0.4 s. The late one,
    # sent at 50 ms, is read at 0.1 s with one pass: at 0.4 s it has 50 ms left for its
    # 100 ms of work, shed. With two, the second job runs first: read at 0.2 s, it has
    # 150 ms left at 0.4 s and is served, for a client gone at 0.4 s.
    assert run(1) == (0, 1)
    assert run(2) == (1, 0)
