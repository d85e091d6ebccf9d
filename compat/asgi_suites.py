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
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

from _suite import compare, run, sdist

LIBRARIES = ["starlette", "fastapi"]
#: A test module that cannot import (an optional package missing) fails alone.
EVEN_IF = ("--continue-on-collection-errors",)

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


def _compare(library: str, theirs: dict[str, str], ours: dict[str, str]) -> bool:
    """Print the summary and the differences; whether they are all listed, none stale."""
    result = compare(theirs, ours, DIFFERENCES)
    failed_as_is = sum(outcome == "failed" for outcome in theirs.values())
    failing, differ = len(result.failing), len(result.differences)
    print(f"{library} {version(library)}: {len(ours)} tests, {failed_as_is} fail as they are,"
          f" {failing} with DeadlineMiddleware; {differ} differ")  # fmt: skip
    for line in result.lines:
        print(line)
    return result.ok


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
            folder = sdist(library, into)
            (folder / "deadlines_asgi_substitute.py").write_text(PLUGIN)
            theirs = run(folder, ["tests"], None, into / "theirs.xml", *EVEN_IF)
            ours = run(folder, ["tests"], "deadlines_asgi_substitute", into / "ours.xml", *EVEN_IF)
            ok = _compare(library, theirs, ours) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
