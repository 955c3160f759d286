"""Helpers shared by the store backends: state sets and record <-> flat-mapping codecs.

Every backend keeps a call as one flat row (SQL columns, a Redis hash) with the same field
names, so the conversion to and from :class:`CallRecord` lives here once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agentfn_asgi.records import CallKey, CallRecord, CallState, ClaimStatus, SavedResult

__all__ = [
    "CALL_FIELDS",
    "NON_TERMINAL_STATES",
    "RESULT_STATES",
    "TERMINAL_STATES",
    "claim_status_for",
    "record_from_mapping",
    "record_to_mapping",
    "saved_result_from_json",
    "saved_result_to_json",
]

#: Column / hash-field names of one call, in the SQL column order.
CALL_FIELDS: tuple[str, ...] = (
    "session_id",
    "turn_id",
    "call_id",
    "tool_name",
    "state",
    "attempt",
    "owner",
    "lease_expires_at",
    "created_at",
    "updated_at",
    "delivery_id",
    "success",
    "event_json",
    "idempotency_key",
    "error_type",
    "source",
    "full_output",
)

TERMINAL_STATES: frozenset[str] = frozenset(s.value for s in CallState if s.terminal)
#: Saved but not yet accepted by the API: what ``unsubmitted_results`` returns.
RESULT_STATES: frozenset[str] = frozenset({CallState.SUCCEEDED.value, CallState.FAILED.value})
NON_TERMINAL_STATES: frozenset[str] = frozenset(s.value for s in CallState if not s.terminal)


def claim_status_for(record: CallRecord) -> ClaimStatus:
    """Classify an existing record that a claim did *not* take (new or expired are taken).

    A ``claimed`` record whose lease looks expired here can only be seen when another
    replica with a slower clock wrote it between our write attempt and this read; leaving
    it alone (``BUSY``) is the safe answer, the recovery sweep picks it up later.
    """
    if record.state is CallState.CLAIMED:
        return ClaimStatus.BUSY
    if record.state.has_result and record.state is not CallState.SUBMITTED:
        return ClaimStatus.SAVED
    return ClaimStatus.DONE


def saved_result_to_json(result: SavedResult) -> str:
    """Serialise a :class:`SavedResult` as one compact JSON object (non-ASCII kept as is)."""
    return json.dumps(
        {
            "success": result.success,
            "event_json": result.event_json,
            "idempotency_key": result.idempotency_key,
            "error_type": result.error_type,
            "source": result.source,
            "full_output": result.full_output,
        },
        ensure_ascii=False,
        separators=(",", ":"),
    )


def saved_result_from_json(text: str | bytes) -> SavedResult:
    """Inverse of :func:`saved_result_to_json`."""
    data = json.loads(text)
    return SavedResult(
        success=bool(data["success"]),
        event_json=data["event_json"],
        idempotency_key=data["idempotency_key"],
        error_type=data.get("error_type"),
        source=data.get("source") or "ran",
        full_output=data.get("full_output"),
    )


def record_to_mapping(record: CallRecord) -> dict[str, Any]:
    """Flatten a record into the :data:`CALL_FIELDS` mapping (``None`` for absent values)."""
    result = record.result
    return {
        "session_id": record.key.session_id,
        "turn_id": record.key.turn_id,
        "call_id": record.key.call_id,
        "tool_name": record.tool_name,
        "state": record.state.value,
        "attempt": record.attempt,
        "owner": record.owner,
        "lease_expires_at": record.lease_expires_at,
        "created_at": record.created_at,
        "updated_at": record.updated_at,
        "delivery_id": record.delivery_id,
        "success": None if result is None else result.success,
        "event_json": None if result is None else result.event_json,
        "idempotency_key": None if result is None else result.idempotency_key,
        "error_type": None if result is None else result.error_type,
        "source": None if result is None else result.source,
        "full_output": None if result is None else result.full_output,
    }


def record_from_mapping(row: Mapping[str, Any]) -> CallRecord:
    """Build a record from a :data:`CALL_FIELDS` mapping (a SQL row, a decoded hash).

    A result is present exactly when ``event_json`` is; numbers may arrive as strings
    (Redis) and booleans as integers (SQLite).
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
    )
