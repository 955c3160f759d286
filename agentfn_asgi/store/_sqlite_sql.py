"""SQL text of the SQLite store: the schema and every fixed statement.

Kept apart from :mod:`agentfn_asgi.store.sqlite` so that module holds only the connection,
its worker thread and the store's logic. Bump ``sqlite.SCHEMA_VERSION`` when ``_SCHEMA``
changes.
"""

from __future__ import annotations

from typing import Final

from agentfn_asgi.store._codec import CALL_FIELDS

_SCHEMA: Final = (
    """CREATE TABLE IF NOT EXISTS deliveries (
        delivery_id TEXT PRIMARY KEY,
        session_id  TEXT NOT NULL,
        received_at REAL NOT NULL,
        resolved    INTEGER NOT NULL DEFAULT 0
    )""",
    "CREATE INDEX IF NOT EXISTS deliveries_resolved_received ON deliveries (resolved, received_at)",
    """CREATE TABLE IF NOT EXISTS calls (
        session_id TEXT NOT NULL, turn_id TEXT NOT NULL, call_id TEXT NOT NULL,
        tool_name TEXT NOT NULL, state TEXT NOT NULL, attempt INTEGER NOT NULL, owner TEXT,
        lease_expires_at REAL NOT NULL, created_at REAL NOT NULL, updated_at REAL NOT NULL,
        delivery_id TEXT,
        -- the saved result (all NULL until one is saved; error_type also holds the reason
        -- of a quarantine)
        success INTEGER, event_json TEXT, idempotency_key TEXT, error_type TEXT, source TEXT,
        full_output TEXT,
        PRIMARY KEY (session_id, turn_id, call_id)
    )""",
    "CREATE INDEX IF NOT EXISTS calls_state_lease ON calls (state, lease_expires_at)",
    "CREATE INDEX IF NOT EXISTS calls_state_updated ON calls (state, updated_at)",
)

_RECORD_DELIVERY: Final = """
    INSERT INTO deliveries (delivery_id, session_id, received_at, resolved) VALUES (?, ?, ?, 0)
    ON CONFLICT (delivery_id) DO NOTHING"""
_RESOLVE: Final = "UPDATE deliveries SET resolved = 1 WHERE delivery_id = ? AND resolved = 0"
_COLUMNS: Final = ", ".join(CALL_FIELDS)
_WHERE_KEY: Final = "session_id = ? AND turn_id = ? AND call_id = ?"
_SELECT_CALL: Final = f"SELECT {_COLUMNS} FROM calls WHERE {_WHERE_KEY}"  # noqa: S608
# The upsert takes a new call, or an expired claim, in one statement. RETURNING yields a row
# only when it inserted (attempt 1) or took over (attempt > 1); nothing when it left the row.
_CLAIM: Final = f"""
    INSERT INTO calls (session_id, turn_id, call_id, tool_name, state, attempt, owner,
                       lease_expires_at, created_at, updated_at, delivery_id)
    VALUES (?, ?, ?, ?, 'claimed', 1, ?, ?, ?, ?, ?)
    ON CONFLICT (session_id, turn_id, call_id) DO UPDATE SET
        attempt = calls.attempt + 1,
        owner = excluded.owner,
        lease_expires_at = excluded.lease_expires_at,
        updated_at = excluded.updated_at,
        delivery_id = coalesce(calls.delivery_id, excluded.delivery_id)
    WHERE calls.state = 'claimed' AND calls.lease_expires_at < excluded.updated_at
    RETURNING {_COLUMNS}"""  # noqa: S608
_SAVE: Final = f"""
    UPDATE calls SET state = ?, owner = ?, updated_at = ?, success = ?, event_json = ?,
                     idempotency_key = ?, error_type = ?, source = ?, full_output = ?
    WHERE {_WHERE_KEY} AND state = 'claimed'
    RETURNING {_COLUMNS}"""  # noqa: S608
_RENEW: Final = f"""
    UPDATE calls SET lease_expires_at = ?, updated_at = ?
    WHERE {_WHERE_KEY} AND state = 'claimed' AND owner = ?"""  # noqa: S608
_MARK_SUBMITTED: Final = f"""
    UPDATE calls SET state = 'submitted', updated_at = ?
    WHERE {_WHERE_KEY} AND state IN ('succeeded', 'failed')"""  # noqa: S608
_MARK_STALE: Final = f"""
    UPDATE calls SET state = 'stale', updated_at = ?
    WHERE {_WHERE_KEY} AND state IN ('claimed', 'succeeded', 'failed')"""  # noqa: S608
# The reason goes into error_type: a quarantined call has no result to carry it otherwise.
_QUARANTINE: Final = f"""
    UPDATE calls SET state = 'quarantined', updated_at = ?, error_type = ?
    WHERE {_WHERE_KEY} AND state = 'claimed' AND owner = ?"""  # noqa: S608
# rowid batches keep each delete short so the write lock is never held for long;
# "resolved IN (0, 1)" lets the (resolved, received_at) index serve a plain age filter.
_PRUNE_DELIVERIES: Final = """
    DELETE FROM deliveries WHERE rowid IN (
        SELECT rowid FROM deliveries WHERE resolved IN (0, 1) AND received_at < ? LIMIT ?)"""
_PRUNE_CALLS: Final = """
    DELETE FROM calls WHERE rowid IN (
        SELECT rowid FROM calls
        WHERE state IN ('submitted', 'stale', 'quarantined') AND updated_at < ? LIMIT ?)"""
