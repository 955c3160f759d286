"""The schema of the SQL stores and the fragments their statements share.

1. **Fragments**: the state predicates (``{claimed}``, ``{saved}``…), the key condition,
   the column lists, and :func:`event_sql`, which builds one history event inside a
   statement; :func:`fill` puts them into a statement template.
2. **Schema**: the tables, their partial indexes, the schema version and the upgrades that
   bring an older database to it (:func:`schema_changes`).

The statements are in :mod:`agentfn_asgi.store._sql_statements`; the store over them in
:mod:`agentfn_asgi.store._sql`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Final

from agentfn_asgi.errors import StoreError
from agentfn_asgi.records import CallState
from agentfn_asgi.store._sql_dialect import WORDS

__all__ = [
    "CALL_COLUMNS",
    "COLUMN_LIST",
    "DELIVERY_LIST",
    "DETAIL_COLUMNS",
    "DETAIL_COLUMN_LIST",
    "DETAIL_SQL",
    "FRAGMENTS",
    "HOT_COLUMNS",
    "INDEXES",
    "OWNER_SQL",
    "SCHEMA_VERSION",
    "TABLES",
    "UPGRADES",
    "Row",
    "check_schema_version",
    "event_sql",
    "fill",
    "schema_changes",
]

#: One result row, by position (an ``sqlite3`` tuple or an ``asyncpg.Record``).
Row = Sequence[Any]

# -- 1. shared fragments -------------------------------------------------------------------


def _state_in(*states: CallState) -> str:
    # Always in CallState order, so a query and a partial index spell it identically.
    listed = [state for state in CallState if state in states]
    if len(listed) == 1:
        return f"state = '{listed[0].value}'"
    return "state IN ({})".format(", ".join(f"'{state.value}'" for state in listed))


#: What ``{name}`` stands for in the statements below, in both dialects.
FRAGMENTS: Final[Mapping[str, str]] = {
    "key": "session_id = :session_id AND turn_id = :turn_id AND call_id = :call_id",
    "claimed": _state_in(CallState.CLAIMED),
    "saved": _state_in(CallState.SUCCEEDED, CallState.FAILED),
    "pending": _state_in(*(state for state in CallState if not state.terminal)),
    "terminal": _state_in(*(state for state in CallState if state.terminal)),
    "finished": _state_in(CallState.SUBMITTED, CallState.STALE),
    "count_by_state": ", ".join(
        f"count(*) FILTER (WHERE {_state_in(state)})" for state in CallState
    ),
}


def event_sql(kind: str, attempt: str, *, owner: str = "NULL", detail: str = "NULL") -> str:
    """SQL building one history event (:class:`~agentfn_asgi.records.CallEvent` as JSON),
    from the statement's own values: ``attempt``, ``owner`` and ``detail`` are SQL
    expressions. The ``{{`` escapes survive :func:`_sql`."""
    return (
        "CAST({{json_object}}('at', CAST(:now AS {{real}}), 'kind', '" + kind + "', "
        "'attempt', " + attempt + ", 'owner', " + owner + ", 'detail', " + detail + ") "
        "AS {{text}})"
    )


OWNER_SQL: Final = "CAST(:owner AS {{text}})"
DETAIL_SQL: Final = "CAST(:detail AS {{text}})"


def fill(template: str) -> str:
    """A statement ``template`` with the shared fragments in; the dialect's words are kept."""
    kept = {word: "{" + word + "}" for word in WORDS}
    return template.format(
        **kept, **FRAGMENTS, columns=COLUMN_LIST, detail_columns=DETAIL_COLUMN_LIST
    )


# -- 2. schema -----------------------------------------------------------------------------

#: Bump with an entry in UPGRADES. SQLite keeps it in ``PRAGMA user_version``, PostgreSQL in
#: the ``schema_version`` table of the store's schema.
SCHEMA_VERSION: Final = 4

DELIVERY_COLUMNS: Final = (
    ("delivery_id", "{text} PRIMARY KEY"),
    ("session_id", "{text} NOT NULL"),
    ("received_at", "{real} NOT NULL"),
    ("resolved", "{boolean} NOT NULL DEFAULT false"),
    ("namespace", "{text} NOT NULL DEFAULT ''"),
    # the recovery sweep's retries: how many failed, the last error, when it is due again
    ("attempts", "{integer} NOT NULL DEFAULT 0"),
    ("next_attempt_at", "{real} NOT NULL DEFAULT 0"),
    ("last_error", "{text}"),
    # who recorded it: a retried write recognises itself by it
    ("nonce", "{text}"),
)
DELIVERY_LIST: Final = (
    "delivery_id, session_id, received_at, resolved, attempts, next_attempt_at, last_error"
)
#: The columns of a call, in the order every statement returns them; ``history`` last.
CALL_COLUMNS: Final = (
    ("session_id", "{text} NOT NULL"),
    ("turn_id", "{text} NOT NULL"),
    ("call_id", "{text} NOT NULL"),
    ("tool_name", "{text} NOT NULL"),
    ("state", "{text} NOT NULL"),
    ("attempt", "{integer} NOT NULL"),
    ("owner", "{text}"),
    ("lease_expires_at", "{real} NOT NULL"),
    ("created_at", "{real} NOT NULL"),
    ("updated_at", "{real} NOT NULL"),
    ("delivery_id", "{text}"),
    # the saved result: all NULL until one is saved
    ("success", "{boolean}"),
    ("event_json", "{text}"),
    ("idempotency_key", "{text}"),
    ("error_type", "{text}"),
    ("source", "{text}"),
    ("full_output", "{text}"),
    # why the call is held for an operator (state quarantined)
    ("quarantine_reason", "{text}"),
    # when the sweep may retry a saved result's submission, and how many failed
    ("next_attempt_at", "{real} NOT NULL DEFAULT 0"),
    ("failures", "{integer} NOT NULL DEFAULT 0"),
    ("namespace", "{text} NOT NULL DEFAULT ''"),
    ("history", "{text}"),
)
#: Revoked credentials (operator-page sessions), one store-wide list (see Store).
REVOKED_TOKEN_COLUMNS: Final = (
    ("token_id", "{text} PRIMARY KEY"),
    ("expires_at", "{real} NOT NULL"),
)
HOT_COLUMNS: Final = tuple(name for name, _ in CALL_COLUMNS if name not in ("namespace", "history"))
DETAIL_COLUMNS: Final = (*HOT_COLUMNS, "history")
COLUMN_LIST: Final = ", ".join(HOT_COLUMNS)
DETAIL_COLUMN_LIST: Final = ", ".join(DETAIL_COLUMNS)

#: table -> (columns, table constraint)
TABLES: Final = {
    "deliveries": (DELIVERY_COLUMNS, ""),
    "calls": (CALL_COLUMNS, "PRIMARY KEY (session_id, turn_id, call_id)"),
    "revoked_tokens": (REVOKED_TOKEN_COLUMNS, ""),
}

# Each one serves a query below, so recovery and pruning never scan the whole table; the
# operators' listings and stats() do (rarely). Every index costs each write that changes
# its rows: none more.
INDEXES: Final = (
    # unresolved_deliveries (the sweep's order and cursor)
    "CREATE INDEX IF NOT EXISTS deliveries_due"
    " ON {p}deliveries (namespace, next_attempt_at, delivery_id) WHERE NOT resolved",
    # prune, list_deliveries
    "CREATE INDEX IF NOT EXISTS deliveries_received ON {p}deliveries (received_at)",
    # expired_claims
    "CREATE INDEX IF NOT EXISTS calls_claimed ON {p}calls (lease_expires_at) WHERE {claimed}",
    # unsubmitted_results (the sweep's order and cursor)
    "CREATE INDEX IF NOT EXISTS calls_due"
    " ON {p}calls (namespace, next_attempt_at, session_id, turn_id, call_id) WHERE {saved}",
    # prune (quarantined calls wait for an operator: never pruned)
    "CREATE INDEX IF NOT EXISTS calls_finished ON {p}calls (updated_at) WHERE {finished}",
)

#: version -> what brings the data of the version before to it, run once, after the tables
#: got their missing columns and the indexes above exist. Each statement must also be
#: harmless on a database that never had the old shape (a PostgreSQL schema made before
#: versions were recorded counts as version 0 and runs every upgrade).
UPGRADES: Final[Mapping[int, tuple[str, ...]]] = {
    # SQLite files of version 1 kept a quarantine's reason in error_type (a quarantined call
    # has no result), and had other indexes. PostgreSQL always had the column, and an index
    # for a stats query that is now one scan.
    2: (
        "UPDATE {p}calls SET quarantine_reason = coalesce(quarantine_reason, error_type),"
        " error_type = NULL WHERE state = 'quarantined' AND error_type IS NOT NULL",
        "DROP INDEX IF EXISTS {p}deliveries_resolved_received",
        "DROP INDEX IF EXISTS {p}calls_state_lease",
        "DROP INDEX IF EXISTS {p}calls_state_updated",
        "DROP INDEX IF EXISTS {p}calls_pending",
    ),
    # Version 4 added the revoked_tokens table (created like any missing table): no data.
    # Version 3 added retry backoff (due now), namespaces (''), history (none before) and
    # indexes in the sweep's order; quarantined calls are no longer pruned.
    3: (
        "UPDATE {p}deliveries SET next_attempt_at = received_at WHERE next_attempt_at = 0",
        "UPDATE {p}calls SET next_attempt_at = updated_at WHERE next_attempt_at = 0",
        "DROP INDEX IF EXISTS {p}deliveries_unresolved",
        "DROP INDEX IF EXISTS {p}calls_unsubmitted",
        "DROP INDEX IF EXISTS {p}calls_terminal",
    ),
}


def check_schema_version(version: int, where: str) -> None:
    """Refuse a database written by a newer agentfn-asgi instead of misreading it."""
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{where} has schema version {version}; this agentfn-asgi understands up to "
            f"{SCHEMA_VERSION}: upgrade the package"
        )


def schema_changes(version: int, existing: Mapping[str, Collection[str]]) -> list[str]:
    """The statements that bring a database at ``version`` to :data:`SCHEMA_VERSION`.

    ``existing`` maps each table name to the columns it has now (none: it does not exist).
    Missing tables are created, missing columns added (new columns are nullable or have a
    default), then the data upgrades and the indexes follow (an upgrade may drop an index
    that is recreated under the same name). Run them in one transaction.
    """
    changes: list[str] = []
    for table, (columns, constraint) in TABLES.items():
        have = existing.get(table) or ()
        if not have:
            body = [f"{name} {definition}" for name, definition in columns]
            body += [constraint] if constraint else []
            changes.append(f"CREATE TABLE IF NOT EXISTS {{p}}{table} ({', '.join(body)})")
            continue
        changes += [
            f"ALTER TABLE {{p}}{table} ADD COLUMN {name} {definition}"
            for name, definition in columns
            if name not in have
        ]
    for target in range(version + 1, SCHEMA_VERSION + 1):
        changes += UPGRADES.get(target, ())
    changes += INDEXES
    return [fill(change) for change in changes]
