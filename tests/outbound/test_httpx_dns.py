"""deadlines.httpx: name resolution is inside the connect window, against a hung resolver.

The hung resolver lives in a network namespace each test creates: its own loopback, a
``resolv.conf`` of its own (``ip netns exec`` bind-mounts ``/etc/netns/NAME/resolv.conf``
over ``/etc/resolv.conf`` for the command it runs) naming 127.0.0.1, and a UDP socket on
127.0.0.1:53 there that reads every query and never answers. Nothing leaves loopback and
the machine's own resolver configuration is not touched. Needs root and iproute2.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from outbound_helpers import fired_at

import deadlines.httpx as dhttpx
from deadlines import Dependency
from deadlines.httpx._resolver import MAX_LOOKUPS, resolver
from deadlines.lab.servers import HealthyServer

pytestmark = pytest.mark.realtime

NETNS_ETC = Path("/etc/netns")

# Runs inside the namespace. Prints one JSON object: what each call raised, and when.
CHILD = r"""
import asyncio, json, os, socket, sys, threading, time

import httpx

import deadlines
import deadlines.httpx as dhttpx
from deadlines import Dependency

PLAIN_WAIT = float(sys.argv[1])

queries = []
resolver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
resolver.bind(("127.0.0.1", 53))


def never_answer():
    while True:
        queries.append(resolver.recv(4096))


threading.Thread(target=never_answer, daemon=True).start()


def outcome(start, exc):
    return {
        "error": type(exc).__name__,
        "phase": getattr(exc, "phase", None),
        "request_sent": getattr(exc, "request_sent", None),
        "elapsed": time.monotonic() - start,
    }


def sync_call(url, dependency, deadline=None):
    with dhttpx.Client(dependency) as client:  # built before the clock starts
        start = time.monotonic()
        try:
            if deadline is None:
                client.get(url)
            else:
                with deadlines.scope(deadline):
                    client.get(url)
        except Exception as exc:
            return outcome(start, exc)
    return {"error": None, "elapsed": time.monotonic() - start}


async def async_call(url, dependency):
    async with dhttpx.AsyncClient(dependency) as client:
        start = time.monotonic()
        try:
            await client.get(url)
        except Exception as exc:
            return outcome(start, exc)
    return {"error": None, "elapsed": time.monotonic() - start}


def resolver_threads():
    return sum(t.name == "deadlines-resolve" for t in threading.enumerate())


# Plain httpx first, in a thread of its own: it waits for the system resolver.
plain = {}


def plain_call():
    start = time.monotonic()
    try:
        httpx.get("http://plain.invalid:8080/", timeout=0.5)
    except Exception as exc:
        plain.update(outcome(start, exc))


plain_start = time.monotonic()
threading.Thread(target=plain_call, daemon=True).start()

report = {}
report["sync"] = sync_call("http://some-name.invalid:8080/", Dependency("dns", connect=0.5))
report["sync_again"] = sync_call(
    "http://some-name.invalid:8080/", Dependency("dns", connect=0.5)
)
report["threads_after_same_name_twice"] = resolver_threads()
report["deadline"] = sync_call(
    "http://deadline.invalid:8080/", Dependency("dns", connect=5, total=10), deadline=0.3
)
burst = []


def burst_call(i):
    burst.append(sync_call(f"http://burst-{i}.invalid:8080/", Dependency("dns", connect=0.5)))


callers = [threading.Thread(target=burst_call, args=(i,)) for i in range(24)]
for caller in callers:
    caller.start()
for caller in callers:
    caller.join()
