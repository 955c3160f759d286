"""The store protocol: the only place where durability and cross-replica atomicity live.

Every backend (``memory://``, ``sqlite:///``, ``redis://``, ``postgresql://``) implements
:class:`Store`. Each method is one atomic step *inside the store* (a unique constraint, a
conditional update, a Lua script, a row lock); no method may read and then write from Python
with a gap another replica could fall into. The values it takes and returns, and the call
states, are in :mod:`agentfn_asgi.records`.

Time comes from the store's injected ``clock`` (Unix seconds, ``time.time`` by default), so
leases are comparable across replicas that share the store.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from agentfn_asgi.records import (
    CallKey,
    CallRecord,
    ClaimOutcome,
    DeliveryRecord,
    SavedResult,
    StoreStats,
)

__all__ = ["Store"]


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
        """Hold an in-doubt call for an operator instead of answering it (terminal).

        Only ``owner``'s live or expired claim is quarantined (a saved result always wins);
        ``reason`` is kept as the record's ``quarantine_reason``.
        """

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
