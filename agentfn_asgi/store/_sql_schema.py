# ruff: noqa: S608 - statements are built from constants of this module only, never input.
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
from agentfn_asgi.records import CallState, parse_history
from agentfn_asgi.states import HISTORY_HEAD, HISTORY_TAIL, PRUNABLE, SAVED, TRANSITIONS
from agentfn_asgi.store._compile import sql_guard, sql_states
from agentfn_asgi.store._sql_dialect import WORDS

__all__ = [
    "BUCKET_COLUMNS",
    "CALL_COLUMNS",
    "COLUMN_LIST",
    "DELIVERY_LIST",
    "DETAIL_COLUMNS",
    "DETAIL_COLUMN_LIST",
    "FRAGMENTS",
    "HISTORY_COLUMNS",
    "HOT_COLUMNS",
    "INDEXES",
    "LONG_HISTORIES",
    "SCHEMA_VERSION",
    "SPLIT_HISTORY",
    "TABLES",
    "UPGRADES",
    "UPGRADE_PARAMS",
    "Row",
    "check_schema_version",
    "fill",
    "schema_changes",
    "split_history",
]

#: One result row, by position (an ``sqlite3`` tuple or an ``asyncpg.Record``).
Row = Sequence[Any]

# -- 1. shared fragments -------------------------------------------------------------------


def _state_in(*states: CallState) -> str:
    return sql_states(frozenset(states))


def _guards() -> dict[str, str]:
    """``{may_<row>}``: each row of the state table's condition, rendered from the table
    (:mod:`agentfn_asgi.store._guards`); the upsert's take-over and retried claim see the
    existing row as ``c.`` and the claimant as ``excluded.owner``."""
    guards = {f"may_{name}": sql_guard(name) for name in TRANSITIONS if name != "claim"}
    guards["may_mark_stale_unchanged"] = sql_guard("mark_stale", optional=True)
    guards["may_take_over_upsert"] = sql_guard("take_over", alias="c.")
    guards["may_reclaim_upsert"] = sql_guard("reclaim", alias="c.", owner="excluded.owner")
    return guards


#: What ``{name}`` stands for in the statements below, in both dialects. The state sets are
#: the table's (:mod:`agentfn_asgi.states`), so partial indexes and queries agree with it.
FRAGMENTS: Final[Mapping[str, str]] = {
    # Every record lives in its store's namespace: every keyed statement names it.
    "key": "namespace = :namespace AND session_id = :session_id AND turn_id = :turn_id"
    " AND call_id = :call_id",
    "claimed": _state_in(CallState.CLAIMED),
    "waiting": _state_in(CallState.WAITING),
    "awaiting_approval": _state_in(CallState.AWAITING_APPROVAL),
    "approved": _state_in(CallState.APPROVED),
    "saved": sql_states(SAVED),
    "pending": _state_in(*(state for state in CallState if not state.terminal)),
    "terminal": _state_in(*(state for state in CallState if state.terminal)),
    "finished": sql_states(PRUNABLE),
    "count_by_state": ", ".join(
        f"count(*) FILTER (WHERE {_state_in(state)})" for state in CallState
    ),
    **_guards(),
}


def fill(template: str) -> str:
    """A statement ``template`` with the shared fragments in; the dialect's words are kept."""
    kept = {word: "{" + word + "}" for word in WORDS}
    return template.format(
        **kept, **FRAGMENTS, columns=COLUMN_LIST, detail_columns=DETAIL_COLUMN_LIST
    )


# -- 2. schema -----------------------------------------------------------------------------

#: Bump with an entry in UPGRADES. SQLite keeps it in ``PRAGMA user_version``, PostgreSQL in
#: the ``schema_version`` table of the store's schema.
SCHEMA_VERSION: Final = 6

