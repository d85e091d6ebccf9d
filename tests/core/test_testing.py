"""FakeClock: exact time for deadline logic, with an autojumping asyncio loop."""

from __future__ import annotations

import asyncio
import time

import pytest

import deadlines
from deadlines import DeadlineExceeded
from deadlines.testing import FakeClock


def test_thirty_second_timeout_takes_no_time() -> None:
    """A 30 s deadline fires at exactly 30 fake seconds, in real milliseconds."""
    clock = FakeClock(start=0.0)

    async def main() -> None:
        async with deadlines.scope(30):
            await asyncio.sleep(60)

    real = time.monotonic()
    with pytest.raises(DeadlineExceeded) as info:
        clock.run(main())
    assert clock.now() == pytest.approx(30.0)
    assert info.value.elapsed == pytest.approx(30.0)
    assert time.monotonic() - real < 2.0


def test_sleeps_advance_exactly() -> None:
    """Sequential sleeps add up exactly on the fake clock."""
    clock = FakeClock(start=0.0)

    async def main() -> float:
        await asyncio.sleep(1.5)
        await asyncio.gather(asyncio.sleep(2), asyncio.sleep(0.5))
        return asyncio.get_running_loop().time()

    assert clock.run(main()) == pytest.approx(3.5)


def test_real_io_still_works() -> None:
    """A socket round trip completes on the fake loop; the clock does not run away."""
    clock = FakeClock(start=0.0, autojump_threshold=0.5)

    async def main() -> bytes:
        async def echo(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            w.write(await r.readexactly(4))
            await w.drain()
            w.close()

        server = await asyncio.start_server(echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"ping")
        data = await reader.readexactly(4)
        writer.close()
        await writer.wait_closed()
        server.close()
        await server.wait_closed()
        return data

    assert clock.run(main()) == b"ping"
    assert clock.now() < 1.0


def test_install_is_exclusive_and_restores() -> None:
    """Installing twice is an error; uninstalling restores the real clock."""
    clock = FakeClock(start=5.0)
    with clock:
        assert deadlines.Deadline.after(1).instant == 6.0
        with pytest.raises(RuntimeError, match="already installed"):
            clock.install()
    with pytest.raises(RuntimeError, match="not installed"):
        clock.uninstall()
    assert deadlines.Deadline.after(0).instant == pytest.approx(time.monotonic(), abs=1.0)


def test_advance_never_goes_back() -> None:
    """A negative advance is refused."""
    with pytest.raises(ValueError, match=">= 0"):
        FakeClock().advance(-1)