report["burst"] = burst
report["threads_after_burst"] = resolver_threads()
# Not asyncio.run: it would wait at exit for the loop's executor, where the abandoned
# lookup of the async call runs on (up to glibc's 10 s).
loop = asyncio.new_event_loop()
report["async"] = loop.run_until_complete(
    async_call("http://async.invalid:8080/", Dependency("dns", connect=0.5))
)
time.sleep(max(0.0, PLAIN_WAIT - (time.monotonic() - plain_start)))
report["plain"] = dict(plain) or {"error": None, "still_running_after": PLAIN_WAIT}
report["queries"] = len(queries)
print(json.dumps(report), flush=True)
os._exit(0)  # not waiting for the abandoned lookups (threads) at interpreter exit
"""


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    ip = shutil.which("ip")
    assert ip is not None, "iproute2's `ip` is needed to create a network namespace"
    return subprocess.run([ip, *args], capture_output=True, text=True, timeout=10, check=False)


@pytest.fixture
def silent_resolver_netns() -> Iterator[str]:
    """A network namespace whose resolv.conf names 127.0.0.1; removed afterwards."""
    name = f"deadlines-dns-{uuid.uuid4().hex[:8]}"
    created = _ip("netns", "add", name)
    if created.returncode != 0:
        pytest.fail(
            f"`ip netns add {name}` failed ({created.stderr.strip()}): this test needs root"
            " and iproute2 to run a hung resolver in a namespace of its own"
        )
    made_etc = not NETNS_ETC.exists()
    etc = NETNS_ETC / name
    try:
        etc.mkdir(parents=True)
        (etc / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:5 attempts:2\n")
        up = _ip("-n", name, "link", "set", "lo", "up")
        assert up.returncode == 0, up.stderr
        yield name
    finally:
        _ip("netns", "del", name)
        shutil.rmtree(etc, ignore_errors=True)
        if made_etc:
            with contextlib.suppress(OSError):  # another namespace's files are there now
                NETNS_ETC.rmdir()


def _run_in(netns: str, plain_wait: float) -> dict[str, Any]:
    """Run CHILD in `netns` (killed by PID if it overstays) and return its report."""
    ip = shutil.which("ip")
    assert ip is not None
    child = subprocess.Popen(
        [ip, "netns", "exec", netns, sys.executable, "-c", CHILD, str(plain_wait)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        out, err = child.communicate(timeout=plain_wait + 10)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err
    report: dict[str, Any] = json.loads(out)
    return report


def test_sync_dns_is_bounded_by_the_connect_window(silent_resolver_netns: str) -> None:
    """A resolver that never answers: ConnectTimeout at connect=0.5, not at glibc's 10 s."""
    report = _run_in(silent_resolver_netns, plain_wait=3.0)
    assert report["queries"] > 0, "the calls never reached the silent resolver"

    for case in ("sync", "sync_again", "async"):
        result = report[case]
        assert result["error"] == "ConnectTimeout", (case, result)
        assert result["phase"] == "connect", (case, result)
        assert result["request_sent"] is False, (case, result)
        assert 0.49 <= result["elapsed"] <= 1.0, (case, result)

    # The second call for the same name joined the abandoned lookup: one thread, not two.
    assert report["threads_after_same_name_twice"] == 1

    deadline = report["deadline"]
    assert deadline["error"] == "DeadlineExceeded", deadline
    assert deadline["phase"] == "connect"
    assert deadline["request_sent"] is False
    assert fired_at(deadline["elapsed"], 0.3), deadline

    # 24 distinct hung names at once: each caller still ends at its window, and no more
    # than the resolver's 16 lookups run (two are left over from the calls above).
    assert len(report["burst"]) == 24
    for result in report["burst"]:
        assert result["error"] == "ConnectTimeout", result
        assert 0.49 <= result["elapsed"] <= 1.0, result
    assert report["threads_after_burst"] == MAX_LOOKUPS

    # Plain httpx with timeout=0.5 is still waiting for getaddrinfo seconds later.
    assert report["plain"] == {"error": None, "still_running_after": 3.0}, report["plain"]


def test_ip_literal_starts_no_lookup_and_names_still_connect() -> None:
    """127.0.0.1 needs no resolver thread; "localhost" is resolved in one and connects."""
    dep = Dependency("t", connect=0.5)
    with HealthyServer(body=b"hi") as server, dhttpx.Client(dep) as client:
        before = resolver.started
        assert client.get(server.url).text == "hi"
        assert resolver.started == before
        port = server.url.rsplit(":", 1)[1]
        with dhttpx.Client(dep) as by_name:
            assert by_name.get(f"http://localhost:{port}/").text == "hi"
        assert resolver.started == before + 1
