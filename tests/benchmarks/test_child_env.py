"""`harness.child_env`: every benchmark child starts with malloc in its steady state."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from harness import MALLOC_TUNABLES, child_env

# How many more blocks malloc holds as their own mappings while a bytes object of
# asyncio's read size (256 KiB) is alive.
_PROBE = """
import ctypes
class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
        "uordblks", "fordblks", "keepcost")]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Info
before = libc.mallinfo2().hblks
buffer = bytes(256 * 1024)
print(libc.mallinfo2().hblks - before)
"""


def test_the_callers_tunables_are_kept_after_ours() -> None:
    env = child_env({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2", "HOME": "/x"})
    assert env["GLIBC_TUNABLES"] == f"{MALLOC_TUNABLES}:glibc.malloc.arena_max=2"
    assert env["HOME"] == "/x"
    assert env["PYTHONUNBUFFERED"] == "1"
    assert child_env({})["GLIBC_TUNABLES"] == MALLOC_TUNABLES


def _mapped_blocks(env: dict[str, str]) -> int:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True
    )
    return int(out.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="a glibc setting")
def test_a_read_buffer_comes_from_the_heap_in_a_child() -> None:
    """Plain, glibc maps a 256 KiB block on its own (an mmap per read, until a read
    comes back empty); in a benchmark child it takes it from the heap."""
    plain = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    assert _mapped_blocks(plain) == 1
    assert _mapped_blocks(child_env(plain)) == 0
