"""Helpers shared by every store backend: a call as flat fields, classifying a claim.

Every backend but memory keeps a call as one flat row (SQL columns, a Redis hash) with the
same field names, so turning one into a :class:`CallRecord`, and a step's arguments into
the flat values its statement or script reads (:func:`flat_args`), live here once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from agentfn_asgi.calls.records import (
    ApprovalRequest,
    CallKey,
    CallRecord,
    CallState,
    ClaimStatus,
    SavedResult,
    parse_history,
)
from agentfn_asgi.calls.states import Args

__all__ = [
    "APPROVAL_COLUMNS",
    "REASON_COLUMN",
    "RESULT_COLUMNS",
    "approval_detail",
    "claim_status_for",
    "flat_args",
    "flat_columns",
    "record_from_mapping",
    "saved_detail",
]

#: The column (SQL) and hash field (Redis) of :attr:`CallRecord.reason`: schema 1 was
#: released with this name, and a released column keeps its name (docs/versions.md).
REASON_COLUMN = "quarantine_reason"

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


def claim_status_for(record: CallRecord) -> ClaimStatus:
    """Classify an existing record that a claim did *not* take (new or expired are taken).

    A ``claimed`` record whose lease looks expired here can only be seen when another
    replica with a slower clock wrote it between our write attempt and this read; leaving
    it alone (``BUSY``) is the safe answer, the recovery sweep picks it up later.
    """
    if record.state in (CallState.CLAIMED, CallState.RETRY_SCHEDULED, CallState.WAITING):
        # A retry not due yet (its time is kept), or another replica's waiter: someone runs it.
        return ClaimStatus.BUSY
    if record.state.has_result and record.state is not CallState.SUBMITTED:
        return ClaimStatus.SAVED
    return ClaimStatus.DONE


def approval_detail(request: ApprovalRequest) -> str:
    """The history's ``detail`` of an approval step: the request, or who decided, how and
    why (an approver's reason is theirs to write, never the call's content)."""
    if request.decision is None:
        return f"approval_id={request.approval_id} expires_at={request.expires_at:.3f}"
    parts = [f"approval_id={request.approval_id}", f"decision={request.decision}"]
    if request.decided_by:
        parts.append(f"by={request.decided_by}")
    if request.decided_via:
        parts.append(f"via={request.decided_via}")
    if request.reason:
        parts.append(f"reason={request.reason}")
    return " ".join(parts)


def saved_detail(result: SavedResult, duration: float | None) -> str:
    """The history's ``detail`` of a saved result: how it was obtained, never what it says."""
    parts = [f"source={result.source}"]
    parts.append("success" if result.success else f"error={result.error_type or 'failure'}")
    if duration is not None:
        parts.append(f"duration={duration:.3f}s")
    return " ".join(parts)


def record_from_mapping(row: Mapping[str, Any]) -> CallRecord:
    """Build a record from a flat mapping of call fields (a SQL row, a decoded Redis hash).

    The field names are the SQL columns (``_sql.CALL_COLUMNS``). A result is present exactly
    when ``event_json`` is; numbers may arrive as strings (Redis) and booleans as integers
    (SQLite); absent optional fields may be missing or None.
    """
    event_json = row.get("event_json")
    result = None
    if event_json is not None:
        success = row.get("success")
        if isinstance(success, str):
            success = success not in ("", "0", "false", "False")
        result = SavedResult(
            success=bool(success),
            event_json=str(event_json),
            idempotency_key=str(row.get("idempotency_key") or ""),
            error_type=row.get("error_type") or None,
            source=row.get("source") or "ran",
            full_output=row.get("full_output"),
        )
    # A bounded history is kept in two parts on SQL: its first events, then its last ones
    # (``history_tail``), and ``history_count`` counts every event, the dropped ones too;
    # Redis keeps one list and counts the dropped ones (``history_dropped``).
    history = parse_history(row.get("history")) + parse_history(row.get("history_tail"))
    if "history_dropped" in row:
        dropped = int(row.get("history_dropped") or 0)
    else:
        dropped = max(0, int(row.get("history_count") or 0) - len(history))
    return CallRecord(
        key=CallKey(str(row["session_id"]), str(row["turn_id"]), str(row["call_id"])),
        tool_name=str(row["tool_name"]),
        state=CallState(row["state"]),
        attempt=int(row["attempt"]),
        owner=row.get("owner") or None,
        lease_expires_at=float(row["lease_expires_at"]),
        created_at=float(row["created_at"]),
        updated_at=float(row["updated_at"]),
        delivery_id=row.get("delivery_id") or None,
        result=result,
        reason=row.get(REASON_COLUMN) or None,
        history=history,
        next_attempt_at=float(row.get("next_attempt_at") or 0.0),
        failures=int(row.get("failures") or 0),
        history_dropped=dropped,
        # A request is kept whole as JSON; its id has a column of its own to be found by.
        approval=ApprovalRequest.from_json(row.get("approval")) if row.get("approval_id") else None,
        limiter=row.get("limiter") or None,
        nonce=row.get("nonce") or None,
        counted=None if row.get("counted") in (None, "") else int(row["counted"]),
    )
