"""examples/services: each service started with its one command, then used over HTTP.

Each runs in a child process on a free loopback port and is stopped by its PID.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

SERVICES = Path(__file__).resolve().parents[2] / "examples" / "services"


def free_port(pairs: int = 1) -> int:
    """A loopback port that was free a moment ago (and the next one, for `pairs` = 2)."""
    for _ in range(50):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if pairs == 1:
            return port
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    raise RuntimeError("no free pair of ports")


@contextmanager
def started(script: str, *args: str, port: int) -> Iterator[str]:
    """Run `script` with `args` until it accepts connections on `port`; its base URL."""
    process = subprocess.Popen(
        [sys.executable, str(SERVICES / script), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        end = time.monotonic() + 30
        while True:
            assert process.poll() is None, process.communicate()[1].decode()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < end, f"{script} did not start"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
        assert process.stderr is not None
        process.stderr.close()


def get(url: str, budget_ms: int | None = None) -> tuple[httpx.Response, float]:
    """GET `url` (with a deadline header if given): the response and how long it took."""
    headers = {} if budget_ms is None else {"x-request-timeout-ms": str(budget_ms)}
    start = time.monotonic()
    response = httpx.get(url, headers=headers, timeout=10)
    return response, time.monotonic() - start


@pytest.mark.postgres
def test_fastapi_service_calls_pricing_and_postgres_inside_the_budget() -> None:
    """FastAPI + httpx + asyncpg: an order within the caller's budget; 504 when too slow."""
    port = free_port()
    with started("fastapi_service.py", "--port", str(port), port=port) as url:
        response, _ = get(f"{url}/orders/7", 1500)
        assert response.status_code == 200, response.text
        order = response.json()
        assert order["price"] == 10.5 and order["stock"] == 70
        assert 0 < order["left"] < 1.5
        response, took = get(f"{url}/orders/7?delay=1", 300)
        assert response.status_code == 504
        assert took < 1.0  # not the second the pricing call would have taken


def test_aiohttp_service_renders_without_late_recommendations() -> None:
    """aiohttp.web + deadlines.aiohttp: recommendations when on time, [] when late."""
    port = free_port()
    with started("aiohttp_service.py", "--port", str(port), port=port) as url:
        response, _ = get(f"{url}/home", 1000)
        assert response.json()["recs"] == ["a", "b"]
        response, took = get(f"{url}/home?slow=1")
        assert response.status_code == 200 and response.json()["recs"] == []
        assert took < 1.5


def test_django_service_gives_views_their_deadline_and_the_504() -> None:
    """Django under uvicorn: a sync view sees the header's budget; a slow async view, 504."""
    port = free_port()
    with started("django_service.py", "--port", str(port), port=port) as url:
        response, _ = get(f"{url}/budget", 800)
        assert 0.5 < response.json()["left"] <= 0.8
        response, took = get(f"{url}/report")
        assert response.status_code == 504
        assert 0.4 < took < 2.0


def test_grpc_bridge_carries_the_deadline_from_http_to_grpc() -> None:
    """HTTP to gRPC: the gRPC hop gets less than the HTTP hop; past the deadline, 504."""
    port = free_port(pairs=2)
    with started("grpc_bridge.py", "--port", str(port), port=port) as url:
        response, _ = get(f"{url}/quote/ACME", 900)
        assert response.status_code == 200, response.text
        quote = response.json()
        assert quote["price"] == 42.0
        assert 0 < quote["grpc_left"] < 0.9 and quote["http_left"] <= 0.9
        response, took = get(f"{url}/quote/ACME?delay=1", 300)
        assert response.status_code == 504
        assert took < 1.0


def test_llm_stream_fails_over_and_ends_at_each_limit() -> None:
    """First token, idle and total: the backup answers, a stall and a trickle are cut."""
    port = free_port()
    with started("llm_stream.py", "--port", str(port), port=port) as url:
        answers = {mode: get(f"{url}/chat?primary={mode}")[0].json() for mode in DELAYS}
    assert answers["ok"] == {"answer": [f"ok-{i}" for i in range(5)], "ended": "complete"}
    assert answers["silent"] == answers["ok"]  # the backup's answer
    assert answers["stall"] == {"answer": ["stall-0", "stall-1"], "ended": "StreamIdleTimeout"}
    assert answers["trickle"]["ended"] == "TotalTimeout"
    assert 3 <= len(answers["trickle"]["answer"]) <= 11  # a token per 0.2 s for 2 s


DELAYS = ("ok", "silent", "stall", "trickle")


@pytest.mark.redis
def test_celery_job_runs_in_time_or_is_revoked() -> None:
    """The Celery example's one command: one job runs with its budget, the late one does not."""
    result = subprocess.run(
        [sys.executable, str(SERVICES / "celery_job.py")],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("in time: ran with 1.") or lines[0].startswith("in time: ran with 2")
    assert lines[1] == "late: revoked, never run: its deadline passed in the queue"
