"""``memory://``: a dict-backed store for tests and single-process development.

Nothing survives the process. Every method is atomic because it never awaits between
reading and writing its dicts: on one event loop no other coroutine can run in between.
Do not share one instance across event loops running in different threads.

It is also the reference the other backends are held to: it executes the state table of
:mod:`agentfn_asgi.states` row by row (every change to a call goes through :meth:`_apply`), the
contract suite (``tests/store``) runs the same tests on all four backends, and the generated
histories compare every backend with this one after every step.

Every record is kept under its namespace: the data is shared by :meth:`MemoryStore.sharing`
instances, and nothing one namespace does reads or changes another's records.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from agentfn_asgi.errors import StoreError, StoreUnavailableError
from agentfn_asgi.records import (
    HISTORY_HEAD,
    HISTORY_TAIL,
    ApprovalRequest,
    CallEvent,
    CallKey,
    CallQuery,
    CallRecord,
    CallState,
    ClaimOutcome,
    ClaimStatus,
    DeliveryRecord,
    Limit,
    SavedResult,
    StoreStats,
)
from agentfn_asgi.states import (
    SAVED,
    TRANSITIONS,
    Transition,
    admits,
    allows,
    bucket_tokens,
    resulting_state,
)
from agentfn_asgi.store._codec import approval_detail, claim_status_for, saved_detail

__all__ = ["MemoryStore"]


@dataclass(slots=True)
class _Data:
    """What instances sharing one memory store share (see :meth:`MemoryStore.sharing`)."""

    #: (namespace, delivery_id) -> (the delivery, the nonce that recorded it)
    deliveries: dict[tuple[str, str], tuple[DeliveryRecord, str | None]] = field(
        default_factory=dict
    )
    #: (namespace, key) -> the call, with its whole (bounded) history
    calls: dict[tuple[str, CallKey], CallRecord] = field(default_factory=dict)
    #: revoked token id -> expires_at (store-wide, see Store)
    revoked: dict[str, float] = field(default_factory=dict)
    #: (namespace, limiter) -> the calls that held or waited for one of its slots (an index:
    #: a call that moved on is dropped when next seen)
    limited: dict[tuple[str, str], set[CallKey]] = field(default_factory=dict)
    #: (namespace, limiter) -> (tokens, updated_at): its rate's bucket
    buckets: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)


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
        return [d for (owner, _), (d, _) in self._data.deliveries.items() if owner == ns]

    async def record_delivery(
        self, delivery_id: str, session_id: str, *, nonce: str | None = None
    ) -> bool:
        """Record a delivery; True if new (or our own repeat, by ``nonce``)."""
        self._check_open()
        found = self._data.deliveries.get((self.namespace, delivery_id))
        if found is not None:
            return nonce is not None and nonce != "" and found[1] == nonce
        now = self._clock()
        record = DeliveryRecord(delivery_id, session_id, now, next_attempt_at=now)
        self._data.deliveries[(self.namespace, delivery_id)] = (record, nonce)
        return True

    def _update_unresolved(self, delivery_id: str, **changes: object) -> None:
        key = (self.namespace, delivery_id)
        found = self._data.deliveries.get(key)
        if found is not None and not found[0].resolved:
            record, nonce = found
            self._data.deliveries[key] = (dataclasses.replace(record, **changes), nonce)  # type: ignore[arg-type]

    async def mark_delivery_resolved(self, delivery_id: str) -> None:
        """Mark a delivery resolved; unknown ids are ignored."""
        self._check_open()
        self._update_unresolved(delivery_id, resolved=True)

    async def delivery_failed(self, delivery_id: str, *, error: str, retry_at: float) -> None:
        """Count a failed resolve, keep its error, retry at ``retry_at``."""
        self._check_open()
        found = self._data.deliveries.get((self.namespace, delivery_id))
        if found is not None:
            self._update_unresolved(
                delivery_id,
                attempts=found[0].attempts + 1,
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
        data, ns = self._data, self.namespace
        old_deliveries = [
            key
            for key, (d, _) in data.deliveries.items()
            if key[0] == ns and d.received_at < deliveries_before
        ]
        prune = TRANSITIONS["prune"]
        now = self._clock()
        old_calls = [
            key
            for key, c in data.calls.items()
            if key[0] == ns and allows(prune, c, now=now) and c.updated_at < calls_before
        ]
        for delivery_key in old_deliveries:
            del data.deliveries[delivery_key]
        for call_key in old_calls:
            del data.calls[call_key]
        return len(old_deliveries) + len(old_calls)

    # -- calls: every change is one row of the state table ---------------------------------
    def _get(self, key: CallKey) -> CallRecord | None:
        return self._data.calls.get((self.namespace, key))

    def _apply(
        self,
        row: Transition,
        record: CallRecord,
        *,
        owner: str | None = None,
        lease_seconds: float | None = None,
        result: SavedResult | None = None,
        detail: str = "",
        limiter: str | None = None,
        **changes: object,
    ) -> CallRecord:
        """Make ``row`` happen to ``record`` (the caller checked :func:`allows`): its resulting
        state, its next attempt, its history event; ``changes`` are the row's other fields."""
        now = self._clock()
        attempt = record.attempt + 1 if row.new_attempt else record.attempt
        state = resulting_state(row, record, success=None if result is None else result.success)
        fields: dict[str, object] = {"state": state, "attempt": attempt}
        if row.touches:
            fields["updated_at"] = now
        fields.update(changes)
        updated = dataclasses.replace(record, **fields)  # type: ignore[arg-type]
        if owner is not None and (row.new_attempt or result is not None):
            updated = dataclasses.replace(updated, owner=owner)
        if lease_seconds is not None:
            updated = dataclasses.replace(updated, lease_expires_at=now + lease_seconds)
        if result is not None:
            updated = dataclasses.replace(updated, result=result, next_attempt_at=now)
        if row.limiter is not None:
            updated = dataclasses.replace(updated, limiter=limiter if row.limiter else None)
        if row.event is not None:
            updated = _appended(updated, CallEvent(now, row.event, attempt, owner, detail))
        self._data.calls[(self.namespace, record.key)] = updated
        return updated

    async def claim_call(
        self,
        key: CallKey,
        *,
        tool_name: str,
        owner: str,
        lease_seconds: float,
        delivery_id: str | None = None,
        margin: float = 0.0,
        limit: Limit | None = None,
        resolves_delivery: bool = False,
    ) -> ClaimOutcome:
        """Decide who runs ``key``; see :meth:`Store.claim_call`."""
        self._check_open()
        outcome = self._claim(key, tool_name, owner, lease_seconds, delivery_id, margin, limit)
        if resolves_delivery and delivery_id is not None:
            self._update_unresolved(delivery_id, resolved=True)
        return outcome

    def _claim(
        self,
        key: CallKey,
        tool_name: str,
        owner: str,
        lease_seconds: float,
        delivery_id: str | None,
        margin: float,
        limit: Limit | None,
    ) -> ClaimOutcome:
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
            self._data.calls[(self.namespace, key)] = record
            return self._admitted(ClaimStatus.CLAIMED, record, limit, lease_seconds, margin)
        if allows(TRANSITIONS["reclaim"], record, now=now, owner=owner):
            # Our own claim, retried: it is ours already.
            if record.state is CallState.WAITING:
                return ClaimOutcome(ClaimStatus.WAITING, _plain(record))
            status = ClaimStatus.CLAIMED if record.attempt == 1 else ClaimStatus.IN_DOUBT
            if record.limiter is None:
                return self._admitted(status, record, limit, lease_seconds, margin)
            return ClaimOutcome(status, _plain(record))
        retry = TRANSITIONS["retry"]
        if allows(retry, record, now=now):
            record = self._apply(retry, record, owner=owner, lease_seconds=lease_seconds)
            return self._admitted(ClaimStatus.RETRY, record, limit, lease_seconds, margin)
        adopt = TRANSITIONS["adopt"]
        if allows(adopt, record, now=now, margin=margin):
            record = self._apply(adopt, record, owner=owner, lease_seconds=lease_seconds)
            return self._admitted(ClaimStatus.CLAIMED, record, limit, lease_seconds, margin)
        take_over = TRANSITIONS["take_over"]
        if allows(take_over, record, now=now, margin=margin):
            if limit is not None and not self._admission(record, limit, margin)[0]:
                # Taken over only with a slot: a wait would lose the in-doubt flag.
                return ClaimOutcome(ClaimStatus.BUSY, _plain(record))
            record = self._apply(
                take_over,
                record,
                owner=owner,
                lease_seconds=lease_seconds,
                delivery_id=record.delivery_id or delivery_id,
            )
            return self._admitted(ClaimStatus.IN_DOUBT, record, limit, lease_seconds, margin)
        return ClaimOutcome(claim_status_for(record), _plain(record))

    async def admit_call(
        self,
        key: CallKey,
        *,
        owner: str,
        attempt: int,
        limit: Limit,
        lease_seconds: float,
        margin: float = 0.0,
    ) -> ClaimOutcome | None:
        """Ask ``limit`` for a slot for the call we hold; see :meth:`Store.admit_call`."""
        self._check_open()
        record = self._get(key)
        if record is None:
            return None
        held = record.owner == owner and record.attempt == attempt
        if held and record.state is CallState.CLAIMED and record.limiter == limit.name:
            return ClaimOutcome(ClaimStatus.CLAIMED, _plain(record))  # a retried admission
        if not held or record.state not in (CallState.CLAIMED, CallState.WAITING):
            return ClaimOutcome(claim_status_for(record), _plain(record))
        return self._admitted(ClaimStatus.CLAIMED, record, limit, lease_seconds, margin)

    def _admitted(
        self,
        status: ClaimStatus,
        record: CallRecord,
        limit: Limit | None,
        lease_seconds: float,
        margin: float,
    ) -> ClaimOutcome:
        """The holder of ``record`` (``claimed`` or ``waiting``) asks ``limit`` for a slot:
        ``take_slot`` / ``admit`` (answering ``status``) or ``wait`` / ``keep_waiting``
        (answering ``WAITING``). Without a limit, the claim stands as it is."""
        if limit is None:
            return ClaimOutcome(status, _plain(record))
        admitted, reason = self._admission(record, limit, margin)
        now = self._clock()
        owner, attempt = record.owner, record.attempt
        for name in ("take_slot", "wait", "admit", "keep_waiting"):
            row = TRANSITIONS[name]
            if allows(row, record, now=now, owner=owner, attempt=attempt, admitted=admitted):
                break
        else:  # pragma: no cover - the callers pass a held claimed or waiting call
            raise AssertionError(f"no admission row for {record.state}")
        # `wait` keeps when the call began to wait (its max_wait counts from it).
        began = now if row.name == "wait" else record.next_attempt_at
        record = self._apply(
            row,
            record,
            owner=owner,
            lease_seconds=lease_seconds,
            detail="" if admitted else reason,
            limiter=limit.name,
            next_attempt_at=began,
        )
        index = self._data.limited.setdefault((self.namespace, limit.name), set())
        index.add(record.key)
        if admitted and limit.rate is not None and row.name in ("take_slot", "admit"):
            tokens = self._tokens(limit, now)
            self._data.buckets[(self.namespace, limit.name)] = (tokens - 1.0, now)
        return ClaimOutcome(status if admitted else ClaimStatus.WAITING, _plain(record))

    def _tokens(self, limit: Limit, now: float) -> float:
        assert limit.rate is not None
        bucket = self._data.buckets.get((self.namespace, limit.name))
        tokens, updated = (None, now) if bucket is None else bucket
        return bucket_tokens(tokens, updated, now=now, rate=limit.rate, burst=limit.burst)

    def _admission(self, record: CallRecord, limit: Limit, margin: float) -> tuple[bool, str]:
        """The limiter's answer for ``record`` (:func:`admits`) and, when it refuses, why
        (``concurrency`` or ``rate``, the history's detail)."""
        now, ns = self._clock(), self.namespace
        index = self._data.limited.get((ns, limit.name), set())
        mine = (record.created_at, *_ordered(record.key))
        holders = ahead = 0
        for key in list(index):
            other = self._data.calls.get((ns, key))
            if other is None or other.limiter != limit.name or other.state not in _LIMITED:
                index.discard(key)
                continue
            if key == record.key or other.lease_expires_at < now - margin:
                continue
            if other.state is CallState.CLAIMED:
                holders += 1
            elif (other.created_at, *_ordered(key)) < mine:
                ahead += 1
        tokens = 0.0 if limit.rate is None else self._tokens(limit, now)
        verdict = admits(
            concurrency=limit.concurrency,
            rate=limit.rate,
            holders=holders,
            ahead=ahead,
            tokens=tokens,
        )
        full = limit.concurrency is not None and holders + ahead >= limit.concurrency
        return verdict, "" if verdict else ("concurrency" if full else "rate")

    async def renew_lease(
        self, key: CallKey, *, owner: str, attempt: int, lease_seconds: float
    ) -> bool:
        """Extend ``(owner, attempt)``'s lease; False if the claim is not theirs."""
        self._check_open()
        record, renew = self._get(key), TRANSITIONS["renew"]
        if record is None or not allows(
            renew, record, now=self._clock(), owner=owner, attempt=attempt
        ):
            return False
        self._apply(renew, record, lease_seconds=lease_seconds)
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
        record, save = self._get(key), TRANSITIONS["save"]
        if record is None:
            raise StoreError(f"cannot save a result for call {key}: it was never claimed")
        if not allows(save, record, now=self._clock(), owner=owner, attempt=attempt):
            return _plain(record)
        detail = saved_detail(result, duration)
        return _plain(self._apply(save, record, owner=owner, result=result, detail=detail))

    async def mark_submitted(self, key: CallKey, *, detail: str = "") -> None:
        """``succeeded``/``failed`` → ``submitted``; anything else is left alone."""
        self._check_open()
        record, row = self._get(key), TRANSITIONS["mark_submitted"]
        if record is not None and allows(row, record, now=self._clock()):
            self._apply(row, record, detail=detail)

    async def submission_failed(self, key: CallKey, *, detail: str, retry_at: float) -> None:
        """Record a failed submission; the sweep retries it at ``retry_at``."""
        self._check_open()
        record, row = self._get(key), TRANSITIONS["submission_failed"]
        if record is not None and allows(row, record, now=self._clock()):
            self._apply(
                row, record, detail=detail, failures=record.failures + 1, next_attempt_at=retry_at
            )

    async def mark_stale(self, key: CallKey, *, unchanged_since: float | None = None) -> None:
        """Any non-terminal state → ``stale`` (unless updated after ``unchanged_since``)."""
        self._check_open()
        record, row = self._get(key), TRANSITIONS["mark_stale"]
        if record is not None and allows(
            row, record, now=self._clock(), unchanged_since=unchanged_since
        ):
            self._apply(row, record)

    async def quarantine(self, key: CallKey, *, owner: str, attempt: int, reason: str) -> None:
        """``claimed`` by ``(owner, attempt)`` → ``quarantined``; a saved result wins."""
        self._check_open()
        record, row = self._get(key), TRANSITIONS["quarantine"]
        if record is not None and allows(
            row, record, now=self._clock(), owner=owner, attempt=attempt
        ):
            self._apply(row, record, owner=owner, detail=reason, quarantine_reason=reason)

    async def schedule_retry(
        self, key: CallKey, *, owner: str, attempt: int, at: float, reason: str
    ) -> bool:
        """``claimed`` by ``(owner, attempt)`` → ``retry_scheduled`` until ``at``."""
        self._check_open()
        record, row = self._get(key), TRANSITIONS["schedule_retry"]
        if record is None or not allows(
            row, record, now=self._clock(), owner=owner, attempt=attempt
        ):
            return False
        self._apply(
            row, record, owner=owner, detail=reason, lease_expires_at=at, next_attempt_at=at
        )
        return True

    async def settle(
        self, key: CallKey, *, result: SavedResult, margin: float = 0.0
    ) -> CallRecord | None:
        """An operator's result for a quarantined or in-doubt call; see the protocol."""
        self._check_open()
        record, row = self._get(key), TRANSITIONS["settle"]
        if record is None or not allows(row, record, now=self._clock(), margin=margin):
            return None
        detail = saved_detail(result, None)
        return _plain(
            self._apply(row, record, result=result, detail=detail, quarantine_reason=None)
        )

    async def release(
        self, key: CallKey, *, owner: str, lease_seconds: float, margin: float = 0.0
    ) -> CallRecord | None:
        """An operator's re-run: claimed by ``owner`` with the next attempt."""
        self._check_open()
        record, row = self._get(key), TRANSITIONS["release"]
        if record is None or not allows(row, record, now=self._clock(), margin=margin):
            return None
        return _plain(
            self._apply(
                row, record, owner=owner, lease_seconds=lease_seconds, quarantine_reason=None
            )
        )

    # -- approval ---------------------------------------------------------------------------
    async def request_approval(
        self, key: CallKey, *, owner: str, attempt: int, request: ApprovalRequest
    ) -> CallRecord:
        """Hold ``key`` for a person; see :class:`~agentfn_asgi.store.base.ApprovalStore`."""
        self._check_open()
        record, row = self._get(key), TRANSITIONS["request_approval"]
        if record is None:
            raise StoreError(f"cannot hold call {key} for approval: it was never claimed")
        if not allows(row, record, now=self._clock(), owner=owner, attempt=attempt):
            return _plain(record)
        return _plain(
            self._apply(
                row,
                record,
                owner=owner,
                detail=approval_detail(request),
                approval=request,
                lease_expires_at=request.expires_at,
            )
        )

    async def decide_approval(
        self,
        key: CallKey,
        *,
        approval_id: str,
        decision: str,
        by: str,
        via: str,
        reason: str | None = None,
        result: SavedResult | None = None,
    ) -> CallRecord | None:
        """Decide a waiting request once; see :class:`~agentfn_asgi.store.base.ApprovalStore`."""
        self._check_open()
        record, row = self._get(key), TRANSITIONS[_DECISION_ROWS[decision]]
        if (
            record is None
            or record.approval is None
            or record.approval.approval_id != approval_id
            or not allows(row, record, now=self._clock())
        ):
            return None
        now = self._clock()
        decided = dataclasses.replace(
            record.approval,
            decision=decision,
            decided_by=by,
            decided_via=via,
            decided_at=now,
            reason=reason,
        )
        return _plain(
            self._apply(
                row, record, result=result, detail=approval_detail(decided), approval=decided
            )
        )

    async def claim_approved(
        self, key: CallKey, *, owner: str, lease_seconds: float
    ) -> CallRecord | None:
        """An approved call, claimed by ``owner`` to run as the next attempt."""
        self._check_open()
        record, row = self._get(key), TRANSITIONS["run_approved"]
        if record is None or not allows(row, record, now=self._clock()):
            return None
        return _plain(self._apply(row, record, owner=owner, lease_seconds=lease_seconds))

    async def find_approval(self, approval_id: str) -> CallRecord | None:
        """The call whose approval request is ``approval_id``, with its history."""
        self._check_open()
        for record in self._own_calls():
            if record.approval is not None and record.approval.approval_id == approval_id:
                return record
        return None

    async def waiting_approvals(
        self, *, expired_by: float | None = None, limit: int = 100
    ) -> list[CallRecord]:
        """Calls waiting for a person, soonest expiry first."""
        self._check_open()
        found = [
            _plain(c)
            for c in self._own_calls()
            if c.state is CallState.AWAITING_APPROVAL
            and (expired_by is None or c.lease_expires_at <= expired_by)
        ]
        found.sort(key=lambda c: (c.lease_expires_at, *_key_tuple(c.key)))
        return found[: max(0, limit)]

    async def approved_calls(self, *, limit: int = 100) -> list[CallRecord]:
        """Approved calls not yet claimed to run, oldest decision first."""
        self._check_open()
        found = [_plain(c) for c in self._own_calls() if c.state is CallState.APPROVED]
        found.sort(key=lambda c: (c.updated_at, *_key_tuple(c.key)))
        return found[: max(0, limit)]

    # -- reading ---------------------------------------------------------------------------
    def _own_calls(self) -> list[CallRecord]:
        ns = self.namespace
        return [c for (owner, _), c in self._data.calls.items() if owner == ns]

    async def get_call(self, key: CallKey, *, history: bool = False) -> CallRecord | None:
        """The record of ``key`` (with its history if asked), or None."""
        self._check_open()
        record = self._get(key)
        if record is None:
            return None
        return record if history else _plain(record)

    async def find_calls(self, call_id: str) -> list[CallRecord]:
        """Every call with ``call_id``, in any session of this namespace, with history."""
        self._check_open()
        found = [c for c in self._own_calls() if c.key.call_id == call_id]
        found.sort(key=lambda c: (c.created_at, c.key.session_id, c.key.turn_id))
        return found

    async def calls_for_session(self, session_id: str) -> list[CallRecord]:
        """Every call of a session in this namespace, oldest first."""
        self._check_open()
        found = [_plain(c) for c in self._own_calls() if c.key.session_id == session_id]
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

        found = [_plain(c) for c in self._own_calls() if matches(c)]
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
            return (record.next_attempt_at, *_key_tuple(record.key))

        start = None if after is None else (after[0], *_key_tuple(after[1]))
        found = [
            _plain(c)
            for c in self._own_calls()
            if c.state in SAVED
            and c.next_attempt_at <= due_before
            and (start is None or order(c) > start)
        ]
        found.sort(key=order)
        return found[: max(0, limit)]

    async def expired_claims(self, *, margin: float = 0.0, limit: int = 100) -> list[CallRecord]:
        """Claims (and waiters) whose lease expired more than ``margin`` ago, earliest expiry
        first."""
        self._check_open()
        now, take_over, adopt = self._clock(), TRANSITIONS["take_over"], TRANSITIONS["adopt"]
        found = [
            _plain(c)
            for c in self._own_calls()
            if allows(take_over, c, now=now, margin=margin)
            or allows(adopt, c, now=now, margin=margin)
        ]
        found.sort(key=lambda c: c.lease_expires_at)
        return found[: max(0, limit)]

    async def due_retries(self, *, limit: int = 100) -> list[CallRecord]:
        """Scheduled retries whose time has come, earliest first."""
        self._check_open()
        now, retry = self._clock(), TRANSITIONS["retry"]
        found = [_plain(c) for c in self._own_calls() if allows(retry, c, now=now)]
        found.sort(key=lambda c: c.lease_expires_at)
        return found[: max(0, limit)]

    async def stats(self) -> StoreStats:
        """Counts for operators; ``calls_by_state`` lists every state, zeros included."""
        self._check_open()
        now = self._clock()
        by_state = {state.value: 0 for state in CallState}
        in_doubt = successes = failures = 0
        oldest: float | None = None
        for call in self._own_calls():
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


