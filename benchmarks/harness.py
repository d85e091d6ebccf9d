"""Side-by-side measurement: alternate A and B in one run, report medians, spread, ratio.

Also the plumbing the suites share: child processes that announce their port, and the
CPU time and resident memory of a process read from /proc.
"""

from __future__ import annotations

import json
import os
import selectors
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal

HERE = Path(__file__).resolve().parent
READY = "READY "
# glibc's malloc serves a block above its mmap threshold (128 KiB at start) with mmap, and
# raises the threshold the first time such a block is freed whole. asyncio reads into a
# 256 KiB buffer, so until one read comes back empty (a peer closed, a spurious wake-up)
# every read costs an mmap, an mremap and a munmap: ~12 µs, six times the read itself.
# When that first happens depends on a process's history, and two identical servers
# could differ by that much for their whole lives. Every child starts in the state a
# running service reaches: such blocks come from the heap. (Other C libraries ignore it.)
MALLOC_TUNABLES = "glibc.malloc.mmap_threshold=4194304:glibc.malloc.trim_threshold=8388608"


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) by linear interpolation; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


@dataclass
class Summary:
    """A distribution in the unit of its samples."""

    n: int
    min: float
    p50: float
    p99: float
    max: float
    iqr: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Summary:
        """Summarise `values`."""
        return cls(
            n=len(values),
            min=min(values),
            p50=statistics.median(values),
            p99=quantile(values, 0.99),
            max=max(values),
            iqr=quantile(values, 0.75) - quantile(values, 0.25),
        )


@dataclass
class Comparison:
    """One row of the report: B measured against A, side by side.

    `rounds` holds B/A ratios of the medians of each alternation round (see
    `turns`); when present, the row's ratio is their median and the spread
    their interquartile range, so slow drift of the machine cancels within a round.
    `passed` is the verdict against `goal` (None: nothing to judge).
    """

    name: str
    metric: str  # what the samples are, with unit, e.g. "latency ms"
    a_label: str
    b_label: str
    a: Summary
    b: Summary
    goal: str = ""
    notes: dict[str, Any] = field(default_factory=dict)
    rounds: list[float] = field(default_factory=list)
    passed: bool | None = None

    @property
    def ratio(self) -> float:
        """B over A: the median of the per-round ratios, else B's median over A's."""
        if self.rounds:
            return statistics.median(self.rounds)
        return self.b.p50 / self.a.p50 if self.a.p50 else float("nan")

    @property
    def ratio_spread(self) -> tuple[float, float]:
        """The 25th and 75th percentiles of the per-round ratios (ratio twice without)."""
        if not self.rounds:
            return self.ratio, self.ratio
        return quantile(self.rounds, 0.25), quantile(self.rounds, 0.75)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict, ratio and its spread included."""
        data = asdict(self)
        data["ratio"] = self.ratio
        data["ratio_iqr"] = list(self.ratio_spread)
        return data


@dataclass
class Bounded:
    """A figure that must stay under a bound (no A/B): e.g. requests in flight."""

    name: str
    metric: str
    value: Summary  # the samples over time
    bound: float
    goal: str
    notes: dict[str, Any] = field(default_factory=dict)
    #: Which statistic the bound holds: every sample ("max"), or the typical one ("p50").
    held: Literal["max", "p50"] = "max"

    @property
    def passed(self) -> bool:
        """Whether the held statistic (the largest sample, by default) stayed within the bound."""
        return getattr(self.value, self.held) <= self.bound

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict, verdict included."""
        data = asdict(self)
        data["passed"] = self.passed
        return data


Row = Comparison | Bounded


def turns(rounds: int, sides: int) -> Iterator[int]:
    """Which side runs next: every round each side in turn, each going first in turn,
    so slow drift of the machine hits every side alike."""
    for i in range(rounds):
        for j in range(sides):
            yield (i + j) % sides