DELIVERY_COLUMNS: Final = (
    ("delivery_id", "{text} NOT NULL"),
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
    # the call's approval request (schema 5): its id, to find it, and the whole request as
    # JSON (ApprovalRequest.to_json), decided or not; NULL for calls that never asked
    ("approval_id", "{text}"),
    ("approval", "{text}"),
    # flow control (schema 6): the limiter whose slot the call holds (claimed) or waits for
    # (waiting), kept when it moves on; NULL for calls that never asked for a slot
    ("limiter", "{text}"),
    # the bounded history (see append_sql): the first events, the last ones, how many in all
    ("history", "{text}"),
    ("history_tail", "{text}"),
    ("history_count", "{integer} NOT NULL DEFAULT 0"),
)
HISTORY_COLUMNS: Final = ("history", "history_tail", "history_count")
HOT_COLUMNS: Final = tuple(
    name for name, _ in CALL_COLUMNS if name != "namespace" and name not in HISTORY_COLUMNS
)
DETAIL_COLUMNS: Final = (*HOT_COLUMNS, *HISTORY_COLUMNS)
#: Revoked credentials (operator-page sessions), one store-wide list (see Store).
REVOKED_TOKEN_COLUMNS: Final = (
    ("token_id", "{text} NOT NULL"),
    ("expires_at", "{real} NOT NULL"),
)
#: Flow control (schema 6): each rated limiter's token bucket, as it was when a call last
#: spent a token (its tokens then, and when); refilled by the clock on reading
#: (:func:`~agentfn_asgi.states.bucket_tokens`). A limiter without a row has a full bucket.
BUCKET_COLUMNS: Final = (
    ("namespace", "{text} NOT NULL"),
    ("limiter", "{text} NOT NULL"),
    ("tokens", "{real} NOT NULL"),
    ("updated_at", "{real} NOT NULL"),
)
COLUMN_LIST: Final = ", ".join(HOT_COLUMNS)
DETAIL_COLUMN_LIST: Final = ", ".join(DETAIL_COLUMNS)

#: table -> (columns, primary key). The namespace leads every key (schema 4).
TABLES: Final = {
    "deliveries": (DELIVERY_COLUMNS, ("namespace", "delivery_id")),
    "calls": (CALL_COLUMNS, ("namespace", "session_id", "turn_id", "call_id")),
    "revoked_tokens": (REVOKED_TOKEN_COLUMNS, ("token_id",)),
    "buckets": (BUCKET_COLUMNS, ("namespace", "limiter")),
}

# Each one serves a query below, so recovery and pruning never scan the whole table; the
# operators' listings and stats() do (rarely). Every index costs each write that changes
# its rows: none more.
INDEXES: Final = (
    # unresolved_deliveries (the sweep's order and cursor)
    "CREATE INDEX IF NOT EXISTS deliveries_due"
    " ON {p}deliveries (namespace, next_attempt_at, delivery_id) WHERE NOT resolved",
    # prune, list_deliveries
    "CREATE INDEX IF NOT EXISTS deliveries_received ON {p}deliveries (namespace, received_at)",
    # expired_claims
    "CREATE INDEX IF NOT EXISTS calls_claimed"
    " ON {p}calls (namespace, lease_expires_at) WHERE {claimed}",
    # unsubmitted_results (the sweep's order and cursor)
    "CREATE INDEX IF NOT EXISTS calls_due"
    " ON {p}calls (namespace, next_attempt_at, session_id, turn_id, call_id) WHERE {saved}",
    # prune (quarantined calls wait for an operator: never pruned)
    "CREATE INDEX IF NOT EXISTS calls_finished"
    " ON {p}calls (namespace, updated_at) WHERE {finished}",
    # find_approval (a person's decision names the request)
    "CREATE INDEX IF NOT EXISTS calls_approval"
    " ON {p}calls (namespace, approval_id) WHERE approval_id IS NOT NULL",
    # waiting_approvals (expiry, listings) and approved_calls (every replica's 1 s poll)
    "CREATE INDEX IF NOT EXISTS calls_waiting"
    " ON {p}calls (namespace, lease_expires_at) WHERE {awaiting_approval}",
    "CREATE INDEX IF NOT EXISTS calls_approved"
    " ON {p}calls (namespace, updated_at) WHERE {approved}",
    # flow control: a limiter's holders and live waiters, counted at every admission (only
    # calls of limited tools are in it)
    "CREATE INDEX IF NOT EXISTS calls_limiter"
    " ON {p}calls (namespace, limiter, state, lease_expires_at) WHERE limiter IS NOT NULL",
    # expired_claims: the waiters whose lease lapsed (their holder died), to be adopted
    "CREATE INDEX IF NOT EXISTS calls_waiters"
    " ON {p}calls (namespace, lease_expires_at) WHERE {waiting}",
)

