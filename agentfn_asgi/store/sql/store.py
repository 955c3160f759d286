"""The SQL state machine of the SQLite and PostgreSQL stores, written once; read top to bottom.

The fragments they share and the schema are in :mod:`agentfn_asgi.store.sql.schema`.

3. **Statements**, in the order of a call's life, in :mod:`agentfn_asgi.store.sql.statements`.
   What a claim does to which state, the first-writer-wins save and the allowed transitions
   are decided there, inside one statement each, never by reading and then writing from
   Python.
4. :class:`SQLStore`, here: every :class:`~agentfn_asgi.store.base.Store` method over those
   statements. A backend subclasses it and supplies only the plumbing: connecting, and four
   primitives that run statements with its driver.

Flow control (a claim with a ``limit``, ``admit_call``) is the one place where a decision
needs several statements: the limiter's holders, waiters and bucket are counted, the rule
(:func:`~agentfn_asgi.calls.states.admits`) is applied here, and the call's row changes by the
answer, all in one transaction that holds the limiter's lock (PostgreSQL: an advisory lock
on the namespace and limiter; SQLite: the write lock, taken when the transaction begins).
Such a transaction is written once, as a generator of statements (:data:`Steps`) that each
backend runs with its driver; every statement still carries its row's guard.

How the text is written. Parameters are named (``:now``). ``{p}`` before every table and
index name, the column types (``{text}``…) and the rest of what the two databases spell
differently are filled in by the dialect layer (:mod:`agentfn_asgi.store.sql.dialect`). The
shared fragments (``{key}``, ``{columns}``, and the state predicates ``{claimed}``,
``{saved}``, ``{pending}``, ``{terminal}``) are filled in here, once. Queries and partial
indexes use the *same* predicate text on purpose: SQLite uses a partial index only when the
query repeats the index's condition term for term.

Adding a column: its ``(name, type)`` in :data:`CALL_COLUMNS` (a new database is made with
it), a step adding it to a database made before (:data:`~agentfn_asgi.store.sql.schema.STEPS`,
additive: the release before keeps working beside this one), the statement that writes it
below, its field in :class:`~agentfn_asgi.calls.records.CallRecord` and its reading in
:func:`~agentfn_asgi.store._codec.record_from_mapping`.

Every record is keyed by its namespace first (``(namespace, session_id, turn_id, call_id)``,
``(namespace, delivery_id)``): ``{key}`` and every other condition name ``:namespace``, the
store's, so a store never reads or changes another namespace's rows.

A call's history is bounded text (:func:`~agentfn_asgi.store.sql.schema.append_sql`): its
first events in ``history`` (JSON objects, no separator), its last ones in ``history_tail``
(one per line) and the count of all in ``history_count``;
:func:`~agentfn_asgi.calls.records.parse_history` reads both parts back. ``{columns}`` (the hot
path: claims, saves, the sweep) leaves them out; ``{detail_columns}`` adds them.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agentfn_asgi.calls.records import (
    LIMITER_KEY_SEPARATOR,
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
    TRANSITIONS,
    WORKLISTS,
    admission_bounds,
    allows,
    bucket_tokens,
    reclaimed,
    refusal,
    within_budget,
)
from agentfn_asgi.errors import StoreError
from agentfn_asgi.store._codec import claim_status_for, flat_args, record_from_mapping
from agentfn_asgi.store.base import Store
from agentfn_asgi.store.sql.schema import DETAIL_COLUMNS, HOT_COLUMNS, Row
from agentfn_asgi.store.sql.statements import (
    ADMISSION,
    BUDGET_COUNTED,
    CALLS_FOR_SESSION,
    CLAIM,
    CLAIM_NEW,
    COUNT_WAITING_APPROVALS,
    DELIVERY_FAILED,
    FIND_APPROVAL,
    FIND_CALLS,
    GET_CALL,
    GET_CALL_DETAIL,
    GET_CALL_FOR_UPDATE,
    LIST_DELIVERIES,
    LIST_UNRESOLVED,
    PRUNE_BATCH,
    PRUNE_BUCKETS,
    PRUNE_CALLS,
    PRUNE_DELIVERIES,
    RECORD_DELIVERY,
    RESOLVE_DELIVERY,
    REVOKE_TOKEN,
    SPEND_TOKEN,
    STATS,
    TOKEN_REVOKED,
    TOKENS_EXPIRED,
    TRANSITIONS_COUNTED,
    TRANSITIONS_RETURNING,
    UNRESOLVED_DELIVERIES,
    UNRESOLVED_DELIVERIES_AFTER,
    WORKLIST_READS,
    list_calls_statement,
)

__all__ = ["SQLStore", "Statement", "Steps", "run_steps"]

_T = TypeVar("_T")

#: How many steps of a batch (:meth:`SQLStore._transition_each`) share one transaction.
EACH_CHUNK = 32

#: The admission row, by the call's state and the limiter's answer.
_ADMISSIONS = {
    (CallState.CLAIMED, True): "take_slot",
    (CallState.CLAIMED, False): "wait",
    (CallState.WAITING, True): "admit",
    (CallState.WAITING, False): "keep_waiting",
}


# -- 4. the store, over three primitives ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Statement:
    """A statement template (above) with the values of its named parameters."""

    template: str
    params: Mapping[str, object] = field(default_factory=dict)


#: A transaction's work, written once for both databases: it yields each statement to run
#: and is sent back that statement's rows; what it returns is the transaction's answer.
Steps = Generator[Statement, list[Row], _T]


def run_steps(steps: Steps[_T], run: Callable[[Statement], list[Row]]) -> _T:
    """Run ``steps`` with ``run`` (a synchronous driver: SQLite's), to its answer."""
    try:
        statement = next(steps)
        while True:
            statement = steps.send(run(statement))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class _Admission:
    """The limiter's answer for one call, with why it refused (the ``waiting`` event's
    detail: ``concurrency`` or ``rate``) and the bucket's tokens now."""

    admitted: bool
    reason: str
    tokens: float


def _call_record(row: Row) -> CallRecord:
    names = DETAIL_COLUMNS if len(row) == len(DETAIL_COLUMNS) else HOT_COLUMNS
    return record_from_mapping(dict(zip(names, row, strict=True)))


def _delivery(row: Row) -> DeliveryRecord:
    delivery_id, session_id, received_at, resolved, attempts, next_at, error = row
    return DeliveryRecord(
        str(delivery_id),
        str(session_id),
        float(received_at),
        bool(resolved),
        int(attempts),
        float(next_at),
        None if error is None else str(error),
    )


class SQLStore(Store):
    """Every :class:`~agentfn_asgi.store.base.Store` method over the statements above.

    A backend adds ``open``/``close``/``ping`` and the three primitives, each of which turns
    its driver's errors into :class:`StoreError`/:class:`StoreUnavailableError` (``action``
    names the operation, for those messages).
    """

    def __init__(self, *, clock: Callable[[], float], namespace: str = "") -> None:
        self._clock = clock
        self.namespace = namespace

    def _key(self, key: CallKey) -> dict[str, object]:
        # The namespace is part of every key: a store never touches another namespace's row.
        return {
            "namespace": self.namespace,
            "session_id": key.session_id,
            "turn_id": key.turn_id,
            "call_id": key.call_id,
        }

    @abc.abstractmethod
    async def _count(self, action: str, statement: Statement) -> int:
        """Run one statement; the number of rows it changed."""

    @abc.abstractmethod
    async def _rows(self, action: str, statement: Statement) -> list[Row]:
        """Run one statement; every row it returned."""

    @abc.abstractmethod
    async def _first_row(
        self, action: str, *statements: Statement, also: str | None = None
    ) -> tuple[int, Row] | None:
        """Run statements in order on one connection until one returns a row.

        Returns that statement's index and first row, or None when none returned a row.
        ``also`` (the template of a write returning nothing, bound to the first statement's
        parameters) commits atomically with the first statement, in the same round trip
        where the database allows it.
        """

    @abc.abstractmethod
    async def _transaction(self, action: str, limiter: str, work: Callable[[], Steps[_T]]) -> _T:
        """Run the statements of ``work()`` in one transaction holding ``limiter``'s lock in
        this namespace (no other such transaction of the limiter runs meanwhile, from any
        replica), and rows read in it unchanged by others to its end; its answer. A retried
        transaction calls ``work`` again."""

    async def _read(self, action: str, statement: Statement) -> list[Row]:
        """Run one read of the operators (the overview's counts, the listings); every row it
        returned. The same as :meth:`_rows` unless the backend has a better place for reads
        that must not hold up its writes (SQLite: a reader connection off the event loop)."""
        return await self._rows(action, statement)

    async def _pruned(self) -> None:
        """After a batch of prune's deletes: give the space freed back, where the database
        does not on its own (PostgreSQL's autovacuum reuses it: nothing to do here)."""

    async def _calls(
        self, action: str, template: str, params: Mapping[str, object]
    ) -> list[CallRecord]:
        return [_call_record(row) for row in await self._rows(action, Statement(template, params))]

    # -- deliveries ------------------------------------------------------------------------
    async def record_delivery(
        self, delivery_id: str, session_id: str, *, nonce: str | None = None
    ) -> bool:
        """Record a delivery; True if new, or our own retried write (same ``nonce``)."""
        params = {
            "delivery_id": delivery_id,
            "session_id": session_id,
            "now": self._clock(),
            "namespace": self.namespace,
            "nonce": nonce or None,
        }
        return await self._count("record_delivery", Statement(RECORD_DELIVERY, params)) == 1

    async def mark_delivery_resolved(self, delivery_id: str) -> None:
        """Mark a delivery resolved; unknown ids are ignored."""
        params = {"namespace": self.namespace, "delivery_id": delivery_id}
        await self._count("mark_delivery_resolved", Statement(RESOLVE_DELIVERY, params))

    async def delivery_failed(self, delivery_id: str, *, error: str, retry_at: float) -> None:
        """Count a failed resolve, keep its error, retry at ``retry_at``."""
        params = {
            "namespace": self.namespace,
            "delivery_id": delivery_id,
            "error": error,
            "retry_at": retry_at,
        }
        await self._count("delivery_failed", Statement(DELIVERY_FAILED, params))

    async def unresolved_deliveries(
        self,
        *,
        due_before: float,
        limit: int = 100,
        after: tuple[float, str] | None = None,
    ) -> list[DeliveryRecord]:
        """Unresolved deliveries due at or before ``due_before``, soonest first."""
        params: dict[str, object] = {
            "namespace": self.namespace,
            "due_before": due_before,
            "limit": max(0, limit),
        }
        template = UNRESOLVED_DELIVERIES
        if after is not None:
            template = UNRESOLVED_DELIVERIES_AFTER
            params.update(after_at=after[0], after_id=after[1])
        rows = await self._rows("unresolved_deliveries", Statement(template, params))
        return [_delivery(row) for row in rows]

    async def list_deliveries(
        self, *, unresolved_only: bool = False, limit: int = 50
    ) -> list[DeliveryRecord]:
        """Deliveries, newest first."""
        template = LIST_UNRESOLVED if unresolved_only else LIST_DELIVERIES
        params = {"namespace": self.namespace, "limit": max(0, limit)}
        rows = await self._read("list_deliveries", Statement(template, params))
        return [_delivery(row) for row in rows]

    async def prune(self, *, deliveries_before: float, calls_before: float) -> int:
        """Delete old deliveries, old finished (submitted, stale or cancelled) calls and the
        buckets of limiters idle since ``calls_before``, in batches of 500 rows; the
        deliveries and calls removed.

        Each batch is its own short statement, so other work gets the lock in between; the
        space it freed is given back (:meth:`_pruned`) before the next.
        """
        removed = 0
        for template, before in (
            (PRUNE_DELIVERIES, deliveries_before),
            (PRUNE_CALLS, calls_before),
            (PRUNE_BUCKETS, calls_before),
        ):
            params = {"before": before, "batch": PRUNE_BATCH, "namespace": self.namespace}
            statement = Statement(template, params)
            while True:
                count = await self._count("prune", statement)
                if template is not PRUNE_BUCKETS:
                    removed += count
                if count:
                    await self._pruned()
                if count < PRUNE_BATCH:
                    break
        return removed

    # -- calls -----------------------------------------------------------------------------
    async def _claim(
        self,
        key: CallKey,
        args: Mapping[str, Any],
        *,
        limit: Limit | None,
        margin: float,
        resolves: str | None,
    ) -> ClaimOutcome:
        """Decide who runs ``key`` with one upsert; see :meth:`Store.claim_call`."""
        now, nonce = args["now"], args["nonce"]
        params = {**self._key(key), **flat_args(args)}
        # The delivery's resolution rides on the claim's first statement.
        resolve = RESOLVE_DELIVERY if resolves is not None else None
        if limit is not None:
            return await self._transaction(
                "claim_call",
                limit.name,
                lambda: self._claim_limited(
                    key, params, limit, now=now, margin=margin, resolve=resolve
                ),
            )
        # Without a limit: one statement for a new call; the retry of a due call follows on
        # the same connection only when the upsert declined the row.
        claim, retry = Statement(CLAIM, params), Statement(TRANSITIONS_RETURNING["retry"], params)
        read = Statement(GET_CALL, self._key(key))
        # Left alone, the row is read back only to report what the upsert decided: states
        # never return to "claimed", so that read classifies correctly (claim_status_for
        # has the one clock-skew case). It finds nothing only when prune() removed a
        # finished call in between; the next upsert then inserts it afresh.
        for _ in range(3):
            found = await self._first_row("claim_call", claim, retry, read, also=resolve)
            resolve = None  # committed with the first statement
            if found is None:
                continue
            taken, row = found
            record = _call_record(row)
            if taken == 0:
                return ClaimOutcome(reclaimed(record, nonce=nonce), record)
            if taken == 1:
                return ClaimOutcome(ClaimStatus.RETRY, record)
            if allows(TRANSITIONS["adopt"], record, now=now, margin=margin):
                # A dead waiter, claimed without a limit (rare: its tool's claims pass one):
                # adopted, as the next attempt. Its statement's guard decides; asked only
                # when the read saw one, so no other claim pays a statement for it.
                adopt = Statement(TRANSITIONS_RETURNING["adopt"], params)
                adopted = await self._first_row("claim_call", adopt)
                if adopted is None:
                    continue
                return ClaimOutcome(ClaimStatus.CLAIMED, _call_record(adopted[1]))
            return ClaimOutcome(claim_status_for(record), record)
        raise StoreError(f"call {key} changed under the claim three times")

    def _claim_limited(
        self,
        key: CallKey,
        params: Mapping[str, object],
        limit: Limit,
        *,
        now: float,
        margin: float,
        resolve: str | None,
    ) -> Steps[ClaimOutcome]:
        """The claim of a limited tool's call, in the limiter's transaction: the memory
        store's ``claim_call`` step by step (the same rows, in the same order), each row's
        statement carrying its guard, then the admission of the call it took (and
        ``resolve``, the delivery's resolution, in the same transaction)."""
        owner = params["owner"]
        if resolve is not None:
            yield Statement(resolve, params)
        for _ in range(3):
            rows = yield Statement(CLAIM_NEW, params)
            if rows:
                return (yield from self._admitted(ClaimStatus.CLAIMED, rows[0], limit, params, now))
            rows = yield Statement(GET_CALL_FOR_UPDATE, self._key(key))
            if not rows:
                continue  # pruned since the insert met it: insert it afresh
            record = _call_record(rows[0])
            if allows(TRANSITIONS["reclaim"], record, now=now, owner=str(owner)):
                # Our own claim, retried: it is ours already (and asks for a slot if it
                # holds none yet).
                status = reclaimed(record, nonce=str(params["nonce"]))
                if record.state is CallState.CLAIMED and record.limiter is None:
                    return (yield from self._admitted(status, rows[0], limit, params, now))
                return ClaimOutcome(status, record)
            if allows(TRANSITIONS["retry"], record, now=now):
                rows = yield Statement(TRANSITIONS_RETURNING["retry"], params)
                status = ClaimStatus.RETRY
            elif allows(TRANSITIONS["adopt"], record, now=now, margin=margin):
                rows = yield Statement(TRANSITIONS_RETURNING["adopt"], params)
                status = ClaimStatus.CLAIMED
            elif allows(TRANSITIONS["take_over"], record, now=now, margin=margin):
                # Taken over only with a slot: a wait would lose the in-doubt flag.
                admission = yield from self._admission(record, limit, params, now)
                if not admission.admitted:
                    return ClaimOutcome(ClaimStatus.BUSY, record)
                rows = yield Statement(CLAIM, params)
                if rows:
                    return (
                        yield from self._admitted(
                            ClaimStatus.IN_DOUBT, rows[0], limit, params, now, admission
                        )
                    )
                continue
            else:
                return ClaimOutcome(claim_status_for(record), record)
            if rows:
                return (yield from self._admitted(status, rows[0], limit, params, now))
        raise StoreError(f"call {key} changed under the claim three times")

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
        now = self._clock()
        params = {
            **self._key(key),
            "owner": owner,
            "now": now,
            "takeover_before": now - margin,
            "lease_expires_at": now + lease_seconds,
        }

        def steps() -> Steps[ClaimOutcome | None]:
            rows = yield Statement(GET_CALL_FOR_UPDATE, self._key(key))
            if not rows:
                return None
            record = _call_record(rows[0])
            held = record.owner == owner and record.attempt == attempt
            if held and record.state is CallState.CLAIMED and record.limiter == limit.name:
                return ClaimOutcome(ClaimStatus.CLAIMED, record)  # a retried admission
            if not held or record.state not in (CallState.CLAIMED, CallState.WAITING):
                return ClaimOutcome(claim_status_for(record), record)
            return (yield from self._admitted(ClaimStatus.CLAIMED, rows[0], limit, params, now))

        return await self._transaction("admit_call", limit.name, steps)

    async def count_call(
        self, key: CallKey, *, owner: str, attempt: int, budget: int
    ) -> CallRecord | None:
        """Count the call we hold against its session's budget, in one transaction holding
        the session's budget lock; see :meth:`Store.count_call`."""
        now = self._clock()

        def steps() -> Steps[CallRecord | None]:
            rows = yield Statement(GET_CALL_FOR_UPDATE, self._key(key))
            if not rows:
                return None
            record = _call_record(rows[0])
            if record.counted is not None:
                return record  # counted once, ever (a retried step finds it so)
            found = yield Statement(
                BUDGET_COUNTED,
                {
                    "namespace": self.namespace,
                    "session_id": key.session_id,
                    "tool_name": record.tool_name,
                },
            )
            counted = int(found[0][0])
            if not within_budget(budget=budget, counted=counted):
                return record
            changed = yield Statement(
                TRANSITIONS_RETURNING["count"],
                {
                    **self._key(key),
                    "now": now,
                    "owner": owner,
                    "attempt": attempt,
                    "admitted": 1,
                    "counted": counted + 1,
                    "detail": f"{counted + 1} of {budget}",
                },
            )
            return _call_record(changed[0]) if changed else record

        # One lock per session (a name no limiter has: tool names hold no separator), so
        # two replicas never count the same budget's calls at once.
        lock = f"{LIMITER_KEY_SEPARATOR}budget{LIMITER_KEY_SEPARATOR}{key.session_id}"
        return await self._transaction("count_call", lock, steps)

    def _admitted(
        self,
        status: ClaimStatus,
        row: Row,
        limit: Limit,
        params: Mapping[str, object],
        now: float,
        admission: _Admission | None = None,
    ) -> Steps[ClaimOutcome]:
        """The holder of ``row``'s call (``claimed`` or ``waiting``) asks ``limit`` for a
        slot: ``take_slot`` / ``admit`` (answering ``status``, a token spent when rated) or
        ``wait`` / ``keep_waiting`` (answering ``WAITING``), its lease renewed either way."""
        record = _call_record(row)
        if admission is None:
            admission = yield from self._admission(record, limit, params, now)
        template = TRANSITIONS_RETURNING[_ADMISSIONS[(record.state, admission.admitted)]]
        changed = yield Statement(
            template,
            {
                **params,
                "owner": record.owner,
                "attempt": record.attempt,
                "admitted": int(admission.admitted),
                "limiter": limit.name,
                "detail": admission.reason,
            },
        )
        if not changed:  # pragma: no cover - the row is held to the end of the transaction
            raise StoreError(f"call {record.key} changed during its admission")
        if admission.admitted and limit.rate is not None:
            spent = {
                "namespace": self.namespace,
                "limiter": limit.name,
                "tokens": admission.tokens - 1.0,
                "now": now,
            }
            yield Statement(SPEND_TOKEN, spent)
        outcome = status if admission.admitted else ClaimStatus.WAITING
        return ClaimOutcome(outcome, _call_record(changed[0]))

    def _admission(
        self, record: CallRecord, limit: Limit, params: Mapping[str, object], now: float
    ) -> Steps[_Admission]:
        """The limiter's answer for ``record`` (:func:`~agentfn_asgi.calls.states.admits`), from
        its holders, the live waiters ahead of the call and its bucket, counted now (each
        count up to its bound: :func:`~agentfn_asgi.calls.states.admission_bounds`)."""
        holders_bound, ahead_bound = admission_bounds(
            concurrency=limit.concurrency, rate=limit.rate, burst=limit.burst
        )
        found = yield Statement(
            ADMISSION,
            {
                **self._key(record.key),
                "limiter": limit.name,
                "takeover_before": params["takeover_before"],
                "created_at": record.created_at,
                "holders_bound": holders_bound,
                "ahead_bound": ahead_bound,
            },
        )
        counted_holders, counted_ahead, stored, updated_at = found[0]
        holders, ahead, tokens = int(counted_holders), int(counted_ahead), 0.0
        if limit.rate is not None:
            tokens = bucket_tokens(
                None if stored is None else float(stored),
                now if updated_at is None else float(updated_at),
                now=now,
                rate=limit.rate,
                burst=limit.burst,
            )
        reason = refusal(
            concurrency=limit.concurrency,
            rate=limit.rate,
            holders=holders,
            ahead=ahead,
            tokens=tokens,
        )
        return _Admission(not reason, reason, tokens)

    async def _transition(
        self, name: str, key: CallKey, args: Mapping[str, Any], *, record: bool
    ) -> tuple[bool, CallRecord | None]:
        """Row ``name``'s statement on ``key``; see :meth:`Store._transition`."""
        params = {**self._key(key), **flat_args(args)}
        variant = f"{name}+since"
        if args.get("since") is None or variant not in TRANSITIONS_COUNTED:
            variant = name
        if not record:
            changed = await self._count(name, Statement(TRANSITIONS_COUNTED[variant], params))
            return changed == 1, None
        found = await self._first_row(
            name,
            Statement(TRANSITIONS_RETURNING[variant], params),
            Statement(GET_CALL, self._key(key)),
        )
        if found is None:
            return False, None
        return found[0] == 0, _call_record(found[1])

    async def _transition_each(
        self, name: str, steps: Sequence[tuple[CallKey, Mapping[str, Any]]]
    ) -> list[bool]:
        """Row ``name``'s statement on each key, :data:`EACH_CHUNK` to a transaction: one
        round trip of the pool and one commit per chunk (on PostgreSQL a thousand
        statements committed one by one held every connection of the pool for about 0.4 s),
        and row locks held only for a chunk's time (a chunk of a thousand held a waiter's
        row for 0.6 s while it asked for its turn). Its lock is no limiter's: admissions
        never wait for it."""

        def each(chunk: Sequence[tuple[CallKey, Mapping[str, Any]]]) -> Steps[list[bool]]:
            done = []
            for key, args in chunk:
                params = {**self._key(key), **flat_args(args)}
                rows = yield Statement(TRANSITIONS_RETURNING[name], params)
                done.append(bool(rows))
            return done

        answers: list[bool] = []
        for at in range(0, len(steps), EACH_CHUNK):
            chunk = steps[at : at + EACH_CHUNK]
            answers += await self._transaction(name, "", functools.partial(each, chunk))
        return answers

    async def _worklist(
        self,
        name: str,
        *,
        upto: float | None,
        limit: int,
        after: tuple[float, CallKey] | None = None,
    ) -> list[CallRecord]:
        """A worklist's first calls, one statement; see :meth:`Store._worklist`."""
        params: dict[str, object] = {"namespace": self.namespace, "limit": max(0, limit)}
        if upto is not None:
            params["upto"] = upto
        if after is not None:
            at, key = after
            params.update(
                after_at=at,
                after_session=key.session_id,
                after_turn=key.turn_id,
                after_call=key.call_id,
            )
        template = WORKLIST_READS[name, upto is not None, after is not None]
        read = self._read if WORKLISTS[name].listing else self._rows
        return [_call_record(row) for row in await read(name, Statement(template, params))]

    # -- approval ------------------------------------------------------------------------
    async def find_approval(self, approval_id: str) -> CallRecord | None:
        """The call whose approval request is ``approval_id``, with its history."""
        params = {"namespace": self.namespace, "approval_id": approval_id}
        found = await self._first_row("find_approval", Statement(FIND_APPROVAL, params))
        return None if found is None else _call_record(found[1])

    async def count_waiting_approvals(self) -> int:
        """How many calls wait for a person (their tally)."""
        params = {"namespace": self.namespace}
        found = await self._first_row(
            "count_waiting_approvals", Statement(COUNT_WAITING_APPROVALS, params)
        )
        return 0 if found is None else int(found[1][0])

    async def get_call(self, key: CallKey, *, history: bool = False) -> CallRecord | None:
        """The record of ``key`` (with its history if asked), or None."""
        template = GET_CALL_DETAIL if history else GET_CALL
        found = await self._first_row("get_call", Statement(template, self._key(key)))
        return None if found is None else _call_record(found[1])

    async def find_calls(self, call_id: str) -> list[CallRecord]:
        """Every call with ``call_id`` in this namespace, with its history."""
        params = {"namespace": self.namespace, "call_id": call_id}
        rows = await self._read("find_calls", Statement(FIND_CALLS, params))
        return [_call_record(row) for row in rows]

    async def calls_for_session(self, session_id: str) -> list[CallRecord]:
        """Every call of a session, oldest first."""
        params = {"namespace": self.namespace, "session_id": session_id}
        return await self._calls("calls_for_session", CALLS_FOR_SESSION, params)

    async def list_calls(self, query: CallQuery) -> list[CallRecord]:
        """Calls matching ``query``, newest first."""
        params: dict[str, object] = {"namespace": self.namespace, "limit": max(0, query.limit)}
        filters: list[str] = []
        if query.state == "in_doubt":
            filters.append("in_doubt")
            params["takeover_before"] = self._clock() - query.margin
        elif query.state is not None:
            filters.append("state")
            params["state"] = query.state
        for name in ("session_id", "tool_name", "since"):
            value = getattr(query, name)
            if value is not None:
                filters.append(name)
                params[name] = value
        if query.before is not None:
            filters.append("before")
            at, session_id, turn_id, call_id = query.before
            params.update(
                before_at=at, before_session=session_id, before_turn=turn_id, before_call=call_id
            )
        statement = Statement(list_calls_statement(filters), params)
        return [_call_record(row) for row in await self._read("list_calls", statement)]

    async def stats(self, *, margin: float = 0.0) -> StoreStats:
        """Counts for operators, read in one snapshot from the tallies and indexes (never
        every row); every state is listed, zeros too."""
        params = {"takeover_before": self._clock() - margin, "namespace": self.namespace}
        figures = {
            str(name): value for name, value in await self._read("stats", Statement(STATS, params))
        }

        def count(name: str) -> int:
            return int(figures.get(name) or 0)

        successes, failures = count("calls.submitted"), count("calls.submitted.failed")
        by_state = {state.value: count(f"calls.{state.value}") for state in CallState}
        by_state[CallState.SUBMITTED.value] = successes + failures
        oldest = figures.get("oldest_pending")
        return StoreStats(
            deliveries=count("deliveries"),
            unresolved_deliveries=count("unresolved"),
            calls_by_state=by_state,
            in_doubt=count("in_doubt"),
            oldest_pending_at=None if oldest is None else float(oldest),
            successes=successes,
            failures=failures,
            failing_deliveries=count("failing"),
        )

    # -- revocations -----------------------------------------------------------------------
    async def revoke_token(self, token_id: str, *, expires_at: float) -> None:
        """Revoke ``token_id`` until ``expires_at``; expired entries are dropped here."""
        now = self._clock()
        await self._count("revoke_token", Statement(TOKENS_EXPIRED, {"now": now}))
        if expires_at > now:
            params = {"token_id": token_id, "expires_at": expires_at}
            await self._count("revoke_token", Statement(REVOKE_TOKEN, params))

    async def token_revoked(self, token_id: str) -> bool:
        """Whether ``token_id`` is revoked and its entry not expired."""
        params = {"token_id": token_id, "now": self._clock()}
        return bool(await self._rows("token_revoked", Statement(TOKEN_REVOKED, params)))
