"""Inbound cost in instructions: the Starlette server of `inbound.py` under callgrind.

    python benchmarks/instructions.py [--requests N] [--json PATH]

On a shared virtual machine the wall-clock and CPU-time ratios of `inbound.py` move by
several per cent from run to run. Instruction counts do not: each server (bare, the
floor, `DeadlineMiddleware`, the FastAPI route bare and with it) runs under valgrind's
callgrind, warms up on 400 requests with counting off, then counts N requests sent one
at a time on one keep-alive connection. Hash randomisation is off, so two runs of the
same code agree to about 0.1 %. Per request it prints the instructions (Ir), the L1
misses of callgrind's simulated cache, and callgrind's cycle estimate (Ir + 10 per L1
miss + 100 per last-level miss); the ratio to the bare server is the comparison.

The middleware runs with ``watch_after=0.5``: under valgrind a request takes ~50x
longer, and the default 10 ms would start the caller-left watcher for requests that,
at full speed, end long before it. Callgrind's cache is a model, not this CPU: the
estimate ranks changes reliably but the real ratio (`inbound.py`) is the one the goal
is judged on. Needs ``valgrind`` on PATH; about 20 s per server.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import child_env

HERE = Path(__file__).resolve().parent
WARMUP = 400
GOAL = 1.5  # instructions the middleware adds, at most this many times TrustedHost's
SERVERS = {
    "Starlette, bare": ("starlette", "/"),
    "Starlette + floor middleware": ("starlette", "/", "--floor"),
    "Starlette + DeadlineMiddleware": ("starlette", "/", "--deadlines", "--watch-after", "0.5"),
    "Starlette + its TrustedHost": ("starlette", "/", "--reference", "trustedhost"),
    "Starlette + its GZip": ("starlette", "/", "--reference", "gzip"),
    "FastAPI route, bare": ("fastapi", "/items/42?q=x"),
    "FastAPI + DeadlineMiddleware": (
        "fastapi",
        "/items/42?q=x",
        "--deadlines",
        "--watch-after",
        "0.5",
    ),
}
_LENGTH = re.compile(rb"content-length: *(\d+)", re.IGNORECASE)


def _exchange(sock: socket.socket, request: bytes) -> None:
    """Send one request and read its whole response (Content-Length framed)."""
    sock.sendall(request)
    data = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            raise RuntimeError("the server closed the connection")
        data += chunk
        head, found, body = data.partition(b"\r\n\r\n")
        if found:
            length = _LENGTH.search(head)
            if length is None:
                raise RuntimeError(f"no Content-Length in {head!r}")
            if len(body) >= int(length.group(1)):
                return


def _totals(path: Path) -> dict[str, int]:
    """The event totals of a callgrind output file."""
    events: list[str] = []
    for line in path.read_text().splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("totals:"):
            return dict(zip(events, map(int, line.split()[1:]), strict=True))
    raise RuntimeError(f"no totals in {path}")


def measure(kind: str, path: str, args: tuple[str, ...], requests: int) -> dict[str, float]:
    """Per-request Ir, L1 misses and estimated cycles of one server under callgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        env = dict(child_env(os.environ), PYTHONHASHSEED="0")
        command = [
            "valgrind",
            "--tool=callgrind",
            "--instr-atstart=no",
            "--cache-sim=yes",
            f"--callgrind-out-file={out}",
            sys.executable,
            str(HERE / "servers.py"),
            kind,
            *args,
        ]
        server = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
        )
        try:
            assert server.stdout is not None
            line = server.stdout.readline().decode()
            if not line.startswith("READY "):
                raise RuntimeError(f"{kind} {args}: no READY line, got {line!r}")
            port = json.loads(line.split(" ", 1)[1])["port"]
            request = (
                f"GET {path} HTTP/1.1\r\nHost: bench\r\nx-request-timeout-ms: 2000\r\n\r\n"
            ).encode()
            with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
                for _ in range(WARMUP):
                    _exchange(sock, request)
                _control("-i", "on", server.pid)
                for _ in range(requests):
                    _exchange(sock, request)
                _control("-d", server.pid)
        finally:
            server.terminate()
            server.wait(60)
        # The dump asked for holds the counted requests (``callgrind.out.1``); the file
        # written at exit, only what ran after it.
        dumps = sorted(Path(tmp).glob("callgrind.out.*"))
        if len(dumps) != 1:
            raise RuntimeError(f"expected one callgrind dump, found {dumps}")
        totals = _totals(dumps[0])
    misses_l1 = totals["I1mr"] + totals["D1mr"] + totals["D1mw"]
    misses_ll = totals["ILmr"] + totals["DLmr"] + totals["DLmw"]
    return {
        "ir": totals["Ir"] / requests,
        "l1_misses": misses_l1 / requests,
        "est_cycles": (totals["Ir"] + 10 * misses_l1 + 100 * misses_ll) / requests,
    }


def _control(*args: object) -> None:
    subprocess.run(["callgrind_control", *map(str, args)], check=True, capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000, help="counted per server")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    options = parser.parse_args()
    if options.requests < 1:
        parser.error("--requests must be at least 1")
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("valgrind (with callgrind_control) is needed on PATH")
    results: dict[str, dict[str, float]] = {}
    for label, (kind, path, *args) in SERVERS.items():
        print(f"[instructions] {label} ...", file=sys.stderr, flush=True)
        results[label] = measure(kind, path, tuple(args), options.requests)
    print(f"{'server':34} {'Ir/req':>9} {'L1 miss':>8} {'est cycles':>11} {'ratio':>6}")
    for label, row in results.items():
        bare = results["FastAPI route, bare" if label.startswith("FastAPI") else "Starlette, bare"]
        ratio = row["est_cycles"] / bare["est_cycles"]
        print(
            f"{label:34} {row['ir']:9.0f} {row['l1_misses']:8.0f} "
            f"{row['est_cycles']:11.0f} {ratio:6.3f}"
        )
    bare = results["Starlette, bare"]["ir"]
    ours = results["Starlette + DeadlineMiddleware"]["ir"] - bare
    theirs = results["Starlette + its TrustedHost"]["ir"] - bare
    verdict = "met" if ours <= GOAL * theirs else "missed"
    print(
        f"instructions added per request: DeadlineMiddleware {ours:.0f}, TrustedHost"
        f" {theirs:.0f}: {ours / theirs:.2f}x (goal: at most {GOAL}x, {verdict})"
    )
    if options.json:
        options.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
