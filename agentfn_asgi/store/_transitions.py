"""The store operations that make one row of the state table each, written once for every
backend over one primitive: :meth:`Transitions._transition`.

A backend carries a row out in one atomic step of its own (the memory store runs
:func:`~agentfn_asgi.calls.states.apply`; SQLite and PostgreSQL run the row's statement, Redis its
script, both rendered from the row by :mod:`agentfn_asgi.store.sql.compile` and
:mod:`agentfn_asgi.store.redis.compile`). What is left to
write per operation is what it takes and what it answers, here, once.

:func:`flat_args` spells a step's arguments as the flat values the SQL statements and Lua
scripts read (a saved result and an approval request as their columns).

**A write whose answer was lost.** A store sends a step again when the connection drops
before its answer arrives (redis-py's ``Retry``, the PostgreSQL store's one retry), and a
Redis pipeline that lost its connection answers each of its steps with
:class:`~agentfn_asgi.errors.StoreUnavailableError` although they may have run. Either way
the step may have happened, and the row's guard refuses it a second time (the call left the
row's source state). So every operation whose answer matters says how it recognises its own
result in the record as it stands (:meth:`Transitions._recognised`): the record refused
with the retry, or read back after an unavailable store. A step that leaves nothing of its
own to recognise (``run_approved``, ``release``: any replica, or another poll of this one,
could hold the next attempt; ``settle``: another operator could save the same result)
records a one-off ``nonce`` (:func:`~agentfn_asgi.calls.states.claimed_with`,
:func:`~agentfn_asgi.calls.states.settled_with`).
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

from agentfn_asgi.calls.records import ApprovalRequest, CallKey, CallRecord, CallState, SavedResult
from agentfn_asgi.calls.states import SAVED, Args, claimed_with, settled_with
from agentfn_asgi.errors import StoreError, StoreUnavailableError
from agentfn_asgi.store._codec import REASON_COLUMN, approval_detail, saved_detail

__all__ = ["APPROVAL_COLUMNS", "RESULT_COLUMNS", "Transitions", "flat_args", "flat_columns"]

#: The columns (SQL) and hash fields (Redis) of a saved result, besides its state.
RESULT_COLUMNS: Final = (
    "success",
    "event_json",
    "idempotency_key",
    "error_type",
    "source",
    "full_output",
)
#: The columns of an approval request: its id (to be found by) and the request as JSON.
APPROVAL_COLUMNS: Final = ("approval_id", "approval")


def flat_columns(field: str) -> tuple[str, ...]:
    """The flat columns of a record field (a result and an approval are several; ``reason``
    keeps the name schema 1 was released with)."""
    if field == "result":
        return RESULT_COLUMNS
    if field == "approval":
        return APPROVAL_COLUMNS
    if field == "reason":
        return (REASON_COLUMN,)
    return (field,)


#: The decision on an approval request, by the row that takes it.
_DECISIONS = {"approved": "approve", "denied": "deny", "expired": "expire_approval"}


def flat_args(args: Args) -> dict[str, Any]:
    """``args`` as flat values: a ``result`` as its state and :data:`RESULT_COLUMNS`, an
    ``approval`` as its JSON and (unless the step names one) its ``approval_id``, the
    limiter's answer ``admitted`` as 1 or 0; a claim's ``key`` as its three ids."""
    flat = {name: value for name, value in args.items() if name not in ("result", "approval")}
    result: SavedResult | None = args.get("result")
    if result is not None:
        flat["state"] = (CallState.SUCCEEDED if result.success else CallState.FAILED).value
        flat.update({name: getattr(result, name) for name in RESULT_COLUMNS})
    approval: ApprovalRequest | None = args.get("approval")
    if approval is not None:
        flat["approval"] = approval.to_json()
        flat.setdefault("approval_id", approval.approval_id)
    if isinstance(args.get("admitted"), bool):
        flat["admitted"] = int(args["admitted"])
    key: CallKey | None = args.get("key")
    if key is not None:
        flat.update(session_id=key.session_id, turn_id=key.turn_id, call_id=key.call_id)
        del flat["key"]
    return flat


class Transitions(abc.ABC):
    """The one-row operations of :class:`~agentfn_asgi.store.base.Store` and
    :class:`~agentfn_asgi.store.base.ApprovalStore`, over :meth:`_transition`."""

    _clock: Callable[[], float]

    @abc.abstractmethod
    async def _transition(
        self, name: str, key: CallKey, args: Mapping[str, Any], *, record: bool
    ) -> tuple[bool, CallRecord | None]:
        """Make row ``name`` happen to ``key`` in one atomic step, if its guards hold.

        Answers whether it happened and, when ``record`` is asked for, the record as it
        stands after the step (unchanged when refused; None when there is no such call). A
        row that saves a result may answer it without the result's text, which the caller
        holds: :meth:`_saved` puts it back.
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
        """Extend ``(owner, attempt)``'s lease; False if the claim is not theirs."""
        lease = self._clock() + lease_seconds
        return await self._done("renew", key, owner=owner, attempt=attempt, lease_expires_at=lease)

    async def keep_places(
        self, waiters: Sequence[tuple[CallKey, int]], *, owner: str, lease_seconds: float
    ) -> list[bool]:
        """Extend the leases of ``owner``'s waiting calls; see :meth:`Store.keep_places`."""
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
        """Fenced, first writer wins; see :meth:`Store.save_result`."""
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
        """``succeeded``/``failed`` → ``submitted``; anything else is left alone."""
        await self._done("mark_submitted", key, detail=detail)

    async def submission_failed(self, key: CallKey, *, detail: str, retry_at: float) -> None:
        """Record a failed submission; the sweep retries it at ``retry_at``."""
        await self._done("submission_failed", key, detail=detail, retry_at=retry_at)

    async def mark_stale(self, key: CallKey, *, unchanged_since: float | None = None) -> None:
        """A saved result → ``stale`` (unless updated after ``unchanged_since``)."""
        await self._done("mark_stale", key, since=unchanged_since)

    async def cancel(self, key: CallKey, *, owner: str, reason: str, known_before: float) -> bool:
        """A call without a result → ``cancelled``, ``reason`` kept, if first claimed no
        later than ``known_before``; see :meth:`Store.cancel`."""
        return await self._done("cancel", key, owner=owner, detail=reason, since=known_before)

    async def quarantine(self, key: CallKey, *, owner: str, attempt: int, reason: str) -> None:
        """``claimed`` by ``(owner, attempt)`` → ``quarantined``, with ``reason`` kept."""
        await self._done("quarantine", key, owner=owner, attempt=attempt, detail=reason)

    async def schedule_retry(
        self, key: CallKey, *, owner: str, attempt: int, at: float, reason: str
    ) -> bool:
        """``claimed`` by ``(owner, attempt)`` → ``retry_scheduled`` until ``at``."""
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
        """An operator's result for a quarantined or in-doubt call; see the protocol."""
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
        """An operator's re-run: claimed by ``owner`` with the next attempt."""
        now, nonce = self._clock(), nonce or secrets.token_hex(8)
        args = {
            "now": now,
            "takeover_before": now - margin,
            "owner": owner,
            "lease_expires_at": now + lease_seconds,
            "nonce": nonce,
        }
        done, found = await self._recognised(
            "release", key, args, lambda r: claimed_with(r, owner=owner, nonce=nonce)
        )
        return found if done else None

    # -- actions nobody here answers ----------------------------------------------------
    async def leave(self, key: CallKey, *, owner: str, attempt: int, reason: str) -> bool:
        """``claimed`` by ``(owner, attempt)`` → ``unanswered``: nobody here answers it
        (``reason`` says why); see :meth:`Store.leave`."""
        args = {"now": self._clock(), "owner": owner, "attempt": attempt, "detail": reason}

        def mine(record: CallRecord) -> bool:
            # Only the holder leaves it: an unanswered record of its attempt is its own.
            return record.state is CallState.UNANSWERED and record.attempt == attempt

        done, _ = await self._recognised("leave", key, args, mine)
        return done

    async def take_up(
        self, key: CallKey, *, owner: str, lease_seconds: float, nonce: str | None = None
    ) -> CallRecord | None:
        """An ``unanswered`` or ``retired`` call, claimed by ``owner`` as its next attempt
        (None: in neither state); see :meth:`Store.take_up`."""
        now, nonce = self._clock(), nonce or secrets.token_hex(8)
        args = {"now": now, "owner": owner, "lease_expires_at": now + lease_seconds, "nonce": nonce}
        done, found = await self._recognised(
            "take_up", key, args, lambda r: claimed_with(r, owner=owner, nonce=nonce)
        )
        return found if done else None

    async def retire(self, key: CallKey, *, known_before: float) -> bool:
        """End the occurrence of a turn-less action a read no longer lists; see
        :meth:`Store.retire`."""
        return await self._done("retire", key, since=known_before)

    # -- approval ------------------------------------------------------------------------
    async def request_approval(
        self, key: CallKey, *, owner: str, attempt: int, request: ApprovalRequest
    ) -> CallRecord:
        """Hold ``key`` for a person; see :class:`~agentfn_asgi.store.base.ApprovalStore`."""
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
        """Decide a waiting request once; see :class:`~agentfn_asgi.store.base.ApprovalStore`."""
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
        """An approved call, claimed by ``owner`` to run as the next attempt (None: not
        approved, or claimed by another claim, even another of the same ``owner``)."""
        now, nonce = self._clock(), nonce or secrets.token_hex(8)
        args = {"now": now, "owner": owner, "lease_expires_at": now + lease_seconds, "nonce": nonce}
        done, found = await self._recognised(
            "run_approved", key, args, lambda r: claimed_with(r, owner=owner, nonce=nonce)
        )
        return found if done else None

    @abc.abstractmethod
    async def get_call(self, key: CallKey, *, history: bool = False) -> CallRecord | None:
        """The record of one call (see :class:`~agentfn_asgi.store.base.Store`)."""


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
