"""``memory://``: a dict-backed store for tests and single-process development.

Nothing survives the process. Every method is atomic because it never awaits between
reading and writing its dicts: on one event loop no other coroutine can run in between.
Do not share one instance across event loops running in different threads.

It is also the reference the other backends are held to: every change to a call is
:func:`~agentfn_asgi.calls.states.apply` of a row of the state table, the
contract suite (``tests/store``) runs the same tests on all four backends, and the generated
histories compare every backend with this one after every step.

Every record is kept under its namespace: the data is shared by :meth:`MemoryStore.sharing`
instances, and nothing one namespace does reads or changes another's records.
"""

from __future__ import annotations

import dataclasses
import heapq
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agentfn_asgi.calls.records import (
    CallKey,
    CallQuery,
    CallRecord,
    CallState,
    ClaimOutcome,
    ClaimStatus,
    DeliveryRecord,
    Limit,
    StoreStats,
)
from agentfn_asgi.calls.states import (
    CLAIM_ORDER,
    OWED_HERE,
    TRANSITIONS,
    WORKLISTS,
    allows,
    apply,
    bucket_tokens,
    holds,
    in_doubt,
    reclaimed,
    refusal,
    within_budget,
)
from agentfn_asgi.errors import StoreUnavailableError
from agentfn_asgi.store._codec import claim_status_for
from agentfn_asgi.store.base import Store

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


