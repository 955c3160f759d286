"""The store: the only place where durability and cross-replica atomicity live.

Every backend (``memory://``, ``sqlite:///``, ``redis://``, ``postgresql://``) is a
:class:`Store`. Each method is one atomic step *inside the store* (a unique constraint, a
conditional update, a Lua script, a row lock); no method may read and then write from Python
with a gap another replica could fall into. The values it takes and returns, and the call
states, are in :mod:`agentfn_asgi.calls.records`.

Time comes from the store's injected ``clock`` (Unix seconds, ``time.time`` by default), so
leases are comparable across replicas that share the store.

**Fencing.** A claim is held by ``(owner, attempt)``. Renewing it, saving its result and
quarantining it succeed only for the holder of the claim's current attempt, atomically: a
replica that lost its lease (it stalled, the store was unreachable) and was taken over can
never overwrite what the new holder does. Taking over an expired claim waits ``margin``
seconds past the lease (the clock-skew allowance the holder also fences itself with).

**A retried write recognises itself.** A claim retried after its answer was lost (the
connection dropped after the commit) finds the call claimed by its own owner and returns
it as taken, not busy; a delivery recorded again with the same ``nonce`` is new again.

**Namespaces.** A store instance works in its ``namespace`` (default ``""``): several apps
(one per OpenAI project) can share one database. The namespace is part of every key: nothing
done through one namespace reads, claims, saves, settles, marks, deduplicates against,
lists, counts or prunes a record of another (the same delivery id or call key in two
namespaces are two independent records).

**The state machine.** Which operation may change a call, from which state, under which
guard, to which state, and what it changes, is declared once in
:mod:`agentfn_asgi.calls.states`. A backend carries a row out in one atomic step of its own,
:meth:`Store._transition` (the memory store runs :func:`~agentfn_asgi.calls.states.apply`;
SQLite and PostgreSQL run the row's statement, Redis its script, both rendered from the row
by :mod:`agentfn_asgi.store.sql.compile` and :mod:`agentfn_asgi.store.redis.compile`), and
every operation that makes one row is written here once, over it: a backend writes the
claim, the admission, the budget's count and the reads.

**A write whose answer was lost.** A store sends a step again when the connection drops
before its answer arrives (redis-py's ``Retry``, the PostgreSQL store's one retry), and a
Redis pipeline that lost its connection answers each of its steps with
:class:`~agentfn_asgi.errors.StoreUnavailableError` although they may have run. Either way
the step may have happened, and the row's guard refuses it a second time (the call left the
row's source state). So every operation whose answer matters says how it recognises its own
result in the record as it stands (:meth:`Store._recognised`): the record refused with the
retry, or read back after an unavailable store. A step that leaves nothing of its own to
recognise (``run_approved``, ``release``: any replica, or another poll of this one, could
hold the next attempt; ``settle``: another operator could save the same result) records a
one-off ``nonce`` (:func:`~agentfn_asgi.calls.states.claimed_with`,
:func:`~agentfn_asgi.calls.states.settled_with`).

**History.** Every step of a call is appended to its history in the same atomic step that
makes it (:class:`~agentfn_asgi.calls.records.CallEvent`); content (arguments, output) is never
part of it. The history is bounded: its first ``HISTORY_HEAD`` and last ``HISTORY_TAIL``
events are kept, with a count of those dropped between them.

**Revocations.** A short list of revoked credentials that are otherwise self-contained
(signed, expiring cookies of the operator page): an id and the time it would expire anyway,
after which its entry may be forgotten. Ids are random, so the list is one for the whole
store, not per namespace: a logout holds for every app that shares the store.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from agentfn_asgi.calls.records import (
    ApprovalRequest,
    CallKey,
    CallQuery,
    CallRecord,
    CallState,
    ClaimOutcome,
    DeliveryRecord,
    Limit,
    SavedResult,
    StoreStats,
)
from agentfn_asgi.calls.states import SAVED, claim_nonces, claimed_with, settled_with
from agentfn_asgi.errors import StoreError, StoreUnavailableError
from agentfn_asgi.store._codec import approval_detail, saved_detail

__all__ = ["Store"]

#: The decision on an approval request, by the row that takes it.
_DECISIONS: Final = {"approved": "approve", "denied": "deny", "expired": "expire_approval"}


class Store(abc.ABC):
    """Durable, atomic storage of deliveries and calls. See the module docstring.

    A backend implements the abstract methods; the operations that make one row of the state
    table are written here, over :meth:`_transition`."""

    namespace: str
    _clock: Callable[[], float]

    @property
    @abc.abstractmethod
    def location(self) -> str:
        """Where the data lives, as operators see it (logs, ``status``, the page): an absolute
        path or a URL with the password hidden, and the namespace if any."""

    # -- lifecycle -------------------------------------------------------------------------
    @abc.abstractmethod
    async def open(self) -> None:
        """Connect and create the schema if needed. Idempotent."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Release connections. Idempotent."""

    @abc.abstractmethod
    async def ping(self) -> None:
        """Raise :class:`StoreUnavailableError` when the store cannot be used right now."""

    # -- deliveries ------------------------------------------------------------------------
    @abc.abstractmethod
    async def record_delivery(
        self, delivery_id: str, session_id: str, *, nonce: str | None = None
    ) -> bool:
        """Record a verified delivery; True if new, False if ``delivery_id`` was seen.

        Decided by a unique constraint / ``SET NX``; durable when it returns. A repeat with
        the same non-empty ``nonce`` (our own retried write) also answers True. It is due
        for the recovery sweep from now (``next_attempt_at``).
        """

    @abc.abstractmethod
    async def mark_delivery_resolved(self, delivery_id: str) -> None:
        """The session named by this delivery was read and its calls were dispatched."""

    @abc.abstractmethod
    async def delivery_failed(self, delivery_id: str, *, error: str, retry_at: float) -> None:
        """Resolving the delivery failed: count it, keep ``error``, retry at ``retry_at``."""

    @abc.abstractmethod
    async def unresolved_deliveries(
        self,
        *,
        due_before: float,
        limit: int = 100,
        after: tuple[float, str] | None = None,
    ) -> list[DeliveryRecord]:
        """Unresolved deliveries due at or before ``due_before``, by ``(next_attempt_at,
        delivery_id)``, starting after ``after`` (the last one of the previous page)."""

    @abc.abstractmethod
    async def list_deliveries(
        self, *, unresolved_only: bool = False, limit: int = 50
    ) -> list[DeliveryRecord]:
        """Deliveries, newest first (operators)."""

    @abc.abstractmethod
    async def prune(self, *, deliveries_before: float, calls_before: float) -> int:
        """Remove delivery records received and finished (submitted, stale or cancelled)
        calls last updated before the given times (quarantined and pending calls are never
        pruned), and the flow-control state of limiters idle since ``calls_before`` (a rated
        limiter's bucket last spent before it, which would read full by then: a missing one
        does).

        Must not block the event loop or other replicas for long; returns the deliveries and
        calls removed.
        """

    # -- claiming --------------------------------------------------------------------------
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
        """Atomically decide who runs a call: the first row of
        :data:`~agentfn_asgi.calls.states.CLAIM_ORDER` whose guards hold.

        - absent → insert ``claimed`` owned by ``owner`` (attempt 1): ``CLAIMED``;
        - ``claimed`` with a lease expired more than ``margin`` ago → take it over
          (attempt + 1): ``IN_DOUBT``;
        - ``claimed`` by ``owner`` itself with a live lease (a retried claim) → returned as
          taken, unchanged: ``CLAIMED`` (attempt 1) or ``IN_DOUBT``;
        - ``retry_scheduled`` and due → the next attempt: ``RETRY``;
        - ``claimed`` by another owner, lease live or expired by less than ``margin``: ``BUSY``;
        - ``succeeded``/``failed`` → ``SAVED``; ``submitted``/``stale``/``quarantined`` →
          ``DONE``.

        With ``limit`` (a tool with ``concurrency=`` or ``rate=``), in the same transaction:
        a call the claim takes is admitted as :meth:`admit_call` would (``take_slot``) or
        left ``waiting`` for its holder to poll: ``WAITING``. A ``waiting`` call whose
        waiter's lease lapsed more than ``margin`` ago is adopted (next attempt, not in
        doubt: nothing ran) and admitted or left waiting the same way; our own live waiter,
        claimed again, answers ``WAITING`` unchanged. An in-doubt claim is taken over only
        when the limiter admits it (else ``BUSY``: the sweep tries again), so the in-doubt
        flag is never lost to a wait.

        With ``resolves_delivery`` and a ``delivery_id``, the same atomic step also marks
        that delivery resolved (as :meth:`mark_delivery_resolved`), whatever the claim
        decides: when the claim is its delivery's only one, the call's record carries the
        work from then on, and the delivery needs no write of its own (one round trip
        fewer per delivery). If the claim fails, the delivery stays unresolved.
        """
        now = self._clock()
        # One-off, so that this claim sent again after a lost answer knows its own row.
        nonce = secrets.token_hex(8)
        args = {
            "now": now,
            "key": key,
            "tool_name": tool_name,
            "owner": owner,
            "lease_expires_at": now + lease_seconds,
            "takeover_before": now - margin,
            "delivery_id": delivery_id,
            "nonce": nonce,
            **claim_nonces(nonce),
        }
        resolves = delivery_id if resolves_delivery else None
        return await self._claim(key, args, limit=limit, margin=margin, resolves=resolves)

    @abc.abstractmethod
    async def _claim(
        self,
        key: CallKey,
        args: Mapping[str, Any],
        *,
        limit: Limit | None,
        margin: float,
        resolves: str | None,
    ) -> ClaimOutcome:
        """:meth:`claim_call` in one atomic step (one round trip): ``args`` are the rows'
        (``now``, ``key``, ``tool_name``, ``owner``, ``lease_expires_at``,
        ``takeover_before``, ``delivery_id``, the claim's one-off ``nonce`` and
        :func:`~agentfn_asgi.calls.states.claim_nonces`); ``resolves`` is the delivery to
        mark resolved in the same step, if any."""

    @abc.abstractmethod
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
        """Ask ``limit`` for a slot for the call ``(owner, attempt)`` holds (flow control).

        ``claimed`` without a slot or ``waiting``: admitted → ``claimed`` holding a slot of
        ``limit.name`` (a token spent when it is rated): ``CLAIMED``; refused → ``waiting``
        (its waiter's lease renewed to ``lease_seconds`` from now): ``WAITING``. Already
        holding the slot (a retried admission) → ``CLAIMED``, unchanged. Not held by
        ``(owner, attempt)`` any more → what a claim would answer (``BUSY``, ``SAVED``,
        ``DONE``; None: the call is gone); the caller stops. The rule is
        :func:`agentfn_asgi.calls.states.admits`.
        """

    @abc.abstractmethod
    async def count_call(
        self, key: CallKey, *, owner: str, attempt: int, budget: int
    ) -> CallRecord | None:
        """Count the call ``(owner, attempt)`` holds (``claimed``) against its session's
        budget of its tool (``max_calls_per_session``): in one atomic step, the calls of the
        same session and tool already counted (in any state) are counted and, while they are
        fewer than ``budget``, the call is counted (the ``count`` row: its ``counted`` is its
        place, 1 for the first). Answers the record as it stands after the step: ``counted``
        set when the call is counted (now, or before: a call is counted once, ever, so a
        retried step, a retry, a takeover or a re-run never counts it again), None when the
        budget is spent or the call is not the caller's to count (None: no such call). The
        rule is :func:`agentfn_asgi.calls.states.within_budget`.
        """

    # -- one row each ----------------------------------------------------------------------
    @abc.abstractmethod
    async def _transition(
        self, name: str, key: CallKey, args: Mapping[str, Any], *, record: bool
    ) -> tuple[bool, CallRecord | None]:
        """Make row ``name`` happen to ``key`` in one atomic step, if its guards hold.

        Answers whether it happened and, when ``record`` is asked for, the record as it
        stands after the step (unchanged when refused; None when there is no such call). A
        row that saves a result may answer it without the result's text, which the caller
        holds: :func:`_saved` puts it back.
        """

    async def _transition_each(
        self, name: str, steps: Sequence[tuple[CallKey, Mapping[str, Any]]]
    ) -> list[bool]:
        """Row ``name`` on each ``(key, args)`` of ``steps``, each in its own atomic step
        (never together): whether each happened. Started together here (the SQLite writer
        commits them in one transaction, the Redis store sends them as one pipeline); a
        backend may send them in one round trip of its own."""
        answers = await asyncio.gather(
            *(self._transition(name, key, args, record=False) for key, args in steps)
        )
        return [done for done, _ in answers]

    async def _recognised(
        self,
        name: str,
        key: CallKey,
        args: Mapping[str, Any],
        mine: Callable[[CallRecord], bool],
    ) -> tuple[bool, CallRecord | None]:
        """Row ``name`` as :meth:`_transition` with the record, where a refusal that finds
        ``mine`` true of the record (our own step, its answer lost and the step retried)
        counts as done, and so does an unavailable store (the answer lost, maybe after the
        step) when the record read back is ``mine``; otherwise that error is raised."""
        try:
            done, found = await self._transition(name, key, args, record=True)
        except StoreUnavailableError:
            found = await self.get_call(key)
            if found is None or not mine(found):
                raise
            return True, found
        return done or (found is not None and mine(found)), found

    async def _done(self, name: str, key: CallKey, **args: Any) -> bool:
        """Whether row ``name`` applied."""
        done, _ = await self._transition(name, key, {"now": self._clock(), **args}, record=False)
        return done

    async def renew_lease(
        self, key: CallKey, *, owner: str, attempt: int, lease_seconds: float
    ) -> bool:
        """Extend the lease of ``(owner, attempt)``'s claim; False if it is not theirs."""
        lease = self._clock() + lease_seconds
        return await self._done("renew", key, owner=owner, attempt=attempt, lease_expires_at=lease)

    async def keep_places(
        self, waiters: Sequence[tuple[CallKey, int]], *, owner: str, lease_seconds: float
    ) -> list[bool]:
        """Extend the leases of waiting calls ``(key, attempt)`` that ``owner`` holds,
        without asking their limiter (the waiters behind the head of a line keep their
        place); for each, False if it is not ``waiting`` for that holder any more. Sent
        together: one batch where the backend has one."""
        now = self._clock()
        args = {"now": now, "owner": owner, "lease_expires_at": now + lease_seconds}
        return await self._transition_each(
            "keep_place", [(key, {**args, "attempt": attempt}) for key, attempt in waiters]
        )

    async def save_result(
        self,
        key: CallKey,
        *,
        owner: str,
        attempt: int,
        result: SavedResult,
        duration: float | None = None,
    ) -> CallRecord:
        """Save a result: ``claimed`` by ``(owner, attempt)`` → ``succeeded``/``failed``.

        Fenced and first writer wins: if the claim is another attempt's, or a result is
        already saved, the stored record is returned unchanged (compare its attempt and
        result with yours). Saving also succeeds when our lease expired but nobody took the
        call over since. ``duration`` (seconds to obtain it) goes into the history.
        """
        args = {
            "now": self._clock(),
            "owner": owner,
            "attempt": attempt,
            "result": result,
            "detail": saved_detail(result, duration),
        }
        done, found = await self._recognised(
            "save", key, args, lambda r: _holds_result(r, result, attempt=attempt)
        )
        if found is None:
            raise StoreError(f"cannot save a result for call {key}: it was never claimed")
        return _saved(found, result) if done else found

    async def mark_submitted(self, key: CallKey, *, detail: str = "") -> None:
        """The API accepted the saved result (terminal); ``detail`` (how it was accepted: the
        status and the number of requests) goes into the history. Anything but a saved
        result is left alone."""
        await self._done("mark_submitted", key, detail=detail)

    async def submission_failed(self, key: CallKey, *, detail: str, retry_at: float) -> None:
        """Submitting the saved result failed: count it, record ``detail`` in the history,
        let the sweep retry it at ``retry_at``."""
        await self._done("submission_failed", key, detail=detail, retry_at=retry_at)

    async def mark_stale(self, key: CallKey, *, unchanged_since: float | None = None) -> None:
        """The API no longer waits for this saved result (terminal); it is never sent again.

        With ``unchanged_since``, only a record not updated after that time is marked: what
        another replica saved after the caller's session read stands.
        """
        await self._done("mark_stale", key, since=unchanged_since)

    async def cancel(self, key: CallKey, *, owner: str, reason: str, known_before: float) -> bool:
        """The API stopped waiting for this call before it had a result (its turn cancelled
        or failed, its session deleted): ``cancelled`` (terminal), with ``reason`` kept,
        from whatever unsaved state it is in (running, waiting for a slot, a retry or a
        person). Whoever holds it learns it when its next renewal or save is refused; a
        waiter leaves its limiter's line. ``owner`` is the replica that noticed.

        Only a call first claimed no later than ``known_before`` (the time of the session
        read that no longer lists it) is cancelled: one claimed after may be newer than that
        read. Returns whether it was cancelled.
        """
        return await self._done("cancel", key, owner=owner, detail=reason, since=known_before)

    async def leave(self, key: CallKey, *, owner: str, attempt: int, reason: str) -> bool:
        """Nobody here answers this pending action: ``(owner, attempt)``'s claim becomes
        ``unanswered`` (``reason`` in its history), shown with its age and left to whoever
        answers it; a claim of it answers ``DONE``. Returns whether it was left."""
        args = {"now": self._clock(), "owner": owner, "attempt": attempt, "detail": reason}

        def mine(record: CallRecord) -> bool:
            # Only the holder leaves it: an unanswered record of its attempt is its own.
            return record.state is CallState.UNANSWERED and record.attempt == attempt

        done, _ = await self._recognised("leave", key, args, mine)
        return done

    async def take_up(
        self, key: CallKey, *, owner: str, lease_seconds: float, nonce: str | None = None
    ) -> CallRecord | None:
        """An ``unanswered`` call that a policy or hook here answers now, or a ``retired``
        turn-less action that is pending again: claimed by ``owner`` as the next attempt,
        first claimed now. None when it is in neither state (another took it up). The
        claim records ``nonce`` (None: a new random one), as :meth:`release` does."""
        return await self._claim_again("take_up", key, owner, lease_seconds, 0.0, nonce)

    async def retire(self, key: CallKey, *, known_before: float) -> bool:
        """A turn-less action (an ``environment_connection``, an unknown type) that the
        session read at ``known_before`` no longer lists: its occurrence is over
        (``retired``, terminal), if it was first claimed no later than that and is
        ``unanswered`` or finished. Its next occurrence takes it up again. Returns whether
        it was retired."""
        return await self._done("retire", key, since=known_before)

    async def quarantine(self, key: CallKey, *, owner: str, attempt: int, reason: str) -> None:
        """Hold an in-doubt call for an operator instead of answering it (terminal).

        Only ``(owner, attempt)``'s claim is quarantined (a saved result always wins);
        ``reason`` is kept as the record's ``reason``.
        """
        await self._done("quarantine", key, owner=owner, attempt=attempt, detail=reason)

    async def schedule_retry(
        self, key: CallKey, *, owner: str, attempt: int, at: float, reason: str
    ) -> bool:
        """``claimed`` by ``(owner, attempt)`` → ``retry_scheduled``: the next attempt may
        start at ``at`` (Unix time; kept as ``next_attempt_at`` and ``lease_expires_at``), by
        whoever claims the call then (:meth:`claim_call` answers ``RETRY``). ``reason`` goes
        to the history. False when the claim is not theirs (fencing): nothing changed."""
        args = {"now": self._clock(), "owner": owner, "attempt": attempt, "at": at}

        def mine(record: CallRecord) -> bool:
            # (owner, attempt) names one holder's claim: only it schedules its retry.
            return record.state is CallState.RETRY_SCHEDULED and (
                record.owner,
                record.attempt,
                record.lease_expires_at,
            ) == (owner, attempt, at)

        done, _ = await self._recognised("schedule_retry", key, {**args, "detail": reason}, mine)
        return done

    async def settle(
        self,
        key: CallKey,
        *,
        result: SavedResult,
        margin: float = 0.0,
        nonce: str | None = None,
    ) -> CallRecord | None:
        """An operator's result for a quarantined call, or an in-doubt one (claimed, lease
        expired more than ``margin`` ago): saved as for a handler (``settled`` in the
        history). None when the call is in no such state (running, saved, done, unknown).
        The step records ``nonce`` (None: a new random one), by which it recognises itself
        when its answer was lost (:func:`~agentfn_asgi.calls.states.settled_with`)."""
        now, nonce = self._clock(), nonce or secrets.token_hex(8)
        args = {
            "now": now,
            "takeover_before": now - margin,
            "result": result,
            "detail": saved_detail(result, None),
            "nonce": nonce,
        }
        done, found = await self._recognised(
            "settle", key, args, lambda r: settled_with(r, nonce=nonce)
        )
        return _saved(found, result) if done and found is not None else None

    async def release(
        self,
        key: CallKey,
        *,
        owner: str,
        lease_seconds: float,
        margin: float = 0.0,
        nonce: str | None = None,
    ) -> CallRecord | None:
        """An operator's re-run of a quarantined or in-doubt call: claimed by ``owner`` with
        the next attempt (``released`` in the history). None when it is in no such state.
        The claim records ``nonce`` (None: a new random one), by which it recognises itself
        when its answer was lost (:func:`~agentfn_asgi.calls.states.claimed_with`)."""
        return await self._claim_again("release", key, owner, lease_seconds, margin, nonce)

    # -- approval (rows request_approval … run_approved) -----------------------------------
    async def request_approval(
        self, key: CallKey, *, owner: str, attempt: int, request: ApprovalRequest
    ) -> CallRecord:
        """``claimed`` by ``(owner, attempt)`` → ``awaiting_approval`` with ``request`` (its
        lease becomes the request's expiry; ``approval_requested`` in the history). Returns
        the record as it stands: unchanged when the claim is not theirs (compare its
        ``approval``). StoreError if the call was never claimed."""
        args = {
            "now": self._clock(),
            "owner": owner,
            "attempt": attempt,
            "expires_at": request.expires_at,
            "approval": request,
            "detail": approval_detail(request),
        }
        _, found = await self._recognised(
            "request_approval", key, args, lambda r: r.approval == request
        )
        if found is None:
            raise StoreError(f"cannot hold call {key} for approval: it was never claimed")
        return found

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
        """Take the decision on the waiting request ``approval_id`` of ``key``, once.

        ``decision`` ``approved`` (→ ``approved``; the request must be open), ``denied``
        (→ ``failed`` with ``result``; open) or ``expired`` (→ ``failed`` with ``result``;
        lapsed). Who (``by``), how (``via``) and why (``reason``) go on the request and in
        the history. None when refused: not waiting, another request, already decided, or
        the expiry does not allow it."""
        current = await self.get_call(key)
        if current is None or current.approval is None:
            return None
        now = self._clock()
        decided = dataclasses.replace(
            current.approval,
            decision=decision,
            decided_by=by,
            decided_via=via,
            decided_at=now,
            reason=reason,
        )
        # The row's guards (still waiting, this request, its expiry) decide; the request read
        # above only supplies the fields a decision does not change. Ours, if its answer was
        # lost: the request as decided here (who, how, when to the clock's precision).
        args = {
            "now": now,
            "approval_id": approval_id,
            "approval": decided,
            "detail": approval_detail(decided),
            "result": result,
        }
        done, found = await self._recognised(
            _DECISIONS[decision], key, args, lambda r: r.approval == decided
        )
        if not done or found is None:
            return None
        return found if result is None else _saved(found, result)

    async def claim_approved(
        self, key: CallKey, *, owner: str, lease_seconds: float, nonce: str | None = None
    ) -> CallRecord | None:
        """``approved`` → ``claimed`` by ``owner`` with the next attempt (a fresh run). None
        when it is not ``approved`` (another claim took it first, even one of the same
        ``owner``). The claim records ``nonce`` (None: a new random one), by which it
        recognises itself when its answer was lost
        (:func:`~agentfn_asgi.calls.states.claimed_with`)."""
        return await self._claim_again("run_approved", key, owner, lease_seconds, 0.0, nonce)

    async def _claim_again(
        self,
        row: str,
        key: CallKey,
        owner: str,
        lease_seconds: float,
        margin: float,
        nonce: str | None,
    ) -> CallRecord | None:
        """Row ``row``, a claim by ``owner`` as the next attempt that records ``nonce`` (None:
        a new random one), recognised by it when its answer was lost: the record, or None."""
        now, nonce = self._clock(), nonce or secrets.token_hex(8)
        args = {
            "now": now,
            "takeover_before": now - margin,
            "owner": owner,
            "lease_expires_at": now + lease_seconds,
            "nonce": nonce,
        }
        done, found = await self._recognised(
            row, key, args, lambda r: claimed_with(r, owner=owner, nonce=nonce)
        )
        return found if done else None

    # -- reads -----------------------------------------------------------------------------
    @abc.abstractmethod
    async def get_call(self, key: CallKey, *, history: bool = False) -> CallRecord | None:
        """The record of one call (with its history if asked), or None."""

    @abc.abstractmethod
    async def find_calls(self, call_id: str) -> list[CallRecord]:
        """Every call with this ``call_id``, in any session, with its history (operators)."""

    @abc.abstractmethod
    async def calls_for_session(self, session_id: str) -> list[CallRecord]:
        """Every call recorded for a session (any state), oldest first."""

    @abc.abstractmethod
    async def list_calls(self, query: CallQuery) -> list[CallRecord]:
        """Calls matching ``query``, newest first (operators; no history)."""

    @abc.abstractmethod
    async def _worklist(
        self,
        name: str,
        *,
        upto: float | None,
        limit: int,
        after: tuple[float, CallKey] | None = None,
    ) -> list[CallRecord]:
        """The first ``limit`` calls of :data:`~agentfn_asgi.calls.states.WORKLISTS`
        ``name`` whose column is at or before ``upto`` (None: any), in its order, starting
        after the position ``after`` (its column's value and key)."""

    async def unsubmitted_results(
        self,
        *,
        due_before: float,
        limit: int = 100,
        after: tuple[float, CallKey] | None = None,
    ) -> list[CallRecord]:
        """Calls in ``succeeded``/``failed`` due for (re)submission at or before
        ``due_before``, by ``(next_attempt_at, key)``, starting after ``after``."""
        return await self._worklist(
            "unsubmitted_results", upto=due_before, limit=limit, after=after
        )

    async def expired_claims(self, *, margin: float = 0.0, limit: int = 100) -> list[CallRecord]:
        """Calls in ``claimed`` (in doubt) or ``waiting`` (their holder gone) whose lease
        expired more than ``margin`` ago, earliest expiry first."""
        upto = self._clock() - margin
        return await self._worklist("expired_claims", upto=upto, limit=limit)

    async def due_retries(self, *, limit: int = 100) -> list[CallRecord]:
        """Calls in ``retry_scheduled`` whose time has come, earliest first (the sweep
        claims them, so a restart or another replica resumes them)."""
        return await self._worklist("due_retries", upto=self._clock(), limit=limit)

    @abc.abstractmethod
    async def find_approval(self, approval_id: str) -> CallRecord | None:
        """The call whose request is ``approval_id`` (decided or not), with its history."""

    async def waiting_approvals(
        self, *, expired_by: float | None = None, limit: int = 100
    ) -> list[CallRecord]:
        """Calls in ``awaiting_approval`` (with ``expired_by``: only those whose request
        expired at or before it), soonest expiry first."""
        return await self._worklist("waiting_approvals", upto=expired_by, limit=limit)

    @abc.abstractmethod
    async def count_waiting_approvals(self) -> int:
        """How many calls are in ``awaiting_approval``: a count the store keeps or reads
        from its index of them (never the rows), cheap enough for a gauge."""

    async def approved_calls(self, *, limit: int = 100) -> list[CallRecord]:
        """Calls in ``approved`` (decided, not yet claimed to run), oldest decision first."""
        return await self._worklist("approved_calls", upto=None, limit=limit)

    @abc.abstractmethod
    async def stats(self, *, margin: float = 0.0) -> StoreStats:
        """Counts for operators; in doubt: claimed, its lease run out more than ``margin``
        seconds ago (:func:`agentfn_asgi.calls.states.in_doubt`)."""

    # -- revocations -----------------------------------------------------------------------
    @abc.abstractmethod
    async def revoke_token(self, token_id: str, *, expires_at: float) -> None:
        """Record that the credential ``token_id`` is revoked; ``expires_at`` (Unix time) is
        when it would expire anyway, after which the entry may be dropped. Idempotent."""

    @abc.abstractmethod
    async def token_revoked(self, token_id: str) -> bool:
        """Whether ``token_id`` was revoked (and its entry has not expired yet)."""


def _holds_result(record: CallRecord, result: SavedResult, *, attempt: int) -> bool:
    """Does ``record`` hold ``result``, saved by ``attempt``? Only that attempt's holder
    saves in it (fencing), so it is our own save."""
    saved = record.result
    return (
        record.state in SAVED
        and record.attempt == attempt
        and saved is not None
        and (saved.success, saved.event_json) == (result.success, result.event_json)
    )


def _saved(record: CallRecord, result: SavedResult) -> CallRecord:
    """``record`` just saved with ``result``, its text put back where the step left it out."""
    return dataclasses.replace(record, result=result)
