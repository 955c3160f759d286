"""The store protocol: the only place where durability and cross-replica atomicity live.

Every backend (``memory://``, ``sqlite:///``, ``redis://``, ``postgresql://``) implements
:class:`Store`. Each method is one atomic step *inside the store* (a unique constraint, a
conditional update, a Lua script, a row lock); no method may read and then write from Python
with a gap another replica could fall into.

Calls are keyed by :class:`CallKey` ``(session_id, turn_id, call_id)``. Their states::

    claimed ──▶ succeeded ─┐
       │    └─▶ failed ────┴─▶ submitted
       │                   └─▶ stale        (the API no longer waits for it)
       └─ lease expired, no saved result ──▶ in doubt (a re-claim returns IN_DOUBT)
    quarantined: an in-doubt side-effect call whose reconcile hook could not decide, held
                 for an operator (with ``hold``) instead of being answered.

Time comes from the store's injected ``clock`` (Unix seconds, ``time.time`` by default), so
leases are comparable across replicas that share the store.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = [
    "CallKey",
    "CallRecord",
    "CallState",
    "ClaimOutcome",
    "ClaimStatus",
    "DeliveryRecord",
    "SavedResult",
    "Store",
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
    """A snapshot of one call as the store holds it."""

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


@runtime_checkable
class Store(Protocol):
    """Durable, atomic storage of deliveries and calls. See the module docstring."""

    # -- lifecycle -------------------------------------------------------------------------
    async def open(self) -> None:
        """Connect and create the schema if needed. Idempotent."""

    async def close(self) -> None:
        """Release connections. Idempotent."""

    async def ping(self) -> None:
        """Raise :class:`StoreUnavailableError` when the store cannot be used right now."""

    # -- deliveries ------------------------------------------------------------------------
    async def record_delivery(self, delivery_id: str, session_id: str) -> bool:
        """Record a verified delivery; True if new, False if ``delivery_id`` was seen.

        Decided by a unique constraint / ``SET NX``; durable when it returns.
        """

    async def mark_delivery_resolved(self, delivery_id: str) -> None:
        """The session named by this delivery was read and its calls were dispatched."""

    async def unresolved_deliveries(
        self, *, older_than: float, limit: int = 100
    ) -> list[DeliveryRecord]:
        """Deliveries recorded at or before ``older_than`` and never resolved (recovery)."""

    async def prune(self, *, deliveries_before: float, calls_before: float) -> int:
        """Expire delivery records and terminal calls older than the given times.

        Must not block the event loop or other replicas for long; returns rows removed.
        """

    # -- calls -----------------------------------------------------------------------------
    async def claim_call(
        self,
        key: CallKey,
        *,
        tool_name: str,
        owner: str,
        lease_seconds: float,
        delivery_id: str | None = None,
    ) -> ClaimOutcome:
        """Atomically decide who runs a call.

        - absent → insert ``claimed`` owned by ``owner`` (attempt 1): ``CLAIMED``;
        - ``claimed`` with an expired lease → take it over (attempt + 1): ``IN_DOUBT``;
        - ``claimed`` with a live lease of another owner → ``BUSY``;
          (a live lease of the same owner is also ``BUSY``: the caller is already on it);
        - ``succeeded``/``failed`` → ``SAVED``; ``submitted``/``stale``/``quarantined`` →
          ``DONE``.
        """

    async def renew_lease(self, key: CallKey, *, owner: str, lease_seconds: float) -> bool:
        """Extend our lease (heartbeat); False if the call is no longer claimed by ``owner``."""

    async def save_result(self, key: CallKey, *, owner: str, result: SavedResult) -> CallRecord:
        """Save a result: ``claimed`` → ``succeeded``/``failed``.

        First writer wins: if a result is already saved (by us or another replica), the
        stored record is returned unchanged and the caller must submit *that* one. Saving
        also succeeds when our lease expired but nobody saved a result since.
        """

    async def mark_submitted(self, key: CallKey) -> None:
        """The API accepted the saved result (terminal)."""

    async def mark_stale(self, key: CallKey) -> None:
        """The API no longer waits for this call (terminal); it is never run again."""

    async def quarantine(self, key: CallKey, *, owner: str, reason: str) -> None:
        """Hold an in-doubt call for an operator instead of answering it (terminal)."""

    async def get_call(self, key: CallKey) -> CallRecord | None:
        """The record of one call, or None."""

    async def calls_for_session(self, session_id: str) -> list[CallRecord]:
        """Every call recorded for a session (any state)."""

    async def unsubmitted_results(self, *, limit: int = 100) -> list[CallRecord]:
        """Calls in ``succeeded``/``failed``: saved but not yet accepted (recovery)."""

    async def expired_claims(self, *, limit: int = 100) -> list[CallRecord]:
        """Calls in ``claimed`` whose lease has expired (recovery; they are in doubt)."""

    async def stats(self) -> StoreStats:
        """Counts for operators."""
