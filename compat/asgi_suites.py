"""Starlette's and FastAPI's own tests, run with `DeadlineMiddleware` around every app.

    pip install python-multipart dirty-equals inline-snapshot pytest-xdist   # their tests
    pip install pyjwt "pwdlib[argon2]" a2wsgi           # optional: more of FastAPI's
    python compat/asgi_suites.py                        # Starlette, then FastAPI
    python compat/asgi_suites.py --library fastapi      # one of them
    python compat/asgi_suites.py --keep /tmp/suites     # keep the unpacked sdists

Run by hand, not in CI. For the installed version of each library it downloads the
sdist with pip (both ship their ``tests/``) and runs the whole suite twice: as it is,
and with every ASGI app the tests build wrapped in
``DeadlineMiddleware(app, default=30, maximum=60)``. The seam is a pytest plugin that
patches ``starlette.testclient.TestClient.__init__`` (FastAPI's ``TestClient`` is
Starlette's) and the ``ASGITransport`` of httpx and httpx2: lifespan and websocket
scopes go through the middleware too, which passes them through. A test that fails
with the middleware and passes without is a difference: each expected one is listed in
`DIFFERENCES` with its reason (docs/inbound.md says the same). It exits 1 when a
difference is not listed there, or a listed one passes now.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ElementTree
from importlib.metadata import version
from pathlib import Path

LIBRARIES = ["starlette", "fastapi"]

#: Modules their tests import that neither library depends on (its test dependencies).
NEEDED = {
    "starlette": ["python_multipart"],
    "fastapi": ["python_multipart", "dirty_equals", "inline_snapshot", "xdist"],
}

#: Tests that fail with the middleware and pass without it, by what they check.
#: Keys are test ids without their parameters; the reason is the documented difference.
DIFFERENCES = {
    # The middleware finds the request's route with the framework's own
    # `route.matches(scope)` (the first request on a method and path; then cached), so
    # a route counting its calls to `matches` sees one more.
    "tests/middleware/test_opentelemetry.py::test_instrumentation_uses_actual_route_match_once": (
        "the middleware matches the route too, on a path's first request"
    ),
}

PLUGIN = '''"""Wrap every ASGI app the tests build in deadlines' DeadlineMiddleware."""
import starlette.testclient as testclient

from deadlines.asgi import DeadlineMiddleware


def wrap(app):
    if not testclient._is_asgi3(app):  # ASGI 2: adapted first, as TestClient does
        app = testclient._WrapASGI2(app)
    return DeadlineMiddleware(app, default=30, maximum=60)


def wrapping(init):
    def __init__(self, *args, **kwargs):
        if "app" in kwargs:
            kwargs["app"] = wrap(kwargs["app"])
        else:
            args = (wrap(args[0]), *args[1:])
        init(self, *args, **kwargs)

    return __init__


testclient.TestClient.__init__ = wrapping(testclient.TestClient.__init__)
for name in ("httpx", "httpx2"):
    try:
        transport = __import__(name).ASGITransport
    except ImportError:
        continue
    transport.__init__ = wrapping(transport.__init__)
'''


def _sdist(library: str, into: Path) -> Path:
    """Download and unpack the installed version's source distribution; its folder."""
    wanted = f"{library}=={version(library)}"
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
    subprocess.run([*pip, "--quiet", "--dest", str(into), wanted], check=True)
    (archive,) = into.glob(f"{library}-*.tar.gz")
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    folder = into / archive.name.removesuffix(".tar.gz")
    if not (folder / "tests").is_dir():
        raise SystemExit(f"{archive.name} has no tests/")
    return folder


def _test_id(folder: Path, classname: str, name: str) -> str:
    """``tests/test_x.py::TestY::test_z[...]`` from junit's dotted class name."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        path = "/".join(parts[:cut]) + ".py"
        if (folder / path).is_file():
            return "::".join([path, *parts[cut:], name])
    return f"{classname}::{name}"  # a module that failed to import


def _run(folder: Path, substitute: bool, report: Path) -> dict[str, str]:
    """Run the suite; each test id's outcome: passed, failed or skipped."""
    command = [sys.executable, "-m", "pytest", "tests", "-q", "-o", "addopts="]
    command += ["--junitxml", str(report), "-p", "no:cacheprovider", "-p", "no:randomly"]
    command += ["--continue-on-collection-errors"]
    if substitute:
        command += ["-p", "deadlines_asgi_substitute"]
    path = os.pathsep.join(p for p in (str(folder), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    subprocess.run(command, cwd=folder, env=env, check=False, capture_output=True)
    outcomes = {}
    for case in ElementTree.parse(report).getroot().iter("testcase"):
        name = _test_id(folder, case.get("classname", ""), case.get("name", ""))
        failed = case.find("failure") is not None or case.find("error") is not None
        skipped = case.find("skipped") is not None
        outcomes[name] = "failed" if failed else "skipped" if skipped else "passed"
    return outcomes


def _base(test_id: str) -> str:
    return test_id.split("[", 1)[0]


def _compare(library: str, theirs: dict[str, str], ours: dict[str, str]) -> bool:
    """Print the summary and the differences; whether they are all listed, none stale."""
    failing = sorted(t for t, outcome in ours.items() if outcome == "failed")
    differences = [t for t in failing if theirs.get(t) == "passed"]
    unlisted = [t for t in differences if _base(t) not in DIFFERENCES]
    # A listed difference is stale once all of its tests pass with the middleware.
    stale = sorted(
        base
        for base in DIFFERENCES
        if any(_base(t) == base for t in ours)
        and all(outcome != "failed" for t, outcome in ours.items() if _base(t) == base)
    )
    failed_as_is = sum(outcome == "failed" for outcome in theirs.values())
    print(f"{library} {version(library)}: {len(ours)} tests, {failed_as_is} fail as they are,"
          f" {len(failing)} with DeadlineMiddleware; {len(differences)} differ")  # fmt: skip
    for test in differences:
        print(f"  {test}: {DIFFERENCES.get(_base(test), 'NOT A DOCUMENTED DIFFERENCE')}")
    for test in stale:
        print(f"  {test}: listed as a difference, but passes now")
    return not unlisted and not stale


def main(argv: list[str] | None = None) -> int:
    """Run each library's suite both ways and check the differences against `DIFFERENCES`."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--library", choices=LIBRARIES, action="append")
    parser.add_argument("--keep", type=Path, help="unpack here and keep it")
    args = parser.parse_args(argv)
    libraries: list[str] = args.library or LIBRARIES
    for library in libraries:
        for module in NEEDED[library]:
            try:
                __import__(module)
            except ImportError:
                print(f"{library}'s tests need {module}: see the docstring", file=sys.stderr)
                return 2
    ok = True
    with tempfile.TemporaryDirectory() as temporary:
        where: Path = args.keep or Path(temporary)
        for library in libraries:
            into = where / library
            into.mkdir(parents=True, exist_ok=True)
            folder = _sdist(library, into)
            (folder / "deadlines_asgi_substitute.py").write_text(PLUGIN)
            theirs = _run(folder, substitute=False, report=into / "theirs.xml")
            ours = _run(folder, substitute=True, report=into / "ours.xml")
            ok = _compare(library, theirs, ours) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
