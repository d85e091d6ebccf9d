"""deadlines.httpx's house rules: its blocking half generated, its private seams pinned."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import httpcore
import httpx
import pytest

from deadlines.httpx._httpcore import SEAMS
from deadlines.httpx._httpx import SEAMS as HTTPX_SEAMS

ROOT = Path(__file__).resolve().parents[2]


def test_the_blocking_half_is_generated_from_the_async_half() -> None:
    """_sync/ is exactly what scripts/unasync.py makes of _async/ (they have not drifted)."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "unasync.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def _instances() -> dict[str, object]:
    origin = httpcore.Origin(b"http", b"127.0.0.1", 80)
    return {
        "AsyncHTTPConnection": httpcore.AsyncHTTPConnection(origin),
        "HTTPConnection": httpcore.HTTPConnection(origin),
        "AsyncHTTP2Connection": httpcore.AsyncHTTP2Connection(origin, httpcore.AsyncMockStream([])),
        "HTTP2Connection": httpcore.HTTP2Connection(origin, httpcore.MockStream([])),
    }


@pytest.mark.parametrize("name", sorted(SEAMS))
def test_httpcore_private_names_used_are_there(name: str) -> None:
    """Every private httpcore name deadlines.httpx reaches for exists, on a real object."""
    instance = _instances()[name]
    for attribute in SEAMS[name]:
        assert hasattr(instance, attribute), f"httpcore.{name} has no {attribute}"


@pytest.mark.parametrize("client", [httpx.AsyncClient, httpx.Client], ids=lambda c: c.__name__)
@pytest.mark.parametrize("method", sorted(HTTPX_SEAMS))
def test_httpx_private_hooks_overridden_are_there(client: type, method: str) -> None:
    """Each httpx client method deadlines.httpx overrides exists with the parameters it takes."""
    hook = getattr(client, method, None)
    assert hook is not None, f"httpx.{client.__name__} has no {method}"
    parameters = list(inspect.signature(hook).parameters)[1:]  # without self
    assert tuple(parameters) == HTTPX_SEAMS[method], parameters
