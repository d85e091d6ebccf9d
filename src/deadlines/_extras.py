"""The one error every integration raises when the library its extra installs is missing."""

from __future__ import annotations


def missing(what: str, library: str, extra: str) -> ImportError:
    """The `ImportError` saying that `what` needs `library`, installed by ``deadlines[extra]``.

    try:
        import asyncpg
    except ImportError as exc:
        raise missing("deadlines.asyncpg", "asyncpg", "asyncpg") from exc
    """
    return ImportError(
        f"{what} needs {library}: install it with `pip install 'deadlines[{extra}]'`"
    )