class MemoryStore(Store):
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
        """Drop deliveries received, and finished (submitted, stale or cancelled) calls
        updated, before the times."""
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
        self._prune_limiters(calls_before)
        return len(old_deliveries) + len(old_calls)

    def _prune_limiters(self, before: float) -> None:
        """Drop the index entries of calls that moved on (and emptied entries) and the
        buckets last spent before ``before``: the flow-control state of a limiter lasts no
        longer than its calls, whatever values a ``concurrency_key`` took."""
        data, ns = self._data, self.namespace
        for limited, keys in list(data.limited.items()):
            if limited[0] != ns:
                continue
            for key in list(keys):
                other = data.calls.get((ns, key))
                if other is None or other.limiter != limited[1] or other.state not in _LIMITED:
                    keys.discard(key)
            if not keys:
                del data.limited[limited]
        for bucket, (_, updated_at) in list(data.buckets.items()):
            if bucket[0] == ns and updated_at < before:
                del data.buckets[bucket]

    # -- calls: every change is one row of the state table ---------------------------------
    def _get(self, key: CallKey) -> CallRecord | None:
        return self._data.calls.get((self.namespace, key))

    async def _transition(
        self, name: str, key: CallKey, args: Mapping[str, Any], *, record: bool
    ) -> tuple[bool, CallRecord | None]:
        """Row ``name`` on ``key`` by the reference (:func:`apply`), see
        :meth:`Store._transition`."""
        self._check_open()
        current, row = self._get(key), TRANSITIONS[name]
        if current is None or not holds(row, current, args):
            return False, None if current is None else _plain(current)
        return True, _plain(self._put(apply(row, current, args)))

    def _put(self, record: CallRecord) -> CallRecord:
        self._data.calls[(self.namespace, record.key)] = record
        return record

    async def _claim(
        self,
        key: CallKey,
        args: Mapping[str, Any],
        *,
        limit: Limit | None,
        margin: float,
        resolves: str | None,
    ) -> ClaimOutcome:
        """Decide who runs ``key`` by :data:`CLAIM_ORDER`; see :meth:`Store.claim_call`."""
        self._check_open()
        outcome = self._claimed(key, args, limit, margin)
        if resolves is not None:
            self._update_unresolved(resolves, resolved=True)
        return outcome

    def _claimed(
        self, key: CallKey, args: Mapping[str, Any], limit: Limit | None, margin: float
    ) -> ClaimOutcome:
        record = self._get(key)
        nonce, lease_seconds = args["nonce"], args["lease_expires_at"] - args["now"]
        for name, status in CLAIM_ORDER:
            if not holds(TRANSITIONS[name], record, args):
                continue
            if record is not None and name == "reclaim":
                # Our own claim, retried: it is ours already (and asks for a slot if it
                # holds none yet).
                status = reclaimed(record, nonce=nonce)
                if record.state is CallState.WAITING or record.limiter is not None:
                    return ClaimOutcome(status, _plain(record))
            elif name == "take_over" and limit is not None:
                assert record is not None
                if not self._admission(record, limit, margin)[0]:
                    # Taken over only with a slot: a wait would lose the in-doubt flag.
                    return ClaimOutcome(ClaimStatus.BUSY, _plain(record))
            if name != "reclaim":
                record = self._put(apply(TRANSITIONS[name], record, args))
            assert record is not None
            return self._admitted(status, record, limit, lease_seconds, margin)
        assert record is not None
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

    async def count_call(
        self, key: CallKey, *, owner: str, attempt: int, budget: int
    ) -> CallRecord | None:
        """Count the call we hold against its session's budget; see :meth:`Store.count_call`."""
        self._check_open()
        record = self._get(key)
        if record is None or record.counted is not None:
            return None if record is None else _plain(record)
        counted = sum(
            1
            for (ns, other_key), other in self._data.calls.items()
            if ns == self.namespace
            and other_key.session_id == key.session_id
            and other.tool_name == record.tool_name
            and other.counted is not None
        )
        admitted = within_budget(budget=budget, counted=counted)
        args = {
            "now": self._clock(),
            "owner": owner,
            "attempt": attempt,
            "admitted": admitted,
            "counted": counted + 1,
            "detail": f"{counted + 1} of {budget}",
        }
        row = TRANSITIONS["count"]
        if not holds(row, record, args):
            return _plain(record)
        return _plain(self._put(apply(row, record, args)))

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
        record = self._put(
            apply(
                row,
                record,
                {
                    "now": now,
                    "owner": owner,
                    "lease_expires_at": now + lease_seconds,
                    "detail": "" if admitted else reason,
                    "limiter": limit.name,
                },
            )
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
        reason = refusal(
            concurrency=limit.concurrency,
            rate=limit.rate,
            holders=holders,
            ahead=ahead,
            tokens=tokens,
        )
        return not reason, reason

    # -- approval ---------------------------------------------------------------------------
    async def find_approval(self, approval_id: str) -> CallRecord | None:
        """The call whose approval request is ``approval_id``, with its history."""
        self._check_open()
        for record in self._own_calls():
            if record.approval is not None and record.approval.approval_id == approval_id:
                return record
        return None

    async def count_waiting_approvals(self) -> int:
        """How many calls wait for a person."""
        self._check_open()
        return sum(1 for c in self._own_calls() if c.state is CallState.AWAITING_APPROVAL)

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
                if not in_doubt(record, now=now, margin=query.margin):
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

    async def _worklist(
        self,
        name: str,
        *,
        upto: float | None,
        limit: int,
        after: tuple[float, CallKey] | None = None,
    ) -> list[CallRecord]:
        """A worklist's first calls; see :meth:`Store._worklist`."""
        self._check_open()
        work = WORKLISTS[name]
        states = frozenset().union(*work.states)

        def order(record: CallRecord) -> tuple[Any, ...]:
            at = getattr(record, work.column)
            return (at, *_key_tuple(record.key)) if work.by_key else (at,)

        def due(at: float) -> bool:
            return upto is None or (at < upto if work.strict else at <= upto)

        start = None if after is None else (after[0], *_key_tuple(after[1]))
        found = (
            c
            for c in self._own_calls()
            if c.state in states
            and due(getattr(c, work.column))
            and (start is None or order(c) > start)
        )
        # The first few, never a sort of them all (stable: ties keep their order).
        return [_plain(c) for c in heapq.nsmallest(max(0, limit), found, key=order)]

    async def stats(self, *, margin: float = 0.0) -> StoreStats:
        """Counts for operators; ``calls_by_state`` lists every state, zeros included."""
        self._check_open()
        now = self._clock()
        by_state = {state.value: 0 for state in CallState}
        doubtful = successes = failures = 0
        oldest: float | None = None
        for call in self._own_calls():
            by_state[call.state.value] += 1
            if in_doubt(call, now=now, margin=margin):
                doubtful += 1
            if call.state is CallState.SUBMITTED and call.result is not None:
                if call.result.success:
                    successes += 1
                else:
                    failures += 1
            if call.state in OWED_HERE and (oldest is None or call.created_at < oldest):
                oldest = call.created_at
        deliveries = self._own_deliveries()
        return StoreStats(
            deliveries=len(deliveries),
            unresolved_deliveries=sum(1 for d in deliveries if not d.resolved),
            calls_by_state=by_state,
            in_doubt=doubtful,
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


#: The states in which a call with a limiter holds (claimed) or waits for one of its slots.
_LIMITED = frozenset({CallState.CLAIMED, CallState.WAITING})


def _ordered(key: CallKey) -> tuple[str, str, str]:
    """A call key's place among the waiters that arrived at the same time."""
    return key.session_id, key.turn_id, key.call_id


def _plain(record: CallRecord) -> CallRecord:
    # Other backends read the history only when asked: so does this one, for parity.
    return dataclasses.replace(record, history=(), history_dropped=0)


def _key_tuple(key: CallKey) -> tuple[str, str, str]:
    return (key.session_id, key.turn_id, key.call_id)


def _position(record: CallRecord) -> tuple[float, str, str, str]:
    return (record.created_at, *_key_tuple(record.key))