#: version -> what brings the data of the version before to it, run once, after the tables
#: got their missing columns and before the indexes above are made. Each statement must also
#: be harmless on a database that never had the old shape (a PostgreSQL schema made before
#: versions were recorded counts as version 0 and runs every upgrade). ``:namespace`` is the
#: namespace of the store that opens (and so upgrades) the database.
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
    # Version 3 added retry backoff (due now), namespaces, history (none before) and
    # indexes in the sweep's order; quarantined calls are no longer pruned. Rows written
    # before namespaces existed are adopted by the namespace of the app that upgrades the
    # database (the rows of one app, whose namespace is now that app's OPENAI_PROJECT_ID or
    # AGENTFN_STORE_NAMESPACE): its sweep, listings and operators keep finding them.
    3: (
        "UPDATE {p}deliveries SET next_attempt_at = received_at WHERE next_attempt_at = 0",
        "UPDATE {p}calls SET next_attempt_at = updated_at WHERE next_attempt_at = 0",
        "UPDATE {p}deliveries SET namespace = :namespace",
        "UPDATE {p}calls SET namespace = :namespace",
        "DROP INDEX IF EXISTS {p}deliveries_unresolved",
        "DROP INDEX IF EXISTS {p}calls_unsubmitted",
        "DROP INDEX IF EXISTS {p}calls_terminal",
    ),
    # Version 4 keys every record by its namespace (the primary keys change after these;
    # see schema_changes), leads three indexes with it, and bounds the history: the events
    # written so far are counted (each starts with '{"at"', which JSON text cannot hold
    # inside a string), and longer ones split by split_history once the statements ran.
    4: (
        "DROP INDEX IF EXISTS {p}deliveries_received",
        "DROP INDEX IF EXISTS {p}calls_claimed",
        "DROP INDEX IF EXISTS {p}calls_finished",
        "UPDATE {p}calls SET history_count = (length(history)"
        " - length(replace(history, CAST(:event_start AS {text}), '')))"
        " / length(CAST(:event_start AS {text})) WHERE history IS NOT NULL",
    ),
    # Version 5 holds calls for a person's approval: two new columns (added above, NULL for
    # every existing call, which never asked) and three partial indexes (made below). The
    # "oldest pending" statistic now counts the two new pending states; no row changes.
    5: (),
    # Version 6 adds flow control: the limiter column (NULL for every existing call: none
    # holds or waits for a slot), the buckets table (made above, empty: full buckets) and
    # two partial indexes (made below); no row changes.
    6: (),
}

#: The named parameters of the upgrade statements, but ``namespace``.
UPGRADE_PARAMS: Final[Mapping[str, object]] = {"event_start": '{"at"'}

#: Histories an upgrade from a version before 4 splits (see :func:`split_history`).
LONG_HISTORIES: Final = fill(
    "SELECT namespace, session_id, turn_id, call_id, history FROM {p}calls"
    f" WHERE history_count > {HISTORY_HEAD}"
)
SPLIT_HISTORY: Final = fill(
    "UPDATE {p}calls SET history = :head, history_tail = :tail, history_count = :count WHERE {key}"
)