def alternate(
    rounds: int, run_a: Callable[[], list[float]], run_b: Callable[[], list[float]]
) -> tuple[list[float], list[float]]:
    """Run A then B, B then A, ... `rounds` times (`turns`), so drift hits both sides equally."""
    sides = (run_a, run_b)
    seen: tuple[list[float], list[float]] = ([], [])
    for k in turns(rounds, 2):
        seen[k].extend(sides[k]())
    return seen


def verdict_ratio(
    row: Comparison, *, at_most: float | None = None, at_least: float | None = None
) -> Comparison:
    """Judge `row` by its ratio; sets and returns `row.passed`."""
    r = row.ratio
    row.passed = (at_most is None or r <= at_most) and (at_least is None or r >= at_least)
    return row


def verdict_p99(row: Comparison, at_most: float) -> Comparison:
    """Judge `row` by B's p99; sets and returns `row.passed`."""
    row.passed = row.b.p99 <= at_most
    return row


def _mark(passed: bool | None) -> str:
    return "" if passed is None else ("ok" if passed else "MISSED")


def table(rows: Sequence[Row]) -> str:
    """The report as fixed-width text: A/B comparisons, then bounded figures."""
    comparisons = [r for r in rows if isinstance(r, Comparison)]
    bounded = [r for r in rows if isinstance(r, Bounded)]
    lines: list[str] = []
    if comparisons:
        head = (
            f"{'comparison':<40} {'metric':<17} {'A p50':>9} {'B p50':>9} {'ratio':>6}"
            f" {'ratio IQR':>13} {'A p99':>9} {'B p99':>9}  goal"
        )
        lines += [head, "-" * len(head)]
        for r in comparisons:
            low, high = r.ratio_spread
            spread = f"{low:.3f}-{high:.3f}" if r.rounds else ""
            lines.append(
                f"{r.name:<40} {r.metric:<17} {r.a.p50:>9.3f} {r.b.p50:>9.3f} {r.ratio:>6.3f}"
                f" {spread:>13} {r.a.p99:>9.3f} {r.b.p99:>9.3f}  {r.goal} {_mark(r.passed)}"
            )
            lines.append(f"{'':<4}A = {r.a_label}; B = {r.b_label}")
    if bounded:
        if lines:
            lines.append("")
        head = f"{'bounded figure':<40} {'metric':<22} {'p50':>9} {'max':>9} {'bound':>9}  goal"
        lines += [head, "-" * len(head)]
        for f in bounded:
            lines.append(
                f"{f.name:<40} {f.metric:<22} {f.value.p50:>9.1f} {f.value.max:>9.1f}"
                f" {f.bound:>9.1f}  {f.goal} {_mark(f.passed)}"
            )
    return "\n".join(lines)


# Processes: CPU time and memory from /proc (Linux), children that announce a port.


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds a process has used so far (its threads included)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks  # utime, stime


def rss_mb(pid: int | None = None) -> float:
    """Resident memory of a process (this one by default) in MiB."""
    status = Path(f"/proc/{pid or 'self'}/status").read_text()
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc status")


def _fixed_work() -> int:
    total = 0
    for i in range(100_000):
        total += i * i
    return total


def steadiness(seconds: float = 1.0) -> dict[str, Any]:
    """How steady the machine's CPUs are right now: a fixed piece of work, timed over and over.

    On each CPU in turn (this process pinned to it) for `seconds`: the 10th, 50th and
    90th percentile of the work's CPU time in ms, and ``spread``, the largest p90/p10 over
    the CPUs. The work is the same every time, so on CPUs nobody else contends for the
    spread stays near 1. When neighbours on the host contend for the cores or their
    caches it grows (on the development VM it read 1.15-1.87 over one evening, and at
    1.7 the inbound suite's A/A row, two identical servers, read 0.95-1.06): ratios of
    a few per cent between A and B cannot be read from such a run. Also the time the
    hypervisor stole from this VM so far (``steal_s``, all CPUs, from /proc/stat).
    """
    cores = sorted(os.sched_getaffinity(0))
    per_core: dict[int, list[float]] = {}
    try:
        for core in cores:
            os.sched_setaffinity(0, {core})
            times: list[float] = []
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                started = time.process_time()
                _fixed_work()
                times.append((time.process_time() - started) * 1000)
            per_core[core] = [quantile(times, q) for q in (0.1, 0.5, 0.9)]
    finally:
        os.sched_setaffinity(0, cores)
    return {
        "work_ms_p10_p50_p90": {str(c): [round(v, 3) for v in qs] for c, qs in per_core.items()},
        "spread": round(max(qs[2] / qs[0] for qs in per_core.values()), 3),
        "steal_s": steal_seconds(),
    }


