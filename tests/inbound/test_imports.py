"""The ASGI and WSGI middlewares import only the standard library.

Each integration's message when its library is missing: tests/core/test_extras.py.
"""

from __future__ import annotations

import subprocess
import sys

import pytest


def run(code: str) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)


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
