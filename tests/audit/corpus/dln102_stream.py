"""DLN102: a read timeout on a streamed body taken for a limit on the whole body."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import requests
import urllib3

import deadlines


def download(url: str, path: str) -> None:
    with requests.get(url, stream=True, timeout=10) as response:  # expect: DLN102
        response.raise_for_status()
        with open(path, "wb") as out:
            for chunk in response.iter_content(chunk_size=65536):
                out.write(chunk)


def download_within(url: str, path: str, budget: float = 30.0) -> None:
    give_up_at = time.monotonic() + budget
    with requests.get(url, stream=True, timeout=(3, 10)) as response, open(path, "wb") as out:
        for chunk in response.iter_content(chunk_size=65536):
            if time.monotonic() > give_up_at:
                raise TimeoutError(f"download of {url} took more than {budget} s")
            out.write(chunk)


def events_under_a_deadline(url: str) -> Iterator[bytes]:
    with requests.get(url, stream=True, timeout=5) as response:
        for line in response.iter_lines():
            deadlines.check()
            yield line


def events_handed_back(session: requests.Session, url: str) -> Iterator[Any]:
    response = session.get(url, stream=True, timeout=5)  # expect: DLN102
    return response.iter_lines()


def whole_body(url: str) -> bytes:
    return requests.get(url, timeout=5).content


def urllib3_stream(http: urllib3.PoolManager, url: str) -> int:
    response = http.request(  # expect: DLN102
        "GET", url, preload_content=False, timeout=urllib3.Timeout(connect=1, read=5)
    )
    size = 0
    for chunk in response.stream(4096):
        size += len(chunk)
    return size
