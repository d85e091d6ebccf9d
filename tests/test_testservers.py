"""tests/testservers.py: which servers the tests use, and throwaway ones that leave nothing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

import testservers
from testservers import Postgres, Unavailable

TESTS = Path(__file__).parent
MACHINE = (("127.0.0.1", 5432), ("127.0.0.1", 6379))


def clean_env(**given: str) -> dict[str, str]:
    """This process's environment without any DEADLINES_TEST_* setting, plus `given`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DEADLINES_TEST_")}
    return {**env, **given}


def tree(pid: int) -> set[int]:
    """`pid` and every process below it."""
    listing = subprocess.run(["ps", "-A", "-o", "pid=,ppid="], capture_output=True, text=True)
    children: dict[int, list[int]] = {}
    for line in listing.stdout.splitlines():
        child, parent = map(int, line.split())
        children.setdefault(parent, []).append(child)
    found, todo = set(), [pid]
    while todo:
        found.add(todo[-1])
        todo.extend(children.get(todo.pop(), []))
    return found


@pytest.fixture
def machine_servers() -> Iterator[None]:
    """The machine's own servers answer after the test exactly as they did before."""
    before = [testservers.answers(*address) for address in MACHINE]
    yield
    assert [testservers.answers(*address) for address in MACHINE] == before


@pytest.mark.postgres
@pytest.mark.redis
def test_nothing_on_the_default_address_starts_throwaways_that_leave_nothing(
    machine_servers: None,
) -> None:
    """With nothing on the default addresses, throwaway servers start, serve as promised
    (user postgres, database test, no persistence) and are gone afterwards."""
    nobody = Postgres(port=testservers.free_port())
    env = clean_env()
    with (
        testservers.postgres(env, default=nobody) as pg,
        testservers.redis(env, default=f"redis://127.0.0.1:{testservers.free_port()}/9") as rd,
    ):
        assert pg.source == rd.source == "throwaway"
        assert pg.pid and pg.dir and rd.pid and rd.dir
        processes = tree(pg.pid) | tree(rd.pid)
        assert len(tree(pg.pid)) > 1  # the postmaster and its helpers
        with psycopg.connect(pg.address.dsn) as conn:
            row = conn.execute(
                "SELECT current_user, current_database(), inet_server_port(), "
                "current_setting('data_directory')"
            ).fetchone()
        assert row == ("postgres", "test", pg.address.port, str(pg.dir / "data"))
        client = redis.Redis.from_url(rd.address)
        assert client.config_get("save") == {"save": ""}
        assert client.config_get("appendonly") == {"appendonly": "no"}
        assert client.config_get("dir") == {"dir": str(rd.dir.resolve())}
        client.close()
    assert [pid for pid in processes if testservers.alive(pid)] == []
    assert not pg.dir.exists() and not rd.dir.exists()
    assert not testservers.answers("127.0.0.1", pg.address.port)
    assert not testservers.answers("127.0.0.1", int(rd.address.split(":")[2].split("/")[0]))
    assert pg.describe("PostgreSQL").endswith("stopped and removed")


@pytest.mark.postgres
@pytest.mark.redis
def test_an_explicit_dsn_and_url_win_even_over_the_switch(
    pg_server: Postgres, redis_url: str, tmp_path: Path
) -> None:
    """DEADLINES_TEST_PG / _REDIS are used as given: nothing is started (no binaries here)."""
    env = clean_env(
        DEADLINES_TEST_PG=pg_server.dsn,
        DEADLINES_TEST_REDIS=redis_url,
        DEADLINES_TEST_SERVERS="throwaway",
        DEADLINES_TEST_BINPATH=str(tmp_path),
    )
    with testservers.postgres(env) as pg, testservers.redis(env) as rd:
        assert (pg.address, pg.source, pg.pid) == (pg_server, "from DEADLINES_TEST_PG", None)
        assert (rd.address, rd.source, rd.pid) == (redis_url, "from DEADLINES_TEST_REDIS", None)


def test_a_dsn_in_url_form_keeps_its_parts() -> None:
    """A URL DSN gives host, port, user, password and database; missing parts are ours."""
    pg = Postgres.from_dsn("postgresql://app:s%40cret@db.internal:6543/shop")
    assert pg == Postgres("db.internal", 6543, "app", "shop", "s@cret")
    assert pg.url("postgresql+asyncpg") == "postgresql+asyncpg://app:s%40cret@db.internal:6543/shop"
    assert Postgres.from_dsn("port=6000") == Postgres(port=6000)


def test_an_explicit_server_that_does_not_answer_fails_in_one_line() -> None:
    """A DSN or URL naming a dead address fails with one line saying which and why."""
    port = testservers.free_port()
    env = clean_env(
        DEADLINES_TEST_PG=f"host=127.0.0.1 port={port} user=postgres dbname=test",
        DEADLINES_TEST_REDIS=f"redis://127.0.0.1:{port}/9",
    )
    with pytest.raises(Unavailable) as pg, testservers.postgres(env):
        pass
    with pytest.raises(Unavailable) as rd, testservers.redis(env):
        pass
    for info, name in ((pg, "PostgreSQL"), (rd, "Redis")):
        message = str(info.value)
        assert "\n" not in message
        assert message.startswith(f"{name} 127.0.0.1:{port}")
        assert "DEADLINES_TEST_" in message and "does not answer" in message


