"""deadlines: one time budget for every hop.

Bound every wait, carry one deadline across every hop as time remaining, stop the
work when nobody is waiting any more, and show where the time went.

    import deadlines

    async with deadlines.scope(2.0):            # the request's budget
        left = deadlines.remaining()            # seconds left, shrinking
        ...                                     # cancelled at the instant

Core needs only the standard library; integrations live in their own modules
(`deadlines.httpx`, `deadlines.asgi`, ...) and are installed through extras.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version

from ._budget import CallBudget
from ._deadline import Deadline
from ._dependency import IDEMPOTENT_METHODS, Dependency, Retry
from ._errors import (
    BudgetExhausted,
    CallerLeft,
    CallTimeout,
    ConnectTimeout,
    DeadlineExceeded,
    DeadlinesError,
    FirstItemTimeout,
    HeadersTimeout,
    IdleTimeout,
    Phase,
    PoolTimeout,
    StreamIdleTimeout,
    TotalTimeout,
)
from ._events import (
    CallFinished,
    CallStarted,
    Event,
    JobDropped,
    Observer,
    RequestFinished,
    RequestStarted,
    observe,
)
from ._scope import carry, check, current, remaining, scope

try:
    __version__ = _version("deadlines")
except _PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "IDEMPOTENT_METHODS",
    "BudgetExhausted",
    "CallBudget",
    "CallFinished",
    "CallStarted",
    "CallTimeout",
    "CallerLeft",
    "ConnectTimeout",
    "Deadline",
    "DeadlineExceeded",
    "DeadlinesError",
    "Dependency",
    "Event",
    "FirstItemTimeout",
    "HeadersTimeout",
    "IdleTimeout",
    "JobDropped",
    "Observer",
    "Phase",
    "PoolTimeout",
    "RequestFinished",
    "RequestStarted",
    "Retry",
    "StreamIdleTimeout",
    "TotalTimeout",
    "__version__",
    "carry",
    "check",
    "current",
    "observe",
    "remaining",
    "scope",
]
