"""The defaults experiment times each call when it ends, not when its row is printed."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from deadlines.lab.defaults import clients as defaults_clients


def test_a_row_waiting_for_a_thread_does_not_count_the_wait(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Rows are printed from worker threads; a row queued behind others keeps its call's time.

    With one worker and three calls of 0.1 s ending together, the last row waits about
    0.4 s for the worker (each row sleeps 0.2 s): that wait is not the call's.
    """

    async def call() -> None:
        await asyncio.sleep(0.1)

    async def close() -> None:
        pass

    async def main() -> None:
        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
        cases: list[dict[str, Any]] = [
            {
                "client": "c",
                "setup": f"s{i}",
                "server": "x",
                "url": "http://127.0.0.1:1/",
                "delay": 0,
            }
            for i in range(3)
        ]
        await asyncio.gather(*(defaults_clients._run_async(c, call, close) for c in cases))

    asyncio.run(main())
    rows = [json.loads(line[5:]) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 3
    for row in rows:
        assert 95 <= row["elapsed_ms"] < 300, row
