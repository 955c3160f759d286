"""The store operations that make one row of the state table each, written once for every
backend over one primitive: :meth:`Transitions._transition`.

A backend carries a row out in one atomic step of its own (the memory store runs
:func:`~agentfn_asgi.calls.states.apply`; SQLite and PostgreSQL run the row's statement, Redis its
script, both rendered from the row by :mod:`agentfn_asgi.store.sql.compile` and
:mod:`agentfn_asgi.store.redis.compile`). What is left to
write per operation is what it takes and what it answers, here, once.

:func:`flat_args` spells a step's arguments as the flat values the SQL statements and Lua
scripts read (a saved result and an approval request as their columns).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, Final

from agentfn_asgi.calls.records import ApprovalRequest, CallKey, CallRecord, CallState, SavedResult
from agentfn_asgi.calls.states import Args
from agentfn_asgi.errors import StoreError
from agentfn_asgi.store._codec import approval_detail, saved_detail

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
    """The flat columns of a record field (a result and an approval are several)."""
    if field == "result":
        return RESULT_COLUMNS
    if field == "approval":
        return APPROVAL_COLUMNS
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

    async def _row(self, name: str, key: CallKey, **args: Any) -> CallRecord | None:
        """The record after row ``name``, or None when the row did not apply."""
        done, found = await self._transition(name, key, {"now": self._clock(), **args}, record=True)
        return found if done else None

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
        done, found = await self._transition("save", key, args, record=True)
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
        """Any non-terminal state → ``stale`` (unless updated after ``unchanged_since``)."""
        await self._done("mark_stale", key, since=unchanged_since)

    async def quarantine(self, key: CallKey, *, owner: str, attempt: int, reason: str) -> None:
        """``claimed`` by ``(owner, attempt)`` → ``quarantined``, with ``reason`` kept."""
        await self._done("quarantine", key, owner=owner, attempt=attempt, detail=reason)

    async def schedule_retry(
        self, key: CallKey, *, owner: str, attempt: int, at: float, reason: str
    ) -> bool:
        """``claimed`` by ``(owner, attempt)`` → ``retry_scheduled`` until ``at``."""
        return await self._done(
            "schedule_retry", key, owner=owner, attempt=attempt, at=at, detail=reason
        )

    async def settle(
        self, key: CallKey, *, result: SavedResult, margin: float = 0.0
    ) -> CallRecord | None:
        """An operator's result for a quarantined or in-doubt call; see the protocol."""
        now = self._clock()
        found = await self._row(
            "settle",
            key,
            now=now,
            takeover_before=now - margin,
            result=result,
            detail=saved_detail(result, None),
        )
        return None if found is None else _saved(found, result)

    async def release(
        self, key: CallKey, *, owner: str, lease_seconds: float, margin: float = 0.0
    ) -> CallRecord | None:
        """An operator's re-run: claimed by ``owner`` with the next attempt."""
        now = self._clock()
        return await self._row(
            "release",
            key,
            now=now,
            takeover_before=now - margin,
            owner=owner,
            lease_expires_at=now + lease_seconds,
        )

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
        _, found = await self._transition("request_approval", key, args, record=True)
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
        # above only supplies the fields a decision does not change.
        found = await self._row(
            _DECISIONS[decision],
            key,
            now=now,
            approval_id=approval_id,
            approval=decided,
            detail=approval_detail(decided),
            result=result,
        )
        if found is None or result is None:
            return found
        return _saved(found, result)

    async def claim_approved(
        self, key: CallKey, *, owner: str, lease_seconds: float
    ) -> CallRecord | None:
        """An approved call, claimed by ``owner`` to run as the next attempt."""
        lease = self._clock() + lease_seconds
        return await self._row("run_approved", key, owner=owner, lease_expires_at=lease)

    @abc.abstractmethod
    async def get_call(self, key: CallKey, *, history: bool = False) -> CallRecord | None:
        """The record of one call (see :class:`~agentfn_asgi.store.base.Store`)."""


def _saved(record: CallRecord, result: SavedResult) -> CallRecord:
    """``record`` just saved with ``result``, its text put back where the step left it out."""
    return dataclasses.replace(record, result=result)
