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

from ._admission import Admission, Decision
from ._budget import CallBudget
from ._codel import CoDel
from ._deadline import Deadline
from ._dependency import IDEMPOTENT_METHODS, Dependency, Retry
from ._errors import (
    BudgetExhausted,
    CallerLeft,
    CallRefused,
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
    AttemptRefused,
    CallFinished,
    CallStarted,
    Event,
    GateReason,
    HedgeSent,
    JobDropped,
    LimitChanged,
    Observer,
    RequestFinished,
    RequestRefused,
    RequestStarted,
    observe,
)
from ._gate import Gate, GateRefusal
from ._hedge import Hedge
from ._latency import LatencyEstimate
from ._limit import AdaptiveLimit
from ._retry_budget import RetryBudget
from ._scope import carry, check, current, remaining, scope
from ._throttle import OVERLOAD_STATUSES, Throttle

try:
    __version__ = _version("deadlines")
except _PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0"

__all__ = [
    "IDEMPOTENT_METHODS",
    "OVERLOAD_STATUSES",
    "AdaptiveLimit",
    "Admission",
    "AttemptRefused",
    "BudgetExhausted",
    "CallBudget",
    "CallFinished",
    "CallRefused",
    "CallStarted",
    "CallTimeout",
    "CallerLeft",
    "CoDel",
    "ConnectTimeout",
    "Deadline",
    "DeadlineExceeded",
    "DeadlinesError",
    "Decision",
    "Dependency",
    "Event",
    "FirstItemTimeout",
    "Gate",
    "GateReason",
    "GateRefusal",
    "HeadersTimeout",
    "Hedge",
    "HedgeSent",
    "IdleTimeout",
    "JobDropped",
    "LatencyEstimate",
    "LimitChanged",
    "Observer",
    "Phase",
    "PoolTimeout",
    "RequestFinished",
    "RequestRefused",
    "RequestStarted",
    "Retry",
    "RetryBudget",
    "StreamIdleTimeout",
    "Throttle",
    "TotalTimeout",
    "__version__",
    "carry",
    "check",
    "current",
    "observe",
    "remaining",
    "scope",
]