def test_missing_binaries_fail_in_one_line_naming_the_packages(tmp_path: Path) -> None:
    """No server and no binaries: one line with the Debian and Homebrew packages."""
    forced = clean_env(DEADLINES_TEST_SERVERS="throwaway", DEADLINES_TEST_BINPATH=str(tmp_path))
    with pytest.raises(Unavailable) as pg, testservers.postgres(forced):
        pass
    with pytest.raises(Unavailable) as rd, testservers.redis(forced):
        pass
    assert str(pg.value) == (
        "PostgreSQL is needed: DEADLINES_TEST_SERVERS=throwaway and no initdb/postgres was found"
        " in DEADLINES_TEST_BINPATH; install PostgreSQL (Debian: apt install postgresql;"
        " Homebrew: brew install postgresql@17) or set DEADLINES_TEST_PG to a DSN"
    )
    assert str(rd.value) == (
        "Redis is needed: DEADLINES_TEST_SERVERS=throwaway and no redis-server was found in"
        " DEADLINES_TEST_BINPATH; install Redis (Debian: apt install redis-server;"
        " Homebrew: brew install redis) or set DEADLINES_TEST_REDIS to a URL"
    )
    port = testservers.free_port()
    unforced = clean_env(DEADLINES_TEST_BINPATH=str(tmp_path))
    expected = f"nothing answers on 127.0.0.1:{port} and no initdb"
    with (
        pytest.raises(Unavailable, match=expected),
        testservers.postgres(unforced, default=Postgres(port=port)),
    ):
        pass


def test_an_unknown_switch_value_is_refused() -> None:
    """DEADLINES_TEST_SERVERS takes 'throwaway' only: a typo is not taken for the default."""
    with pytest.raises(Unavailable, match="may only be 'throwaway' \\(or unset\\), not 'yes'"):
        testservers.throwaway_forced({"DEADLINES_TEST_SERVERS": "yes"})


SESSION = """
import tempfile

import psycopg
import redis


def test_postgres(pg_server):
    with psycopg.connect(pg_server.dsn) as conn:
        (where,) = conn.execute("SHOW data_directory").fetchone()
    assert where.startswith(tempfile.gettempdir() + "/deadlines-pg-")


def test_redis(redis_url):
    where = redis.Redis.from_url(redis_url).config_get("dir")["dir"]
    assert where.startswith(tempfile.gettempdir() + "/deadlines-redis-")
"""


def run_session(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """Run a small test session that needs both servers, in its own pytest process."""
    (tmp_path / "test_session.py").write_text(SESSION)
    path = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "testservers", "-p", "no:cacheprovider", "-q"],
        cwd=tmp_path,
        env=clean_env(PYTHONPATH=path, **env),
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.mark.slow
@pytest.mark.postgres
@pytest.mark.redis
def test_a_session_with_the_switch_uses_throwaways_and_leaves_nothing(
    tmp_path: Path, machine_servers: None
) -> None:
    """DEADLINES_TEST_SERVERS=throwaway: the session's tests talk to throwaway servers,
    which are stopped by PID and removed when it ends."""
    run = run_session(tmp_path, DEADLINES_TEST_SERVERS="throwaway")
    assert run.returncode == 0, run.stdout + run.stderr
    line = r"^(\w+) for the tests: .* \(throwaway\), pid (\d+) in (\S+): (.*)$"
    used = re.findall(line, run.stdout, re.M)
    assert sorted(name for name, *_ in used) == ["PostgreSQL", "Redis"], run.stdout
    for _, pid, where, state in used:
        assert state == "stopped and removed"
        assert not testservers.alive(int(pid)) and not Path(where).exists()


@pytest.mark.slow
def test_a_session_without_servers_or_binaries_fails_each_test_in_one_line(
    tmp_path: Path,
) -> None:
    """No server and no binaries: every test that needs one fails (never skips) with the
    one-line message, and no traceback."""
    empty = tmp_path / "no-binaries"
    empty.mkdir()
    run = run_session(
        tmp_path, DEADLINES_TEST_SERVERS="throwaway", DEADLINES_TEST_BINPATH=str(empty)
    )
    assert run.returncode == 1
    assert "2 errors" in run.stdout and "skipped" not in run.stdout
    assert "Traceback" not in run.stdout + run.stderr and "psycopg" not in run.stdout
    for test, name in (("test_postgres", "PostgreSQL"), ("test_redis", "Redis")):
        report = run.stdout.split(f"ERROR at setup of {test} ")[1].split("\n")[1:3]
        assert report[0].startswith(f"{name} is needed: ") and "brew install" in report[0]
        assert report[1].startswith(("___", "===")), report  # the next section: nothing more