def split_history(text: str | None) -> dict[str, object]:
    """The parameters of :data:`SPLIT_HISTORY` for one history of the old, unbounded shape:
    its first :data:`HISTORY_HEAD` events, its last :data:`HISTORY_TAIL` after them (one per
    line), and how many it had."""
    events = parse_history(text)
    tail = events[HISTORY_HEAD:][-HISTORY_TAIL:]
    return {
        "head": "".join(event.to_json() for event in events[:HISTORY_HEAD]),
        "tail": "".join(event.to_json() + "\n" for event in tail) or None,
        "count": len(events),
    }


def check_schema_version(version: int, where: str) -> None:
    """Refuse a database written by a newer agentfn-asgi instead of misreading it."""
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{where} has schema version {version}; this agentfn-asgi understands up to "
            f"{SCHEMA_VERSION}: upgrade the package"
        )


def _create_table(table: str, name: str | None = None) -> str:
    columns, key = TABLES[table]
    body = [f"{column} {definition}" for column, definition in columns]
    body.append(f"CONSTRAINT {table}_pkey PRIMARY KEY ({', '.join(key)})")
    return f"CREATE TABLE IF NOT EXISTS {{p}}{name or table} ({', '.join(body)})"


def _rekey(table: str, how: str) -> list[str]:
    """Give an existing ``table`` the primary key of schema 4: ``rebuild`` it (SQLite cannot
    change a primary key: a copy under the new one replaces it; its indexes go with the old
    table and are made again after) or swap the ``constraint`` (PostgreSQL)."""
    columns = ", ".join(column for column, _ in TABLES[table][0])
    if how == "rebuild":
        return [
            _create_table(table, f"{table}_v4"),
            f"INSERT INTO {{p}}{table}_v4 ({columns}) SELECT {columns} FROM {{p}}{table}",
            f"DROP TABLE {{p}}{table}",
            f"ALTER TABLE {{p}}{table}_v4 RENAME TO {table}",
        ]
    key = ", ".join(TABLES[table][1])
    return [
        f"ALTER TABLE {{p}}{table} DROP CONSTRAINT {table}_pkey",
        f"ALTER TABLE {{p}}{table} ADD CONSTRAINT {table}_pkey PRIMARY KEY ({key})",
    ]


def schema_changes(
    version: int, existing: Mapping[str, Collection[str]], *, rekey: str
) -> list[str]:
    """The statements that bring a database at ``version`` to :data:`SCHEMA_VERSION`.

    ``existing`` maps each table name to the columns it has now (none: it does not exist);
    ``rekey`` is the dialect's way of changing a primary key (``rebuild`` or ``constraint``).
    Missing tables are created, missing columns added (new columns are nullable or have a
    default), then the data upgrades, the new primary keys of tables older than version 4
    and the indexes follow (an upgrade may drop an index that is recreated under the same
    name). Run them in one transaction, with ``:namespace`` (the opener's) and
    :data:`UPGRADE_PARAMS`; then, from a version before 4, :data:`LONG_HISTORIES` each
    through :func:`split_history` into :data:`SPLIT_HISTORY`.
    """
    changes: list[str] = []
    for table, (columns, _) in TABLES.items():
        have = existing.get(table) or ()
        if not have:
            changes.append(_create_table(table))
            continue
        changes += [
            f"ALTER TABLE {{p}}{table} ADD COLUMN {name} {definition}"
            for name, definition in columns
            if name not in have
        ]
    for target in range(version + 1, SCHEMA_VERSION + 1):
        changes += UPGRADES.get(target, ())
    if version < 4:
        # Only the tables keyed before version 4 change keys; a newer table is made right.
        for table in ("deliveries", "calls"):
            if existing.get(table):
                changes += _rekey(table, rekey)
    changes += INDEXES
    return [fill(change) for change in changes]
