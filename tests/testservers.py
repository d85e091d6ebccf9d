"""The PostgreSQL and Redis servers the tests use, and the session fixtures that hand them out.

For each service, in this order:

1. `DEADLINES_TEST_PG` (a libpq DSN) / `DEADLINES_TEST_REDIS` (a URL) from the environment;
2. the machine's own server on the default address (127.0.0.1:5432 / 127.0.0.1:6379),
   unless `DEADLINES_TEST_SERVERS=throwaway`;
3. a throwaway server started for the session on a free loopback port, in a temporary
   directory: a fresh cluster (`initdb`, trust auth, user `postgres`, database `test`) or a
   `redis-server` with no persistence. Both are stopped by PID and their directories
   removed when the session ends;
4. else the tests that need the service fail with one line naming what to install.

`DEADLINES_TEST_BINPATH` (directories, `os.pathsep`-separated) replaces where the server
binaries are looked for: /usr/lib/postgresql/*/bin, Homebrew's postgresql@*/bin, then PATH.
"""

from __future__ import annotations

import contextlib
import dataclasses
import glob
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import quote, urlsplit

import pytest

PG_VAR, REDIS_VAR = "DEADLINES_TEST_PG", "DEADLINES_TEST_REDIS"
MODE_VAR, BIN_VAR = "DEADLINES_TEST_SERVERS", "DEADLINES_TEST_BINPATH"
PG_INSTALL = (
    "install PostgreSQL (Debian: apt install postgresql; Homebrew: brew install postgresql@17)"
    f" or set {PG_VAR} to a DSN"
)
REDIS_INSTALL = (
    "install Redis (Debian: apt install redis-server; Homebrew: brew install redis)"
    f" or set {REDIS_VAR} to a URL"
)
PG_DIRS = (  # Debian, then Homebrew (Apple silicon, Intel): keg-only, not on PATH
    "/usr/lib/postgresql/*/bin",
    "/opt/homebrew/opt/postgresql@*/bin",
    "/usr/local/opt/postgresql@*/bin",
)
FIELDS = ("host", "port", "user", "dbname", "password")  # what the tests take from a DSN
STARTUP = 60.0  # seconds a throwaway server may take to accept connections
A = TypeVar("A")


class Unavailable(Exception):
    """A service the tests need cannot be had; the message is one line saying why."""


@dataclasses.dataclass(frozen=True)
class Postgres:
    """Where a PostgreSQL server is, and whom the tests connect as."""

    host: str = "127.0.0.1"
    port: int = 5432
    user: str = "postgres"
    dbname: str = "test"
    password: str | None = None

    @classmethod
    def from_dsn(cls, dsn: str) -> Postgres:
        """Host, port, user, password and database of a DSN; the rest default to ours."""
        from psycopg import conninfo

        try:
            parts = conninfo.conninfo_to_dict(dsn)
        except Exception as exc:
            raise Unavailable(f"{PG_VAR} is not a valid DSN: {one_line(exc)}") from exc
        given: dict[str, Any] = {k: str(v) for k, v in parts.items() if k in FIELDS}
        if "port" in given:
            given["port"] = int(given["port"])
        return dataclasses.replace(cls(), **given)

    @property
    def dsn(self) -> str:
        """The libpq keyword/value connection string (psycopg)."""
        from psycopg import conninfo

        fields = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        return conninfo.make_conninfo(**fields)

    def url(self, scheme: str = "postgresql") -> str:
        """The connection URL (asyncpg; SQLAlchemy with e.g. `postgresql+psycopg`)."""
        secret = f":{quote(self.password, safe='')}" if self.password else ""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{quote(self.user, safe='')}{secret}@{host}:{self.port}/{self.dbname}"

    def __str__(self) -> str:
        return f"{self.host}:{self.port}/{self.dbname}"


