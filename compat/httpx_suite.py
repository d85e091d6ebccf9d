"""httpx's own client tests, run with deadlines' clients in place of httpx's.

    pip install trustme chardet                       # what httpx's tests import
    python compat/httpx_suite.py                      # httpx, the version installed
    python compat/httpx_suite.py --library httpx2     # the same over httpx2
    python compat/httpx_suite.py --keep /tmp/suite    # keep the unpacked sdist

Run by hand, not in CI. It downloads the installed httpx's sdist with pip (the tests
ship only there; httpx2's sdist has none, so for httpx2 httpx's tests are run with
their imports turned to httpx2 and httpcore2) and runs its client tests
(``tests/client``, ``tests/test_timeouts.py``) twice: as they are, and with the
library's ``Client`` and ``AsyncClient`` replaced by deadlines' on a default
`Dependency`. A test that fails with ours and passes with theirs is a difference: each
expected one is listed in `DIFFERENCES` with its reason (docs/outbound.md lists them
too). It exits 1 when a difference is not listed there, or a listed one passes now.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

from _suite import compare, run, sdist

TESTS = ["tests/client", "tests/test_timeouts.py"]

#: Tests that fail with deadlines' clients and pass with httpx's, by what they check.
#: Keys are test ids without their parameters; the reason is the documented difference.
DIFFERENCES = {
    # Every request carries x-request-timeout-ms: tests comparing all request headers.
    "tests/client/test_headers.py::test_client_header": "x-request-timeout-ms is sent",
    "tests/client/test_headers.py::test_header_merge": "x-request-timeout-ms is sent",
    "tests/client/test_headers.py::test_header_merge_conflicting_headers": (
        "x-request-timeout-ms is sent"
    ),
    "tests/client/test_headers.py::test_header_update": "x-request-timeout-ms is sent",
    "tests/client/test_headers.py::test_remove_default_header": "x-request-timeout-ms is sent",
    "tests/client/test_headers.py::test_host_with_auth_and_port_in_url": (
        "x-request-timeout-ms is sent"
    ),
    "tests/client/test_headers.py::test_host_with_non_default_port_in_url": (
        "x-request-timeout-ms is sent"
    ),
    "tests/client/test_client.py::test_raw_client_header": "x-request-timeout-ms is sent",
    "tests/client/test_event_hooks.py::test_event_hooks": "x-request-timeout-ms is sent",
    "tests/client/test_event_hooks.py::test_event_hooks_with_redirect": (
        "x-request-timeout-ms is sent"
    ),
    "tests/client/test_event_hooks.py::test_async_event_hooks": "x-request-timeout-ms is sent",
    "tests/client/test_event_hooks.py::test_async_event_hooks_with_redirect": (
        "x-request-timeout-ms is sent"
    ),
    # Tests reading httpx's transport internals (transport._pool._proxy_url) or
    # expecting the very transport object mounted: ours, or the user's wrapped.
    "tests/client/test_proxies.py::test_transport_for_request": (
        "the transport is deadlines', not httpx.HTTPTransport"
    ),
    "tests/client/test_proxies.py::test_proxies_environ": (
        "the transport is deadlines', not httpx.HTTPTransport"
    ),
    "tests/client/test_proxies.py::test_socks_proxy": (
        "the transport is deadlines', not httpx.HTTPTransport"
    ),
    "tests/client/test_proxies.py::test_proxy_with_mounts": (
        "a mounted transport of the user's is wrapped (AsyncBounded)"
    ),
}


def _to_httpx2(tests: Path) -> None:
    """Point httpx's tests at httpx2 and httpcore2 (the same API, renamed)."""
    for path in tests.rglob("*.py"):
        text = path.read_text()
        text = re.sub(r"^import httpx$", "import httpx2 as httpx", text, flags=re.M)
        text = re.sub(r"^import httpcore$", "import httpcore2 as httpcore", text, flags=re.M)
        text = re.sub(r"^from httpx(\S*) import", r"from httpx2\1 import", text, flags=re.M)
        path.write_text(text)


def _plugin(library: str) -> str:
    """A pytest plugin putting deadlines' clients in the library's place."""
    package = "deadlines.httpx" if library == "httpx" else "deadlines.httpx2"
    return f'''"""Replace {library}'s clients by {package}'s, on a default Dependency."""
import {library}
import {package} as ours
import deadlines

DEPENDENCY = deadlines.Dependency("suite")


class Client(ours.Client):
    def __init__(self, **kwargs):
        super().__init__(DEPENDENCY, **kwargs)


class AsyncClient(ours.AsyncClient):
    def __init__(self, **kwargs):
        super().__init__(DEPENDENCY, **kwargs)


{library}.Client = Client
{library}.AsyncClient = AsyncClient
'''


def main(argv: list[str] | None = None) -> int:
    """Run both ways, print the differences, and check them against `DIFFERENCES`."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--library", choices=["httpx", "httpx2"], default="httpx")
    parser.add_argument("--keep", type=Path, help="unpack here and keep it")
    args = parser.parse_args(argv)
    for module in ("trustme", "chardet"):
        try:
            __import__(module)
        except ImportError:
            print(f"httpx's tests need {module}: pip install trustme chardet", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory() as temporary:
        where = args.keep or Path(temporary)
        where.mkdir(parents=True, exist_ok=True)
        folder = sdist("httpx", where)
        if args.library == "httpx2":
            _to_httpx2(folder / "tests")
        (folder / "deadlines_substitute.py").write_text(_plugin(args.library))
        theirs = run(folder, TESTS, None, where / "theirs.xml")
        ours = run(folder, TESTS, "deadlines_substitute", where / "ours.xml")
    result = compare(theirs, ours, DIFFERENCES)
    failing, both = len(result.failing), len(result.both)
    print(f"{args.library} {version(args.library)}: {len(ours)} tests, {failing} fail with"
          f" deadlines' clients; {both} of them fail with httpx's own too")  # fmt: skip
    for line in result.lines:
        print(line)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
