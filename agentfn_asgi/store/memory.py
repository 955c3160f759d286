"""``memory://``: a dict-backed store for tests and single-process development.

Nothing survives the process. Every method is atomic because it never awaits between
reading and writing its dicts: on one event loop no other coroutine can run in between.
Do not share one instance across event loops running in different threads.

It is also the reference the other backends are held to: the contract suite
(``tests/store``) runs the same tests on all four.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from agentfn_asgi.errors import StoreError, StoreUnavailableError
from agentfn_asgi.records import (
    CallEvent,
    CallKey,
    CallQuery,
    CallRecord,
    CallState,
    ClaimOutcome,
    ClaimStatus,
    DeliveryRecord,
    SavedResult,
    StoreStats,
)
from agentfn_asgi.store._codec import claim_status_for, saved_detail

__all__ = ["MemoryStore"]


@dataclass(slots=True)
class _Data:
    """What instances sharing one memory store share (see :meth:`MemoryStore.sharing`)."""

    deliveries: dict[str, tuple[str, DeliveryRecord, str | None]] = field(default_factory=dict)
    calls: dict[CallKey, tuple[str, CallRecord]] = field(default_factory=dict)
    revoked: dict[str, float] = field(default_factory=dict)  # token id -> expires_at


class MemoryStore:
    """In-process :class:`~agentfn_asgi.store.base.Store`.

    Usable without :meth:`open` (it has nothing to connect); after :meth:`close` every
    operation raises :class:`StoreUnavailableError` until :meth:`open` is called again, so
    work that outlives an application's shutdown fails loudly instead of silently.
    :meth:`sharing` gives another instance over the same data in another namespace.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        namespace: str = "",
        _data: _Data | None = None,
    ) -> None:
        self._clock = clock
        self.namespace = namespace
        self._closed = False
        self._data = _data if _data is not None else _Data()

    def sharing(self, namespace: str) -> MemoryStore:
        """Another instance over the same data, working in ``namespace``."""
        return MemoryStore(clock=self._clock, namespace=namespace, _data=self._data)

    def __repr__(self) -> str:
        data = self._data
        return f"MemoryStore(calls={len(data.calls)}, deliveries={len(data.deliveries)})"

    @property
    def location(self) -> str:
        """Where the data lives, for logs: this process's memory."""
        return "memory://" + (f" (namespace {self.namespace})" if self.namespace else "")

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
    def _own_deliveries(self) -> list[DeliveryRecord]:
        ns = self.namespace
        return [d for owner, d, _ in self._data.deliveries.values() if owner == ns]

    async def record_delivery(
        self, delivery_id: str, session_id: str, *, nonce: str | None = None
    ) -> bool:
        """Record a delivery; True if new (or our own repeat, by ``nonce``)."""
        self._check_open()
        found = self._data.deliveries.get(delivery_id)
        if found is not None:
            return nonce is not None and nonce != "" and found[2] == nonce
        now = self._clock()
        record = DeliveryRecord(delivery_id, session_id, now, next_attempt_at=now)
        self._data.deliveries[delivery_id] = (self.namespace, record, nonce)
        return True

    def _update_delivery(self, delivery_id: str, **changes: object) -> None:
        found = self._data.deliveries.get(delivery_id)
        if found is not None:
            ns, record, nonce = found
            self._data.deliveries[delivery_id] = (
                ns,
                dataclasses.replace(record, **changes),  # type: ignore[arg-type]
                nonce,
            )

    async def mark_delivery_resolved(self, delivery_id: str) -> None:
        """Mark a delivery resolved; unknown ids are ignored."""
        self._check_open()
        self._update_delivery(delivery_id, resolved=True)

    async def delivery_failed(self, delivery_id: str, *, error: str, retry_at: float) -> None:
        """Count a failed resolve, keep its error, retry at ``retry_at``."""
        self._check_open()
        found = self._data.deliveries.get(delivery_id)
        if found is not None and not found[1].resolved:
            self._update_delivery(
                delivery_id,
                attempts=found[1].attempts + 1,
                last_error=error,
                next_attempt_at=retry_at,
            )

    async def unresolved_deliveries(
        self,
        *,
        due_before: float,
        limit: int = 100,
        after: tuple[float, str] | None = None,
    ) -> list[DeliveryRecord]:
        """Unresolved deliveries due at or before ``due_before``, soonest first."""
        self._check_open()
        found = [
            d
            for d in self._own_deliveries()
            if not d.resolved
            and d.next_attempt_at <= due_before
            and (after is None or (d.next_attempt_at, d.delivery_id) > after)
        ]
        found.sort(key=lambda d: (d.next_attempt_at, d.delivery_id))
        return found[: max(0, limit)]

    async def list_deliveries(
        self, *, unresolved_only: bool = False, limit: int = 50
    ) -> list[DeliveryRecord]:
        """Deliveries, newest first."""
        self._check_open()
        found = [d for d in self._own_deliveries() if not (unresolved_only and d.resolved)]
        found.sort(key=lambda d: (d.received_at, d.delivery_id), reverse=True)
        return found[: max(0, limit)]

    async def prune(self, *, deliveries_before: float, calls_before: float) -> int:
        """Drop deliveries received, and submitted or stale calls updated, before the times."""
        self._check_open()
        data = self._data
        old_deliveries = [
            k
            for k, (ns, d, _) in data.deliveries.items()
            if ns == self.namespace and d.received_at < deliveries_before
        ]
        old_calls = [
            k
            for k, (ns, c) in data.calls.items()
            if ns == self.namespace and c.state in _PRUNABLE and c.updated_at < calls_before
        ]
        for delivery_id in old_deliveries:
            del data.deliveries[delivery_id]
        for key in old_calls:
            del data.calls[key]
        return len(old_deliveries) + len(old_calls)

    # -- calls -----------------------------------------------------------------------------
    def _get(self, key: CallKey) -> CallRecord | None:
        found = self._data.calls.get(key)
        return None if found is None else found[1]

    def _put(self, record: CallRecord, namespace: str | None = None) -> CallRecord:
        found = self._data.calls.get(record.key)
        ns = namespace if namespace is not None else (found[0] if found else self.namespace)
        self._data.calls[record.key] = (ns, record)
        return record

    def _event(
        self, record: CallRecord, kind: str, *, owner: str | None = None, detail: str = ""
    ) -> tuple[CallEvent, ...]:
        event = CallEvent(self._clock(), kind, record.attempt, owner, detail)
        return (*record.history, event)

    async def claim_call(
        self,
        key: CallKey,
        *,
        tool_name: str,
        owner: str,
        lease_seconds: float,
        delivery_id: str | None = None,
        margin: float = 0.0,
    ) -> ClaimOutcome:
        """Decide who runs ``key``; see :meth:`Store.claim_call`."""
        self._check_open()
        now = self._clock()
        record = self._get(key)
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
                next_attempt_at=now,
                history=(CallEvent(now, "claimed", 1, owner),),
            )
            return ClaimOutcome(ClaimStatus.CLAIMED, self._plain(self._put(record, self.namespace)))
        if record.state is CallState.CLAIMED:
            if record.owner == owner and record.lease_expires_at >= now:
                # Our own claim, retried: it is ours already.
                status = ClaimStatus.CLAIMED if record.attempt == 1 else ClaimStatus.IN_DOUBT
                return ClaimOutcome(status, self._plain(record))
            if record.lease_expires_at + margin < now:
                attempt = record.attempt + 1
                record = dataclasses.replace(
                    record,
                    attempt=attempt,
                    owner=owner,
                    lease_expires_at=now + lease_seconds,
                    updated_at=now,
                    delivery_id=record.delivery_id or delivery_id,
                    history=(*record.history, CallEvent(now, "taken_over", attempt, owner)),
                )
                return ClaimOutcome(ClaimStatus.IN_DOUBT, self._plain(self._put(record)))
        return ClaimOutcome(claim_status_for(record), self._plain(record))

    def _holds(self, record: CallRecord | None, owner: str, attempt: int) -> bool:
        return (
            record is not None
            and record.state is CallState.CLAIMED
            and record.owner == owner
            and record.attempt == attempt
        )

    async def renew_lease(
        self, key: CallKey, *, owner: str, attempt: int, lease_seconds: float
    ) -> bool:
        """Extend ``(owner, attempt)``'s lease; False if the claim is not theirs."""
        self._check_open()
        record = self._get(key)
        if record is None or not self._holds(record, owner, attempt):
            return False
        now = self._clock()
        self._put(dataclasses.replace(record, lease_expires_at=now + lease_seconds, updated_at=now))
        return True

    async def save_result(
        self,
        key: CallKey,
        *,
        owner: str,
        attempt: int,
        result: SavedResult,
        duration: float | None = None,
    ) -> CallRecord:
        """Fenced, first writer wins; see :meth:`Store.save_result`."""
        self._check_open()
        record = self._get(key)
        if record is None:
            raise StoreError(f"cannot save a result for call {key}: it was never claimed")
        if not self._holds(record, owner, attempt):
            return self._plain(record)
        return self._plain(self._saved(record, result, "saved", owner, duration))

    def _saved(
        self,
        record: CallRecord,
        result: SavedResult,
        kind: str,
        owner: str | None,
        duration: float | None,
    ) -> CallRecord:
        now = self._clock()
        return self._put(
            dataclasses.replace(
                record,
                state=CallState.SUCCEEDED if result.success else CallState.FAILED,
                owner=owner if owner is not None else record.owner,
                updated_at=now,
                next_attempt_at=now,
                result=result,
                history=self._event(
                    record, kind, owner=owner, detail=saved_detail(result, duration)
                ),
            )
        )

    def _transition(
        self,
        key: CallKey,
        to: CallState,
        *,
        allowed: frozenset[CallState],
        kind: str,
        unchanged_since: float | None = None,
        detail: str = "",
    ) -> None:
        record = self._get(key)
        if record is None or record.state not in allowed:
            return
        if unchanged_since is not None and record.updated_at > unchanged_since:
            return
        history = self._event(record, kind, detail=detail)
        self._put(dataclasses.replace(record, state=to, updated_at=self._clock(), history=history))

    async def mark_submitted(self, key: CallKey, *, detail: str = "") -> None:
        """``succeeded``/``failed`` → ``submitted``; anything else is left alone."""
        self._check_open()
        self._transition(key, CallState.SUBMITTED, allowed=_SAVED, kind="submitted", detail=detail)

    async def submission_failed(self, key: CallKey, *, detail: str, retry_at: float) -> None:
        """Record a failed submission; the sweep retries it at ``retry_at``."""
        self._check_open()
        record = self._get(key)
        if record is None or record.state not in _SAVED:
            return
        self._put(
            dataclasses.replace(
                record,
                failures=record.failures + 1,
                next_attempt_at=retry_at,
                history=self._event(record, "submit_failed", detail=detail),
            )
        )

    async def mark_stale(self, key: CallKey, *, unchanged_since: float | None = None) -> None:
        """Any non-terminal state → ``stale`` (unless updated after ``unchanged_since``)."""
        self._check_open()
        self._transition(
            key,
            CallState.STALE,
            allowed=_NON_TERMINAL,
            kind="stale",
            unchanged_since=unchanged_since,
        )

    async def quarantine(self, key: CallKey, *, owner: str, attempt: int, reason: str) -> None:
        """``claimed`` by ``(owner, attempt)`` → ``quarantined``; a saved result wins."""
        self._check_open()
        record = self._get(key)
        if record is not None and self._holds(record, owner, attempt):
            self._put(
                dataclasses.replace(
                    record,
                    state=CallState.QUARANTINED,
                    updated_at=self._clock(),
                    quarantine_reason=reason,
                    history=self._event(record, "quarantined", owner=owner, detail=reason),
                )
            )

    def _settleable(self, record: CallRecord | None, margin: float) -> bool:
        if record is None:
            return False
        if record.state is CallState.QUARANTINED:
            return True
        return record.in_doubt(self._clock() - margin)

    async def settle(
        self, key: CallKey, *, result: SavedResult, margin: float = 0.0
    ) -> CallRecord | None:
        """An operator's result for a quarantined or in-doubt call; see the protocol."""
        self._check_open()
        record = self._get(key)
        if record is None or not self._settleable(record, margin):
            return None
        record = dataclasses.replace(record, quarantine_reason=None)
        return self._plain(self._saved(record, result, "settled", None, None))

    async def release(
        self, key: CallKey, *, owner: str, lease_seconds: float, margin: float = 0.0
    ) -> CallRecord | None:
        """An operator's re-run: claimed by ``owner`` with the next attempt."""
        self._check_open()
        record = self._get(key)
        if record is None or not self._settleable(record, margin):
            return None
        now = self._clock()
        attempt = record.attempt + 1
        return self._plain(
            self._put(
                dataclasses.replace(
                    record,
                    state=CallState.CLAIMED,
                    attempt=attempt,
                    owner=owner,
                    lease_expires_at=now + lease_seconds,
                    updated_at=now,
                    quarantine_reason=None,
                    history=(*record.history, CallEvent(now, "released", attempt, owner)),
                )
            )
        )

    @staticmethod
    def _plain(record: CallRecord) -> CallRecord:
        # Other backends read the history only when asked: so does this one, for parity.
        return dataclasses.replace(record, history=())

    async def get_call(self, key: CallKey, *, history: bool = False) -> CallRecord | None:
        """The record of ``key`` (with its history if asked), or None."""
        self._check_open()
        record = self._get(key)
        if record is None:
            return None
        return record if history else self._plain(record)

    async def find_calls(self, call_id: str) -> list[CallRecord]:
        """Every call with ``call_id``, in any session of this namespace, with history."""
        self._check_open()
        found = [
            c
            for ns, c in self._data.calls.values()
            if ns == self.namespace and c.key.call_id == call_id
        ]
        found.sort(key=lambda c: (c.created_at, c.key.session_id, c.key.turn_id))
        return found

    async def calls_for_session(self, session_id: str) -> list[CallRecord]:
        """Every call of a session, oldest first."""
        self._check_open()
        found = [
            self._plain(c) for _, c in self._data.calls.values() if c.key.session_id == session_id
        ]
        found.sort(key=lambda c: (c.created_at, c.key.turn_id, c.key.call_id))
        return found

    async def list_calls(self, query: CallQuery) -> list[CallRecord]:
        """Calls matching ``query``, newest first."""
        self._check_open()
        now = self._clock()

        def matches(record: CallRecord) -> bool:
            if query.state == "in_doubt":
                if not record.in_doubt(now):
                    return False
            elif query.state is not None and record.state.value != query.state:
                return False
            if query.session_id is not None and record.key.session_id != query.session_id:
                return False
            if query.tool_name is not None and record.tool_name != query.tool_name:
                return False
            if query.since is not None and record.created_at < query.since:
                return False
            return query.before is None or _position(record) < query.before

        found = [
            self._plain(c)
            for ns, c in self._data.calls.values()
            if ns == self.namespace and matches(c)
        ]
        found.sort(key=_position, reverse=True)
        return found[: max(0, query.limit)]

    async def unsubmitted_results(
        self,
        *,
        due_before: float,
        limit: int = 100,
        after: tuple[float, CallKey] | None = None,
    ) -> list[CallRecord]:
        """Saved, not yet submitted results due at or before ``due_before``, soonest first."""
        self._check_open()

        def order(record: CallRecord) -> tuple[float, str, str, str]:
            key = record.key
            return (record.next_attempt_at, key.session_id, key.turn_id, key.call_id)

        start = None if after is None else (after[0], *_key_tuple(after[1]))
        found = [
            self._plain(c)
            for ns, c in self._data.calls.values()
            if ns == self.namespace
            and c.state in _SAVED
            and c.next_attempt_at <= due_before
            and (start is None or order(c) > start)
        ]
        found.sort(key=order)
        return found[: max(0, limit)]

    async def expired_claims(self, *, margin: float = 0.0, limit: int = 100) -> list[CallRecord]:
        """Claims whose lease expired more than ``margin`` ago, earliest expiry first."""
        self._check_open()
        now = self._clock()
        found = [
            self._plain(c)
            for ns, c in self._data.calls.values()
            if ns == self.namespace
            and c.state is CallState.CLAIMED
            and c.lease_expires_at + margin < now
        ]
        found.sort(key=lambda c: c.lease_expires_at)
        return found[: max(0, limit)]

    async def stats(self) -> StoreStats:
        """Counts for operators; ``calls_by_state`` lists every state, zeros included."""
        self._check_open()
        now = self._clock()
        by_state = {state.value: 0 for state in CallState}
        in_doubt = successes = failures = 0
        oldest: float | None = None
        for ns, call in self._data.calls.values():
            if ns != self.namespace:
                continue
            by_state[call.state.value] += 1
            if call.in_doubt(now):
                in_doubt += 1
            if call.state is CallState.SUBMITTED and call.result is not None:
                if call.result.success:
                    successes += 1
                else:
                    failures += 1
            if not call.state.terminal and (oldest is None or call.created_at < oldest):
                oldest = call.created_at
        deliveries = self._own_deliveries()
        return StoreStats(
            deliveries=len(deliveries),
            unresolved_deliveries=sum(1 for d in deliveries if not d.resolved),
            calls_by_state=by_state,
            in_doubt=in_doubt,
            oldest_pending_at=oldest,
            successes=successes,
            failures=failures,
            failing_deliveries=sum(1 for d in deliveries if not d.resolved and d.attempts),
        )

    # -- revocations -----------------------------------------------------------------------
    async def revoke_token(self, token_id: str, *, expires_at: float) -> None:
        """Revoke ``token_id`` until ``expires_at``; expired entries are dropped here."""
        self._check_open()
        now = self._clock()
        revoked = self._data.revoked
        for gone in [t for t, until in revoked.items() if until <= now]:
            del revoked[gone]
        if expires_at > now:
            revoked[token_id] = expires_at

    async def token_revoked(self, token_id: str) -> bool:
        """Whether ``token_id`` is revoked and its entry not expired."""
        self._check_open()
        return self._data.revoked.get(token_id, 0.0) > self._clock()


def _key_tuple(key: CallKey) -> tuple[str, str, str]:
    return (key.session_id, key.turn_id, key.call_id)


def _position(record: CallRecord) -> tuple[float, str, str, str]:
    return (record.created_at, *_key_tuple(record.key))


_SAVED = frozenset({CallState.SUCCEEDED, CallState.FAILED})
_NON_TERMINAL = frozenset(state for state in CallState if not state.terminal)
_PRUNABLE = frozenset({CallState.SUBMITTED, CallState.STALE})