@dataclasses.dataclass(frozen=True)
class Server(Generic[A]):
    """A server chosen for the tests: its address, how it was found, and (when we
    started it) its main process and temporary directory."""

    address: A
    source: str
    pid: int | None = None
    dir: Path | None = None

    def describe(self, name: str) -> str:
        """One line for the end of the run, saying whether a throwaway left anything."""
        where = _netloc(self.address) if isinstance(self.address, str) else self.address
        line = f"{name} for the tests: {where} ({self.source})"
        if self.pid is None or self.dir is None:
            return line
        left = [f"pid {self.pid} running"] if alive(self.pid) else []
        left += [f"{self.dir} on disk"] if self.dir.exists() else []
        return f"{line}, pid {self.pid} in {self.dir}: " + (
            "LEFT BEHIND: " + ", ".join(left) if left else "stopped and removed"
        )


@contextmanager
def postgres(
    env: Mapping[str, str] = os.environ, *, default: Postgres = Postgres()
) -> Iterator[Server[Postgres]]:
    """The PostgreSQL server for the tests (see the module docstring), checked to answer."""
    with contextlib.ExitStack() as stack:
        if dsn := env.get(PG_VAR):
            server = Server(Postgres.from_dsn(dsn), f"from {PG_VAR}")
        elif not throwaway_forced(env) and answers(default.host, default.port):
            server = Server(default, "found on the default address")
        elif bindir := find(("initdb", "postgres"), search_dirs(env)):
            server = stack.enter_context(throwaway_postgres(bindir))
        else:
            missing = missing_binaries(env, default.host, default.port, "initdb/postgres")
            raise Unavailable(f"PostgreSQL is needed: {missing}; {PG_INSTALL}")
        _check_postgres(server)
        yield server


@contextmanager
def redis(
    env: Mapping[str, str] = os.environ, *, default: str = "redis://127.0.0.1:6379/9"
) -> Iterator[Server[str]]:
    """The Redis server for the tests (see the module docstring), checked to answer."""
    with contextlib.ExitStack() as stack:
        parts = urlsplit(default)
        host, port = parts.hostname or "127.0.0.1", parts.port or 6379
        if url := env.get(REDIS_VAR):
            server = Server(url, f"from {REDIS_VAR}")
        elif not throwaway_forced(env) and answers(host, port):
            server = Server(default, "found on the default address")
        elif bindir := find(("redis-server",), search_dirs(env)):
            server = stack.enter_context(throwaway_redis(bindir))
        else:
            missing = missing_binaries(env, host, port, "redis-server")
            raise Unavailable(f"Redis is needed: {missing}; {REDIS_INSTALL}")
        _check_redis(server)
        yield server


def throwaway_forced(env: Mapping[str, str]) -> bool:
    """Whether `DEADLINES_TEST_SERVERS=throwaway` asks for throwaway servers."""
    mode = env.get(MODE_VAR, "")
    if mode not in ("", "throwaway"):
        raise Unavailable(f"{MODE_VAR} may only be 'throwaway' (or unset), not {mode!r}")
    return mode == "throwaway"


def missing_binaries(env: Mapping[str, str], host: str, port: int, binaries: str) -> str:
    """Why a throwaway server was wanted and could not be had, for the one-line failure."""
    wanted = (
        f"{MODE_VAR}=throwaway" if throwaway_forced(env) else f"nothing answers on {host}:{port}"
    )
    where = BIN_VAR if BIN_VAR in env else "/usr/lib/postgresql/*/bin, Homebrew's opt/ or PATH"
    return f"{wanted} and no {binaries} was found in {where}"


def search_dirs(env: Mapping[str, str]) -> list[Path]:
    """Where the server binaries are looked for, first match wins."""
    if BIN_VAR in env:
        return [Path(d) for d in env[BIN_VAR].split(os.pathsep) if d]
    newest = [d for pattern in PG_DIRS for d in sorted(glob.glob(pattern), key=_version)[::-1]]
    path = env.get("PATH", os.defpath).split(os.pathsep)
    return [Path(d) for d in [*newest, *path] if d]


