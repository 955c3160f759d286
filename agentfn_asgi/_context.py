"""What a handler and a reconcile hook deal in: the call's context, and the three answers a
reconcile hook can give. Exported by :mod:`agentfn_asgi.tools`, their home in the API."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeAlias

__all__ = [
    "NotRun",
    "Ran",
    "ReconcileHook",
    "ReconcileOutcome",
    "ToolContext",
    "Unknown",
    "derive_idempotency_key",
]


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a handler knows about the call it is running. Declare a parameter of this type
    (any name) to receive it; it never appears in the tool's schema.

    ``attempt`` counts executions of this call (1 for the first). ``deadline`` is the Unix
    time by which the dispatcher abandons the handler (None: no timeout). Pass
    ``idempotency_key`` to downstream APIs that support one: it is the same on every attempt,
    replica and restart for this call, which closes the "ran but crashed before saving"
    window. ``resources`` is whatever the host handed to the app (a db pool, settings...).
    """

    session_id: str
    turn_id: str
    call_id: str
    tool_name: str
    attempt: int
    deadline: float | None
    idempotency_key: str
    resources: Any = None

    def remaining(self, *, clock: Callable[[], float] = time.time) -> float | None:
        """Seconds left until ``deadline`` (never negative), or None without a deadline."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - clock())


def derive_idempotency_key(session_id: str, turn_id: str, call_id: str) -> str:
    """The stable idempotency key of one call: ``"afn_"`` + the first 40 hex digits of
    SHA-256 over ``session_id``, ``turn_id`` and ``call_id`` joined with ``"\\x1f"``.

    The unit separator cannot occur in the API's ids, so distinct triples never collide by
    concatenation. 160 bits keep collisions negligible while fitting the 64-character limits
    common in payment and messaging APIs.
    """
    digest = hashlib.sha256("\x1f".join((session_id, turn_id, call_id)).encode()).hexdigest()
    return "afn_" + digest[:40]


@dataclass(frozen=True, slots=True)
class Ran:
    """Reconcile outcome: the call's side effect already happened; ``result`` is sent as its
    output (encoded like a handler's return value)."""

    result: Any


@dataclass(frozen=True, slots=True)
class NotRun:
    """Reconcile outcome: the side effect did not happen, so the handler may run now."""


@dataclass(frozen=True, slots=True)
class Unknown:
    """Reconcile outcome: it cannot be told whether the side effect happened; the call is
    quarantined by policy instead of being run again."""

    reason: str = ""


ReconcileOutcome: TypeAlias = Ran | NotRun | Unknown
#: ``reconcile(context, arguments)``, sync or async. ``arguments`` are the validated keyword
#: arguments the handler would receive (without the context).
ReconcileHook: TypeAlias = Callable[
    [ToolContext, dict[str, Any]], ReconcileOutcome | Awaitable[ReconcileOutcome]
]
