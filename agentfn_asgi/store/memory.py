"""``memory://``: a dict-backed store for tests and single-process development.

Nothing survives the process. Every method is atomic because it never awaits between
reading and writing its dicts: on one event loop no other coroutine can run in between.
Do not share one instance across event loops running in different threads.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from agentfn_asgi.errors import StoreError, StoreUnavailableError
from agentfn_asgi.records import (
    CallKey,
    CallRecord,
    CallState,
    ClaimOutcome,
    ClaimStatus,
    DeliveryRecord,
    SavedResult,
    StoreStats,
)
from agentfn_asgi.store._codec import claim_status_for

__all__ = ["MemoryStore"]


class MemoryStore:
    """In-process :class:`~agentfn_asgi.store.base.Store`.

    Usable without :meth:`open` (it has nothing to connect); after :meth:`close` every
    operation raises :class:`StoreUnavailableError` until :meth:`open` is called again, so
    work that outlives an application's shutdown fails loudly instead of silently.
    """

    def __init__(self, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._closed = False
        self._deliveries: dict[str, DeliveryRecord] = {}
        self._calls: dict[CallKey, CallRecord] = {}

    def __repr__(self) -> str:
        return f"MemoryStore(calls={len(self._calls)}, deliveries={len(self._deliveries)})"

    def _check_open(self) -> None:
        if self._closed:
            raise StoreUnavailableError("the memory store is closed")

    # -- lifecycle -------------------------------------------------------------------------
    async def open(self) -> None:
        """Make the store usable (again). Idempotent."""
        self._closed = False

    async def close(self) -> None:
        """Refuse further operations; the data is kept for a later :meth:`open`."""
        self._closed = True

    async def ping(self) -> None:
        """Raise :class:`StoreUnavailableError` once closed."""
        self._check_open()

    # -- deliveries ------------------------------------------------------------------------
    async def record_delivery(self, delivery_id: str, session_id: str) -> bool:
        """Record a delivery; True if ``delivery_id`` is new."""
        self._check_open()
        if delivery_id in self._deliveries:
            return False
        self._deliveries[delivery_id] = DeliveryRecord(delivery_id, session_id, self._clock())
        return True

    async def mark_delivery_resolved(self, delivery_id: str) -> None:
        """Mark a delivery resolved; unknown ids are ignored."""
        self._check_open()
        record = self._deliveries.get(delivery_id)
        if record is not None and not record.resolved:
            self._deliveries[delivery_id] = dataclasses.replace(record, resolved=True)

    async def unresolved_deliveries(
        self, *, older_than: float, limit: int = 100
    ) -> list[DeliveryRecord]:
        """Unresolved deliveries received at or before ``older_than``, oldest first."""
        self._check_open()
        found = [
            d for d in self._deliveries.values() if not d.resolved and d.received_at <= older_than
        ]
        found.sort(key=lambda d: d.received_at)
        return found[: max(0, limit)]

    async def prune(self, *, deliveries_before: float, calls_before: float) -> int:
        """Drop deliveries received and terminal calls last updated before the given times."""
        self._check_open()
        old_deliveries = [
            k for k, d in self._deliveries.items() if d.received_at < deliveries_before
        ]
        old_calls = [
            k for k, c in self._calls.items() if c.state.terminal and c.updated_at < calls_before
        ]
        for delivery_id in old_deliveries:
            del self._deliveries[delivery_id]
        for key in old_calls:
            del self._calls[key]
        return len(old_deliveries) + len(old_calls)

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
        """Decide who runs ``key``; see :meth:`Store.claim_call`."""
        self._check_open()
        now = self._clock()
        record = self._calls.get(key)
        if record is None:
            record = CallRecord(
                key=key,
                tool_name=tool_name,
                state=CallState.CLAIMED,
                attempt=1,
                owner=owner,
                lease_expires_at=now + lease_seconds,
                created_at=now,
                updated_at=now,
                delivery_id=delivery_id,
            )
            self._calls[key] = record
            return ClaimOutcome(ClaimStatus.CLAIMED, record)
        if record.state is CallState.CLAIMED and record.lease_expires_at < now:
            record = dataclasses.replace(
                record,
                attempt=record.attempt + 1,
                owner=owner,
                lease_expires_at=now + lease_seconds,
                updated_at=now,
                delivery_id=record.delivery_id or delivery_id,
            )
            self._calls[key] = record
            return ClaimOutcome(ClaimStatus.IN_DOUBT, record)
        return ClaimOutcome(claim_status_for(record), record)

    async def renew_lease(self, key: CallKey, *, owner: str, lease_seconds: float) -> bool:
        """Extend ``owner``'s lease; False if the call is not claimed by ``owner``."""
        self._check_open()
        record = self._calls.get(key)
        if record is None or record.state is not CallState.CLAIMED or record.owner != owner:
            return False
        now = self._clock()
        self._calls[key] = dataclasses.replace(
            record, lease_expires_at=now + lease_seconds, updated_at=now
        )
        return True

    async def save_result(self, key: CallKey, *, owner: str, result: SavedResult) -> CallRecord:
        """First writer wins; see :meth:`Store.save_result`."""
        self._check_open()
        record = self._calls.get(key)
        if record is None:
            raise StoreError(f"cannot save a result for call {key}: it was never claimed")
        if record.state is not CallState.CLAIMED:
            return record
        record = dataclasses.replace(
            record,
            state=CallState.SUCCEEDED if result.success else CallState.FAILED,
            owner=owner,
            updated_at=self._clock(),
            result=result,
        )
        self._calls[key] = record
        return record

    def _transition(self, key: CallKey, to: CallState, *, allowed: frozenset[CallState]) -> None:
        record = self._calls.get(key)
        if record is not None and record.state in allowed:
            self._calls[key] = dataclasses.replace(record, state=to, updated_at=self._clock())

    async def mark_submitted(self, key: CallKey) -> None:
        """``succeeded``/``failed`` → ``submitted``; anything else is left alone."""
        self._check_open()
        self._transition(key, CallState.SUBMITTED, allowed=_SAVED)

    async def mark_stale(self, key: CallKey) -> None:
        """Any non-terminal state → ``stale``; terminal states are left alone."""
        self._check_open()
        self._transition(key, CallState.STALE, allowed=_NON_TERMINAL)

    async def quarantine(self, key: CallKey, *, owner: str, reason: str) -> None:
        """``claimed`` by ``owner`` → ``quarantined`` with ``reason``; a saved result wins."""
        self._check_open()
        record = self._calls.get(key)
        if record is not None and record.state is CallState.CLAIMED and record.owner == owner:
            self._calls[key] = dataclasses.replace(
                record,
                state=CallState.QUARANTINED,
                updated_at=self._clock(),
                quarantine_reason=reason,
            )

    async def get_call(self, key: CallKey) -> CallRecord | None:
        """The record of ``key``, or None."""
        self._check_open()
        return self._calls.get(key)

    async def calls_for_session(self, session_id: str) -> list[CallRecord]:
        """Every call of a session, oldest first."""
        self._check_open()
        found = [c for c in self._calls.values() if c.key.session_id == session_id]
        found.sort(key=lambda c: (c.created_at, c.key.turn_id, c.key.call_id))
        return found

    async def unsubmitted_results(self, *, limit: int = 100) -> list[CallRecord]:
        """Saved, not yet submitted results, least recently updated first."""
        self._check_open()
        found = [c for c in self._calls.values() if c.state in _SAVED]
        found.sort(key=lambda c: c.updated_at)
        return found[: max(0, limit)]

    async def expired_claims(self, *, limit: int = 100) -> list[CallRecord]:
        """Claims whose lease has expired, earliest expiry first."""
        self._check_open()
        now = self._clock()
        found = [
            c
            for c in self._calls.values()
            if c.state is CallState.CLAIMED and c.lease_expires_at < now
        ]
        found.sort(key=lambda c: c.lease_expires_at)
        return found[: max(0, limit)]

    async def stats(self) -> StoreStats:
        """Counts for operators; ``calls_by_state`` lists every state, zeros included."""
        self._check_open()
        now = self._clock()
        by_state = {state.value: 0 for state in CallState}
        in_doubt = 0
        oldest: float | None = None
        for call in self._calls.values():
            by_state[call.state.value] += 1
            if call.state is CallState.CLAIMED and call.lease_expires_at < now:
                in_doubt += 1
            if not call.state.terminal and (oldest is None or call.created_at < oldest):
                oldest = call.created_at
        return StoreStats(
            deliveries=len(self._deliveries),
            unresolved_deliveries=sum(1 for d in self._deliveries.values() if not d.resolved),
            calls_by_state=by_state,
            in_doubt=in_doubt,
            oldest_pending_at=oldest,
        )


_SAVED = frozenset({CallState.SUCCEEDED, CallState.FAILED})
_NON_TERMINAL = frozenset(state for state in CallState if not state.terminal)
