"""Rule details that a corpus line cannot show: aliases, suppression forms, selection."""

from __future__ import annotations

import textwrap

import pytest

from deadlines.audit import AuditError, audit_source


def _codes(source: str, **options: object) -> list[tuple[int, str]]:
    findings = audit_source(textwrap.dedent(source), "snippet.py", **options)  # type: ignore[arg-type]
    return [(f.line, f.code) for f in findings]


def test_import_aliases_resolve() -> None:
    """`import requests as rq`, `from urllib import request` and module aliases resolve."""
    source = """
        import requests as rq
        from urllib import request
        import socket as s
        rq.get("u")
        request.urlopen("u")
        s.create_connection(("h", 1))
    """
    assert _codes(source) == [(5, "DLN101"), (6, "DLN101"), (7, "DLN108")]


def test_unrelated_names_are_not_http() -> None:
    """A local object with a `get` method, or a shadowing name, is not an HTTP call."""
    source = """
        import mylib
        requests = {"a": 1}
        requests.get("a")
        mylib.get("u")
    """
    assert _codes(source) == []


def test_noqa_with_code_suppresses_but_bare_noqa_does_not() -> None:
    """`# noqa: DLN101` and prefixes silence the line; bare `# noqa` or other codes do not."""
    source = """
        import requests
        requests.get("u")  # noqa: DLN101
        requests.get("u")  # noqa: E501, DLN1
        requests.get("u")  # NOQA:DLN101
        requests.get("u")  # noqa
        requests.get("u")  # noqa: E501
    """
    assert _codes(source) == [(6, "DLN101"), (7, "DLN101")]


def test_deadlines_ignore_lists_several_codes() -> None:
    """`# deadlines: ignore[A, B] reason` silences both codes on that line only."""
    source = """
        import socket, requests
        requests.get("u"); socket.create_connection(("h", 1))  # deadlines: ignore[DLN101, DLN108] x
        requests.get("u")
    """
    assert _codes(source) == [(4, "DLN101")]


def test_select_and_ignore() -> None:
    """`select` keeps only matching codes; `ignore` drops matching ones (prefixes work)."""
    source = """
        import socket, requests
        requests.get("u")
        socket.create_connection(("h", 1))
    """
    assert _codes(source, select=["DLN108"]) == [(4, "DLN108")]
    assert _codes(source, ignore=["DLN10"]) == []
    assert _codes(source, ignore=["DLN101"]) == [(4, "DLN108")]


def test_syntax_error_is_an_audit_error() -> None:
    """A file that does not parse raises AuditError naming the line."""
    with pytest.raises(AuditError, match=r"snippet.py:1: cannot parse"):
        audit_source("def broken(:\n", "snippet.py")


def test_wait_for_bounds_an_awaited_call() -> None:
    """An awaited call inside asyncio.wait_for is bounded by its cancellation."""
    source = """
        import asyncio, httpx
        async def f(client: httpx.AsyncClient) -> None:
            await asyncio.wait_for(client.get("u", timeout=None), 1)
            await client.get("u", timeout=None)
    """
    assert _codes(source) == [(5, "DLN101")]


def test_sync_scope_does_not_bound_a_blocking_call() -> None:
    """A sync `with deadlines.scope()` cannot interrupt requests: still reported."""
    source = """
        import deadlines, requests
        def f() -> None:
            with deadlines.scope(1.0):
                requests.get("u")
    """
    assert _codes(source) == [(5, "DLN101")]


def test_string_annotations_and_optional_types() -> None:
    """`session: "requests.Session | None"` and Optional[...] annotations are understood."""
    source = """
        from typing import Optional
        import requests
        def f(a: "requests.Session | None", b: Optional[requests.Session]) -> None:
            a.get("u")
            b.post("u")
    """
    assert _codes(source) == [(5, "DLN101"), (6, "DLN101")]


def test_trio_and_anyio_scopes_are_plain_with_blocks() -> None:
    """`with anyio.fail_after(...)` in async code bounds an awaited call."""
    source = """
        import anyio, httpx
        async def f(client: httpx.AsyncClient) -> None:
            with anyio.fail_after(1):
                await client.get("u", timeout=None)
            await client.get("u", timeout=None)
    """
    assert _codes(source) == [(6, "DLN101")]
