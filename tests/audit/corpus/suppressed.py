"""Suppression comments (`# deadlines: ignore[...]`); noqa forms are tested as strings."""

from __future__ import annotations

from typing import Any

import requests


def ours(url: str) -> Any:
    return requests.get(url)  # deadlines: ignore[DLN101] the lab's hung client, on purpose


def ours_bare(url: str) -> Any:
    return requests.get(url)  # deadlines: ignore


def on_the_last_line(url: str) -> Any:
    return requests.get(
        url,
        headers={"accept": "application/json"},
    )  # deadlines: ignore[DLN101] multi-line call: any of its lines counts


def other_code(url: str) -> Any:
    return requests.get(url)  # deadlines: ignore[DLN108]  # expect: DLN101
