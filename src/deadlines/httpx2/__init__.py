"""httpx2 (the httpx fork the openai SDK 3 uses) with every phase of a call bounded.

    import deadlines, deadlines.httpx2

    llm = deadlines.Dependency("llm", connect=1.0, headers=10.0, idle=15.0, total=120.0)

    async with deadlines.httpx2.AsyncClient(llm) as client:
        response = await client.get("http://llm/v1/models")

The same API, behaviour and guarantees as `deadlines.httpx` (see its documentation),
over httpx2 and httpcore2: `AsyncClient`, `Client`, `AsyncTransport`, `Transport`,
`AsyncBounded`, `Bounded`, `POOL_WAIT`. Its errors are also httpx2's own
(``httpx2.ReadTimeout``, ...).

It is not a copy: the implementation is `deadlines.httpx`'s own modules, loaded a
second time as this package's. This package's search path lists its own folder first,
then deadlines/httpx/: every implementation module imports the client library from the
package's ``_lib``, and here ``_lib`` binds httpx2 and httpcore2. The two packages can
be used side by side in one process; each has its own classes.
"""

from __future__ import annotations

import os

# After this folder (which holds `_lib`), deadlines.httpx's: its modules become ours.
__path__.append(os.path.join(os.path.dirname(os.path.dirname(__file__)), "httpx"))

from ._async.bounded import AsyncBounded  # noqa: E402
from ._async.client import AsyncClient  # noqa: E402
from ._async.transport import AsyncTransport  # noqa: E402
from ._messages import POOL_WAIT  # noqa: E402
from ._sync.bounded import Bounded  # noqa: E402
from ._sync.client import Client  # noqa: E402
from ._sync.transport import Transport  # noqa: E402

__all__ = [
    "POOL_WAIT",
    "AsyncBounded",
    "AsyncClient",
    "AsyncTransport",
    "Bounded",
    "Client",
    "Transport",
]