#: The row of the state table each decision makes.
#: The states in which a call with a limiter holds (claimed) or waits for one of its slots.
_LIMITED = frozenset({CallState.CLAIMED, CallState.WAITING})


def _ordered(key: CallKey) -> tuple[str, str, str]:
    """A call key's place among the waiters that arrived at the same time."""
    return key.session_id, key.turn_id, key.call_id


_DECISION_ROWS = {"approved": "approve", "denied": "deny", "expired": "expire_approval"}


def _appended(record: CallRecord, event: CallEvent) -> CallRecord:
    """``record`` with ``event`` at the end of its history, kept within the bound: the first
    :data:`HISTORY_HEAD` events stay, the oldest of the rest is dropped and counted."""
    history = (*record.history, event)
    if len(history) <= HISTORY_HEAD + HISTORY_TAIL:
        return dataclasses.replace(record, history=history)
    return dataclasses.replace(
        record,
        history=history[:HISTORY_HEAD] + history[HISTORY_HEAD + 1 :],
        history_dropped=record.history_dropped + 1,
    )


def _plain(record: CallRecord) -> CallRecord:
    # Other backends read the history only when asked: so does this one, for parity.
    return dataclasses.replace(record, history=(), history_dropped=0)


def _key_tuple(key: CallKey) -> tuple[str, str, str]:
    return (key.session_id, key.turn_id, key.call_id)


def _position(record: CallRecord) -> tuple[float, str, str, str]:
    return (record.created_at, *_key_tuple(record.key))