def steadiness_line(before: dict[str, Any], after: dict[str, Any]) -> str:
    """One line for the report: the spread of two `steadiness` readings and the steal between."""
    return (
        f"steadiness (fixed work, p90/p10 per CPU; 1.0 is perfectly steady): {before['spread']}"
        f" before, {after['spread']} after; {after['steal_s'] - before['steal_s']:.1f} s"
        " stolen by the hypervisor in between"
    )


def steal_seconds() -> float:
    """CPU time the hypervisor has stolen from this machine since boot, all CPUs (Linux)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return int(fields[8]) / os.sysconf("SC_CLK_TCK") if len(fields) > 8 else 0.0


def child_env(base: Mapping[str, str]) -> dict[str, str]:
    """`base` for a child process: unbuffered output, and malloc in its steady state.

    The tunables the caller set come last, so where they name the same setting theirs
    wins.
    """
    tunables = base.get("GLIBC_TUNABLES")
    malloc = MALLOC_TUNABLES if not tunables else f"{MALLOC_TUNABLES}:{tunables}"
    return {**base, "PYTHONUNBUFFERED": "1", "GLIBC_TUNABLES": malloc}


class Child:
    """A helper process (``python benchmarks/SCRIPT ARGS``) that prints ``READY {json}``.

    Use as a context manager: it waits for readiness, and on exit terminates the
    process by its PID (killing it if it lingers) and reaps it.
    """

    def __init__(
        self,
        script: str,
        *args: str,
        ready_timeout: float = 30.0,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Start it; `env` replaces this process's environment (`child_env` still applies)."""
        self.argv = [sys.executable, str(HERE / script), *args]
        self.ready_timeout = ready_timeout
        self.info: dict[str, Any] = {}
        self._stderr: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            self.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=child_env(os.environ if env is None else env),
        )

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self.process.pid

    @property
    def port(self) -> int:
        """The port it announced."""
        return int(self.info["port"])

    def readline(self, timeout: float) -> str:
        """The next line of the child's stdout; raises if it does not come in time."""
        stdout = self.process.stdout
        assert stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(stdout, selectors.EVENT_READ)
            if not sel.select(timeout):
                raise RuntimeError(f"{self.argv[2:]} said nothing for {timeout} s")
        line = stdout.readline().decode()
        if not line:
            self.process.wait(5)
            raise RuntimeError(f"{self.argv[2:]} exited: {self.stderr_text()[-2000:]}")
        return line.rstrip("\n")

    def ask(self, command: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send one JSON command line on stdin; the JSON line it answers."""
        stdin = self.process.stdin
        assert stdin is not None
        stdin.write((json.dumps(command) + "\n").encode())
        stdin.flush()
        answer: dict[str, Any] = json.loads(self.readline(timeout))
        return answer

    def stderr_text(self) -> str:
        """What the child wrote on stderr so far."""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")

    def __enter__(self) -> Child:
        try:
            line = self.readline(self.ready_timeout)
            if not line.startswith(READY):
                raise RuntimeError(f"{self.argv[2:]} said {line!r}")
            self.info = json.loads(line[len(READY) :])
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        """Terminate, kill after 3 s, reap."""
        proc = self.process
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(3)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()
        self._stderr.close()


def exit_with_parent(poll: float = 0.5) -> None:
    """In a child: end this process when its parent is gone (a killed benchmark run)."""
    import threading

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll)
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def announce(info: dict[str, Any]) -> None:
    """In a child: tell the parent it is ready (``READY {json}`` on stdout)."""
    print(READY + json.dumps(info), flush=True)