def find(names: Sequence[str], dirs: Sequence[Path]) -> Path | None:
    """The first directory that holds all of `names` as executables."""
    for d in dirs:
        if all(os.access(d / name, os.X_OK) and (d / name).is_file() for name in names):
            return d
    return None


def answers(host: str, port: int) -> bool:
    """Whether something accepts a TCP connection at host:port (within a second)."""
    try:
        socket.create_connection((host, port), timeout=1.0).close()
    except OSError:
        return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def alive(pid: int) -> bool:
    """Whether process `pid` still runs (a zombie has exited: it no longer counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    with contextlib.suppress(OSError, IndexError):
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return True


def one_line(exc: BaseException) -> str:
    """An error's message on one line (libpq's span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


@contextmanager
def throwaway_postgres(bindir: Path) -> Iterator[Server[Postgres]]:
    """A fresh cluster in a temporary directory on a free loopback port, for the block.

    `postgres` runs as our child (not daemonized by `pg_ctl`), so that it is stopped by
    its PID and reaped by us, never left to an init that may not reap it.
    """
    owner = _postgres_owner()
    with contextlib.ExitStack() as stack:
        tmp = Path(tempfile.mkdtemp(prefix="deadlines-pg-"))
        stack.callback(shutil.rmtree, tmp)
        if owner:
            os.chown(tmp, owner["user"], owner["group"])
        data, log = tmp / "data", tmp / "postgres.log"
        initdb: list[str | Path] = [bindir / "initdb", "-D", data, "-U", "postgres", "-A", "trust"]
        _run([*initdb, "-E", "UTF8", "--locale=C", "--no-sync"], tmp, owner)
        address = Postgres(port=free_port(), dbname="postgres")
        with log.open("wb") as out:
            # -F: no fsync; -k: the Unix socket in our directory, removed with it;
            # cluster_name: `ps` shows whose backends these are.
            command: list[str | Path] = [bindir / "postgres", "-D", data, "-F", "-k", tmp]
            command += ["-c", "cluster_name=deadlines-test"]
            command += ["-h", address.host, "-p", str(address.port)]
            process = subprocess.Popen(
                command, cwd=tmp, stdin=subprocess.DEVNULL, stdout=out, stderr=out, **owner
            )
        stack.callback(_stop, process, signal.SIGINT)  # fast shutdown
        _wait_postgres(address, process, log)
        _create_database(address, "test")
        yield Server(dataclasses.replace(address, dbname="test"), "throwaway", process.pid, tmp)


