"""The extras tell the truth: each installs what its module imports, and a missing one is named.

Every integration, run with its library absent (a meta-path finder that refuses it), fails
with the one wording `deadlines._extras.missing` gives, naming the extra that installs it;
and every requirement of every integration extra is one such library.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path
from typing import NamedTuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "deadlines"
EXTRAS: dict[str, list[str]] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
    "optional-dependencies"
]

# Prepended to each case's code: the named top-level modules cannot be imported.
BLOCKER = """\
import sys

class _Absent:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _Absent())
"""


class Case(NamedTuple):
    """Run `code` without the module `blocked`: it must say `what` needs `library`."""

    blocked: str
    code: str
    what: str
    library: str
    extra: str


CASES = {
    "httpx": Case("httpx", "import deadlines.httpx", "deadlines.httpx", "httpx", "httpx"),
    "httpcore": Case("httpcore", "import deadlines.httpx", "deadlines.httpx", "httpx", "httpx"),
    "anyio": Case("anyio", "import deadlines.httpx", "deadlines.httpx", "httpx", "httpx"),
    "httpx2": Case("httpx2", "import deadlines.httpx2", "deadlines.httpx2", "httpx2", "httpx2"),
    "httpcore2": Case(
        "httpcore2", "import deadlines.httpx2", "deadlines.httpx2", "httpx2", "httpx2"
    ),
    "anyio (httpx2)": Case(
        "anyio", "import deadlines.httpx2", "deadlines.httpx2", "httpx2", "httpx2"
    ),
    "aiohttp": Case(
        "aiohttp", "import deadlines.aiohttp", "deadlines.aiohttp", "aiohttp", "aiohttp"
    ),
    "aiohttp.web": Case(
        "aiohttp", "import deadlines.aiohttp_web", "deadlines.aiohttp_web", "aiohttp", "aiohttp"
    ),
    "fastapi": Case(
        "fastapi", "import deadlines.fastapi", "deadlines.fastapi", "FastAPI", "fastapi"
    ),
    "django": Case("django", "import deadlines.django", "deadlines.django", "Django", "django"),
    "grpc": Case("grpc", "import deadlines.grpc", "deadlines.grpc", "grpcio", "grpc"),
    "asyncpg": Case(
        "asyncpg", "import deadlines.asyncpg", "deadlines.asyncpg", "asyncpg", "asyncpg"
    ),
    "psycopg": Case(
        "psycopg", "import deadlines.psycopg", "deadlines.psycopg", "psycopg 3", "psycopg"
    ),
    "pg-audit": Case(
        "psycopg",
        "from deadlines.__main__ import main; sys.exit(main(['pg-audit', 'postgresql://']))",
        "deadlines pg-audit",
        "psycopg",
        "psycopg",
    ),
    "sqlalchemy": Case(
        "sqlalchemy",
        "import deadlines.sqlalchemy",
        "deadlines.sqlalchemy",
        "SQLAlchemy 2",
        "sqlalchemy",
    ),
    "prometheus": Case(
        "prometheus_client",
        "import deadlines.prometheus",
        "deadlines.prometheus",
        "prometheus_client",
        "prometheus",
    ),
    "otel": Case(
        "opentelemetry", "import deadlines.otel", "deadlines.otel", "opentelemetry-api", "otel"
    ),
    "tenacity": Case(
        "tenacity",
        "import deadlines.retry; deadlines.retry.stop_at_deadline()",
        "deadlines.retry",
        "tenacity",
        "retry",
    ),
    "stamina": Case(
        "stamina",
        "import deadlines, deadlines.retry; deadlines.retry.stamina_context(deadlines.Retry())",
        "deadlines.retry",
        "stamina",
        "retry",
    ),
    "celery": Case("celery", "import deadlines.celery", "deadlines.celery", "Celery", "celery"),
    "sim --plot": Case(
        "matplotlib",
        "from deadlines.__main__ import main\n"
        f"sys.exit(main(['sim', {str(ROOT / 'examples/sim/chain.toml')!r}, '--duration', '1s',"
        " '--quiet', '--plot', '/nonexistent/never-written.png']))",
        "deadlines sim: --plot",
        "matplotlib",
        "sim",
    ),
    "lab plots": Case(
        "matplotlib",
        "from deadlines.lab import report; report.pyplot()",
        "deadlines lab",
        "matplotlib",
        "lab",
    ),
}

# Requirements of an integration extra that no import fails without, and why.
NOT_IMPORTED = {
    ("psycopg", "psycopg-pool"): "imported only for a pool the caller passes",
}


def message(case: Case) -> str:
    """The one wording of a missing extra."""
    return (
        f"{case.what} needs {case.library}: install it with `pip install 'deadlines[{case.extra}]'`"
    )


def distribution(requirement: str) -> str:
    """The normalized distribution name of a requirement string."""
    name = re.match(r"[A-Za-z0-9._-]+", requirement)
    assert name is not None, requirement
    return re.sub(r"[-_.]+", "-", name.group()).lower()


def distributions_of(module: str) -> set[str]:
    """The installed distributions that provide top-level `module`, normalized."""
    return {distribution(d) for d in metadata.packages_distributions().get(module, [])}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_a_missing_library_names_the_extra_that_installs_it(case: Case) -> None:
    """Without its library, each integration fails with the one wording, naming its extra."""
    code = BLOCKER.format(blocked={case.blocked}) + case.code
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert message(case) in output, output
    if "Traceback" in output:  # raised, not printed by a command: an ImportError of ours
        assert f"ImportError: {message(case)}" in output


def test_every_integration_extra_installs_only_what_a_module_needs() -> None:
    """Each requirement of an integration extra is a library some module fails without."""
    shown = {
        (case.extra, dist) for case in CASES.values() for dist in distributions_of(case.blocked)
    }
    for extra, requirements in EXTRAS.items():
        if extra in {"lab", "docs", "all", "dev"}:
            continue
        for requirement in requirements:
            key = (extra, distribution(requirement))
            assert key in shown or key in NOT_IMPORTED, f"deadlines[{extra}] installs {requirement}"


def test_every_extra_named_in_an_error_lists_the_library() -> None:
    """The extra an error names exists and installs the library it says is missing."""
    for case in CASES.values():
        listed = {distribution(r) for r in EXTRAS[case.extra]}
        listed |= {  # one level of self-reference: deadlines[lab] includes deadlines[httpx]
            distribution(r)
            for inner in re.findall(r"deadlines\[([^\]]+)\]", " ".join(EXTRAS[case.extra]))
            for name in inner.split(",")
            for r in EXTRAS[name]
        }
        assert distributions_of(case.blocked) & listed, case


def imports_under(path: Path) -> set[str]:
    """The third-party top-level modules that the Python files under `path` import."""
    found: set[str] = set()
    for file in [path] if path.is_file() else path.rglob("*.py"):
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name.partition(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.partition(".")[0])
    return found - set(sys.stdlib_module_names) - {"deadlines"}


def test_the_lab_extra_installs_what_the_lab_imports() -> None:
    """Each library the lab extra lists is imported by the lab, and the reverse."""
    lab = {distribution(r) for r in EXTRAS["lab"] if not r.startswith("deadlines[")}
    imported = set().union(*(distributions_of(m) for m in imports_under(SRC / "lab")))
    assert lab <= imported
    provided = lab | {distribution(r) for name in ("httpx", "aiohttp") for r in EXTRAS[name]}
    optional = {"psycopg"}  # `deadlines lab chain --dsn` only
    assert imported - provided <= optional


def requirements_closure(names: set[str]) -> set[str]:
    """`names` and every distribution they require (any extra of theirs), installed ones."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        todo += [distribution(r) for r in requires]
    return seen


def test_every_library_the_package_imports_comes_with_an_extra() -> None:
    """No module imports a library that no extra installs (directly or through another)."""
    runtime = {
        distribution(r)
        for extra, requirements in EXTRAS.items()
        if extra not in {"all", "dev", "docs"}
        for r in requirements
        if not r.startswith("deadlines[")
    }
    provided = requirements_closure(runtime)
    for module in sorted(imports_under(SRC)):
        assert distributions_of(module) & provided, f"no extra installs {module}"
