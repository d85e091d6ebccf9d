"""Each inbound integration imports only its own library, and says how to get it."""

from __future__ import annotations

import subprocess
import sys

import pytest


def run(code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)


@pytest.mark.parametrize(
    ("module", "blocked", "hint"),
    [
        ("deadlines.aiohttp_web", "aiohttp", "deadlines[aiohttp]"),
        ("deadlines.grpc", "grpc", "deadlines[grpc]"),
        ("deadlines.fastapi", "fastapi", "pip install fastapi"),
    ],
)
def test_missing_library_gives_install_hint(module: str, blocked: str, hint: str) -> None:
    """Without its library, an integration fails to import with an install hint."""
    result = run(f"import sys; sys.modules[{blocked!r}] = None; import {module}")
    assert result.returncode != 0
    assert "ImportError" in result.stderr
    assert hint in result.stderr


@pytest.mark.parametrize("module", ["deadlines.asgi", "deadlines.wsgi"])
def test_asgi_and_wsgi_need_only_the_standard_library(module: str) -> None:
    """The ASGI and WSGI middlewares import nothing outside the standard library."""
    code = (
        "import sys; before = set(sys.modules); import " + module + "; "
        "new = set(sys.modules) - before; std = sys.stdlib_module_names; "
        "print(sorted(m for m in new if m.split('.')[0] not in std and "
        "m.split('.')[0] != 'deadlines'))"
    )
    result = run(code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