@contextmanager
def throwaway_redis(bindir: Path) -> Iterator[Server[str]]:
    """A redis-server with no persistence on a free loopback port, for the block."""
    with contextlib.ExitStack() as stack:
        tmp = Path(tempfile.mkdtemp(prefix="deadlines-redis-"))
        stack.callback(shutil.rmtree, tmp)
        port, log = free_port(), tmp / "redis.log"
        command: list[str | Path] = [bindir / "redis-server", "--bind", "127.0.0.1"]
        command += ["--port", str(port)]
        command += ["--save", "", "--appendonly", "no", "--dir", tmp, "--logfile", log]
        process = subprocess.Popen(
            command,
            cwd=tmp,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        stack.callback(_stop, process, signal.SIGTERM)
        url = f"redis://127.0.0.1:{port}/9"
        _wait_redis(url, process, log)
        yield Server(url, "throwaway", process.pid, tmp)


def _postgres_owner() -> dict[str, Any]:
    """Popen arguments that drop root, which PostgreSQL refuses to run as."""
    if os.geteuid() != 0:
        return {}
    import pwd

    try:
        account = pwd.getpwnam("postgres")
    except KeyError:
        raise Unavailable(
            "PostgreSQL will not run as root and there is no 'postgres' user to run a throwaway"
            f" cluster as: run the tests as another user or set {PG_VAR}"
        ) from None
    return {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}


def _run(command: Sequence[str | Path], cwd: Path, owner: dict[str, Any]) -> None:
    done = subprocess.run(
        [str(part) for part in command],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=STARTUP,
        check=False,
        **owner,
    )
    if done.returncode:
        said = (done.stderr or done.stdout).strip().splitlines() or ["(no output)"]
        name = Path(command[0]).name
        raise Unavailable(f"the throwaway PostgreSQL: {name} exited {done.returncode}: {said[-1]}")


def _wait_postgres(address: Postgres, process: subprocess.Popen[bytes], log: Path) -> None:
    import psycopg

    end = time.monotonic() + STARTUP
    while True:
        _check_started("PostgreSQL", process, log, end)
        try:
            psycopg.connect(address.dsn, connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            time.sleep(0.05)


def _wait_redis(url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    import redis as redis_client

    end = time.monotonic() + STARTUP
    while True:
        _check_started("Redis", process, log, end)
        client = redis_client.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        try:
            client.ping()
            return
        except redis_client.exceptions.ConnectionError:
            time.sleep(0.05)
        finally:
            client.close()


def _check_started(name: str, process: subprocess.Popen[bytes], log: Path, end: float) -> None:
    if process.poll() is None and time.monotonic() < end:
        return
    said = log.read_text(errors="replace").strip().splitlines() or ["(empty log)"]
    state = f"exited {process.returncode}" if process.returncode is not None else "is not ready"
    raise Unavailable(f"the throwaway {name} {state}: {said[-1]}")


def _create_database(address: Postgres, name: str) -> None:
    import psycopg

    with psycopg.connect(address.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')


def _stop(process: subprocess.Popen[bytes], sig: int) -> None:
    """Stop a server we started, by its PID; kill it if it has not gone in 30 s."""
    if process.poll() is None:
        process.send_signal(sig)
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def _check_postgres(server: Server[Postgres]) -> None:
    import psycopg

    try:
        psycopg.connect(server.address.dsn, connect_timeout=5).close()
    except psycopg.Error as exc:
        raise Unavailable(
            f"PostgreSQL {server.address} ({server.source}) does not answer: {one_line(exc)}"
        ) from None


def _check_redis(server: Server[str]) -> None:
    import redis as redis_client

    client = redis_client.Redis.from_url(server.address, socket_timeout=5, socket_connect_timeout=5)
    try:
        client.ping()
    except redis_client.exceptions.RedisError as exc:
        raise Unavailable(
            f"Redis {_netloc(server.address)} ({server.source}) does not answer: {one_line(exc)}"
        ) from None
    finally:
        client.close()


def _netloc(url: str) -> str:
    """host:port of a URL, without the credentials."""
    return urlsplit(url).netloc.rpartition("@")[2]


def _version(path: str) -> list[int]:
    return [int(n) for n in re.findall(r"\d+", path)]


# The session fixtures (this module is a pytest plugin: tests/conftest.py loads it).

USED = pytest.StashKey[list[tuple[str, Server[Any]]]]()


@contextmanager
def _serving(
    config: pytest.Config, name: str, chosen: AbstractContextManager[Server[A]]
) -> Iterator[A]:
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(chosen)
        except Unavailable as exc:
            failure = str(exc)
        else:
            config.stash.setdefault(USED, []).append((name, server))
            yield server.address
            return
        pytest.fail(failure, pytrace=False)  # outside `except`: no chained report


@pytest.fixture(scope="session")
def pg_server(request: pytest.FixtureRequest) -> Iterator[Postgres]:
    """The PostgreSQL server of this test session; fails in one line when there is none."""
    with _serving(request.config, "PostgreSQL", postgres()) as address:
        yield address


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> Iterator[str]:
    """The Redis URL of this test session; fails in one line when there is none."""
    with _serving(request.config, "Redis", redis()) as url:
        yield url


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    """Say which servers the session used (after they were stopped)."""
    for name, server in config.stash.get(USED, []):
        terminalreporter.write_line(server.describe(name))
