"""The values that the stores and the dispatcher share: calls, their states, saved results.

Calls are keyed by :class:`CallKey` ``(session_id, turn_id, call_id)``. Their states::

    claimed ──▶ succeeded ─┐
       │    └─▶ failed ────┴─▶ submitted
       │                   └─▶ stale        (the API no longer waits for it)
       └─ lease expired, no saved result ──▶ in doubt (a re-claim returns IN_DOUBT)
    quarantined: an in-doubt side-effect call whose reconcile hook could not decide, held
                 for an operator (with ``hold``) instead of being answered.

This module imports nothing of the package: every other module may depend on it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = [
    "CallKey",
    "CallRecord",
    "CallState",
    "ClaimOutcome",
    "ClaimStatus",
    "DeliveryRecord",
    "SavedResult",
    "StoreStats",
]


class CallState(enum.StrEnum):
    """Where one call is in its life. Terminal: ``submitted``, ``stale``, ``quarantined``."""

    CLAIMED = "claimed"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SUBMITTED = "submitted"
    STALE = "stale"
    QUARANTINED = "quarantined"

    @property
    def terminal(self) -> bool:
        return self in (CallState.SUBMITTED, CallState.STALE, CallState.QUARANTINED)

    @property
    def has_result(self) -> bool:
        return self in (CallState.SUCCEEDED, CallState.FAILED, CallState.SUBMITTED)


@dataclass(frozen=True, slots=True)
class CallKey:
    """Identifies one pending function call: ``(session_id, turn_id, call_id)``."""

    session_id: str
    turn_id: str
    call_id: str

    def __str__(self) -> str:
        return f"{self.session_id}/{self.turn_id}/{self.call_id}"


@dataclass(frozen=True, slots=True)
class SavedResult:
    """A result saved durably before it is submitted.

    ``event_json`` is the exact ``agent.session.input.tool_result`` event (compact JSON) that
    is, and will on every resubmission be, sent; ``idempotency_key`` goes with it so that a
    retry from any replica is byte-for-byte the same request. ``full_output`` keeps a result
    that was too large to send (the event then carries a failure telling the model so).
    ``error_type`` is a low-cardinality reason for failures (``handler_error``, ``timeout``...).
    ``source`` says how the result was obtained: ``ran``, ``reconciled`` or ``worker``.
    """

    success: bool
    event_json: str
    idempotency_key: str
    error_type: str | None = None
    source: str = "ran"
    full_output: str | None = None


@dataclass(frozen=True, slots=True)
class CallRecord:
    """A snapshot of one call as the store holds it.

    ``quarantine_reason`` says why a ``quarantined`` call is held for an operator (what the
    reconcile hook answered); it is None in every other state.
    """

    key: CallKey
    tool_name: str
    state: CallState
    attempt: int
    owner: str | None
    lease_expires_at: float
    created_at: float
    updated_at: float
    delivery_id: str | None = None
    result: SavedResult | None = None
    quarantine_reason: str | None = None


class ClaimStatus(enum.StrEnum):
    """What :meth:`Store.claim_call` decided."""

    CLAIMED = "claimed"  # new call, now ours (attempt 1): run it
    IN_DOUBT = "in_doubt"  # a previous claim expired with no saved result; now ours again
    SAVED = "saved"  # a result is saved but not submitted: (re)submit it, never re-run
    BUSY = "busy"  # another owner holds a live lease: leave it alone
    DONE = "done"  # submitted, stale or quarantined: nothing to do


@dataclass(frozen=True, slots=True)
class ClaimOutcome:
    status: ClaimStatus
    record: CallRecord


@dataclass(frozen=True, slots=True)
class DeliveryRecord:
    """A verified webhook delivery recorded before it was acknowledged."""

    delivery_id: str
    session_id: str
    received_at: float
    resolved: bool = False


@dataclass(frozen=True, slots=True)
class StoreStats:
    """What an operator wants to see (``agentfn-asgi status``)."""

    deliveries: int
    unresolved_deliveries: int
    calls_by_state: dict[str, int] = field(default_factory=dict)
    in_doubt: int = 0
    oldest_pending_at: float | None = None
