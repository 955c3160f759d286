# ruff: noqa: S608 - statements are built from constants of this module only, never input.
"""The schema of the SQL stores and the fragments their statements share.

1. **Fragments**: the state predicates (``{claimed}``, ``{saved}``…), the key condition,
   the column lists, and :func:`event_sql`, which builds one history event inside a
   statement; :func:`fill` puts them into a statement template.
2. **Schema**: the tables, their partial indexes, and the steps that bring a database to
   this schema version (:data:`STEPS`, :func:`schema_changes`).

The statements are in :mod:`agentfn_asgi.store.sql.statements`; the store over them in
:mod:`agentfn_asgi.store.sql.store`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from agentfn_asgi.calls.records import CallState
from agentfn_asgi.calls.states import OWED_HERE, PRUNABLE, SAVED
from agentfn_asgi.store._versions import (
    Step,
    check_readable,
    readable_after,
    steps_to_take,
)
from agentfn_asgi.store.sql.compile import sql_states, sql_tallies, sql_tally_name
from agentfn_asgi.store.sql.dialect import WORDS

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
    "READ_VERSION",
    "STEPS",
    "TABLES",
    "TALLY_COLUMNS",
    "VERSION_TABLE",
    "Row",
    "fill",
    "schema_changes",
]

#: One result row, by position (an ``sqlite3`` tuple or an ``asyncpg.Record``).
Row = Sequence[Any]

# -- 1. shared fragments -------------------------------------------------------------------


def _state_in(*states: CallState) -> str:
    return sql_states(frozenset(states))


#: What ``{name}`` stands for in the statements below, in both dialects. The state sets are
#: the table's (:mod:`agentfn_asgi.calls.states`), so partial indexes and queries agree with it.
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
    # The first seen of the pending calls of each state, one row each: a seek of the
    # state index per state (a NULL for a state with none).
    "oldest_pending": " UNION ALL ".join(
        f"SELECT (SELECT min(created_at) FROM {{p}}calls WHERE namespace = :namespace"
        f" AND {_state_in(state)}) AS oldest"
        for state in CallState
        if state in OWED_HERE
    ),
}


def fill(template: str) -> str:
    """A statement ``template`` with the shared fragments in; the dialect's words are kept."""
    kept = {word: "{" + word + "}" for word in WORDS}
    return template.format(
        **kept, **FRAGMENTS, columns=COLUMN_LIST, detail_columns=DETAIL_COLUMN_LIST
    )


# -- 2. schema -----------------------------------------------------------------------------

#: prune's index: the finished (PRUNABLE) calls by last change (quarantined calls wait for an
#: operator: never pruned).
_FINISHED_INDEX: Final = (
    "CREATE INDEX IF NOT EXISTS calls_finished ON {p}calls (namespace, updated_at) WHERE {finished}"
)

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
    # the one-off token of the step that started or settled this attempt (CallRecord.nonce)
    ("nonce", "{text}"),
    # the saved result: all NULL until one is saved
    ("success", "{boolean}"),
    ("event_json", "{text}"),
    ("idempotency_key", "{text}"),
    ("error_type", "{text}"),
    ("source", "{text}"),
    ("full_output", "{text}"),
    # CallRecord.reason: why the call is held for an operator, or was cancelled (the name is
    # schema 1's, as 0.1.0 released it)
    ("quarantine_reason", "{text}"),
    # when the sweep may retry a saved result's submission, and how many failed
    ("next_attempt_at", "{real} NOT NULL DEFAULT 0"),
    ("failures", "{integer} NOT NULL DEFAULT 0"),
    ("namespace", "{text} NOT NULL DEFAULT ''"),
    # the call's approval request: its id, to find it, and the whole request as JSON
    # (ApprovalRequest.to_json), decided or not; NULL for calls that never asked
    ("approval_id", "{text}"),
    ("approval", "{text}"),
    # flow control: the limiter whose slot the call holds (claimed) or waits for (waiting),
    # kept when it moves on; NULL for calls that never asked for a slot
    ("limiter", "{text}"),
    # call budgets: the call's place among its session's calls of its tool counted against
    # the tool's max_calls_per_session (set once, kept); NULL for calls never counted
    ("counted", "{integer}"),
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
#: Flow control: each rated limiter's token bucket, as it was when a call last spent a
#: token (its tokens then, and when); refilled by the clock on reading
#: (:func:`~agentfn_asgi.calls.states.bucket_tokens`). A limiter without a row has a full bucket.
BUCKET_COLUMNS: Final = (
    ("namespace", "{text} NOT NULL"),
    ("limiter", "{text} NOT NULL"),
    ("tokens", "{real} NOT NULL"),
    ("updated_at", "{real} NOT NULL"),
)
#: The counts the overview reads without reading rows (kept by the triggers of
#: :func:`~agentfn_asgi.store.sql.compile.sql_tallies`): per namespace, how many calls are
#: in each state (``calls.<state>``, submitted failures apart) and how many deliveries there
#: are (``deliveries``), in one or more ``shard`` rows each (PostgreSQL: one per server
#: process) that add up to the count.
TALLY_COLUMNS: Final = (
    ("namespace", "{text} NOT NULL"),
    ("name", "{text} NOT NULL"),
    ("shard", "{integer} NOT NULL"),
    ("n", "{integer} NOT NULL"),
)
COLUMN_LIST: Final = ", ".join(HOT_COLUMNS)
DETAIL_COLUMN_LIST: Final = ", ".join(DETAIL_COLUMNS)

#: table -> (columns, primary key). The namespace leads every key.
TABLES: Final = {
    "deliveries": (DELIVERY_COLUMNS, ("namespace", "delivery_id")),
    "calls": (CALL_COLUMNS, ("namespace", "session_id", "turn_id", "call_id")),
    "revoked_tokens": (REVOKED_TOKEN_COLUMNS, ("token_id",)),
    "buckets": (BUCKET_COLUMNS, ("namespace", "limiter")),
    "tallies": (TALLY_COLUMNS, ("namespace", "name", "shard")),
}

# The operators' listings, each in its whole order so a page reads the rows it shows and
# never sorts (schema version 2).
#: Flow control: a limiter's live waiters ahead of a call, counted at every admission up to a
#: bound (states.admission_bounds), read in the line's order (schema 2).
_LINE_INDEX: Final = (
    "CREATE INDEX IF NOT EXISTS calls_line ON {p}calls"
    " (namespace, limiter, created_at, session_id, turn_id, call_id) WHERE {waiting}"
)
_LISTING_INDEXES: Final = (
    # prune, list_deliveries: newest first
    "CREATE INDEX IF NOT EXISTS deliveries_listed"
    " ON {p}deliveries (namespace, received_at, delivery_id)",
    "CREATE INDEX IF NOT EXISTS deliveries_unresolved"
    " ON {p}deliveries (namespace, received_at, delivery_id) WHERE NOT resolved",
    # list_calls, newest first, paged by position: all calls, by state (also the overview's
    # oldest pending call: one seek per pending state), by tool
    "CREATE INDEX IF NOT EXISTS calls_listed"
    " ON {p}calls (namespace, created_at, session_id, turn_id, call_id)",
    "CREATE INDEX IF NOT EXISTS calls_state"
    " ON {p}calls (namespace, state, created_at, session_id, turn_id, call_id)",
    "CREATE INDEX IF NOT EXISTS calls_tool"
    " ON {p}calls (namespace, tool_name, created_at, session_id, turn_id, call_id)",
)
# Each one serves a query below, so no read scans a whole table: recovery, pruning, and the
# operators' listings and counts (which read the tallies, above) each read what they show
# from an index. Every index costs each write that changes its rows: none more.
INDEXES: Final = (
    # unresolved_deliveries (the sweep's order and cursor); the overview's counts of them
    "CREATE INDEX IF NOT EXISTS deliveries_due"
    " ON {p}deliveries (namespace, next_attempt_at, delivery_id) WHERE NOT resolved",
    # expired_claims
    "CREATE INDEX IF NOT EXISTS calls_claimed"
    " ON {p}calls (namespace, lease_expires_at) WHERE {claimed}",
    # unsubmitted_results (the sweep's order and cursor)
    "CREATE INDEX IF NOT EXISTS calls_due"
    " ON {p}calls (namespace, next_attempt_at, session_id, turn_id, call_id) WHERE {saved}",
    # prune (quarantined calls wait for an operator: never pruned)
    _FINISHED_INDEX,
    # find_approval (a person's decision names the request)
    "CREATE INDEX IF NOT EXISTS calls_approval"
    " ON {p}calls (namespace, approval_id) WHERE approval_id IS NOT NULL",
    # waiting_approvals (expiry, listings; its count for the gauge) and approved_calls
    # (every replica's 1 s poll): in the lists' whole order, so a list reads the rows it
    # shows from the index and never sorts every waiting row
    "CREATE INDEX IF NOT EXISTS calls_waiting ON {p}calls"
    " (namespace, lease_expires_at, session_id, turn_id, call_id) WHERE {awaiting_approval}",
    "CREATE INDEX IF NOT EXISTS calls_approved ON {p}calls"
    " (namespace, updated_at, session_id, turn_id, call_id) WHERE {approved}",
    # flow control: a limiter's live holders, counted at every admission up to a bound
    # (only calls of limited tools are in it)
    "CREATE INDEX IF NOT EXISTS calls_limiter"
    " ON {p}calls (namespace, limiter, state, lease_expires_at) WHERE limiter IS NOT NULL",
    _LINE_INDEX,
    # expired_claims: the waiters whose lease lapsed (their holder died), to be adopted
    "CREATE INDEX IF NOT EXISTS calls_waiters"
    " ON {p}calls (namespace, lease_expires_at) WHERE {waiting}",
    *_LISTING_INDEXES,
)


def _create_table(table: str) -> str:
    columns, key = TABLES[table]
    body = [f"{column} {definition}" for column, definition in columns]
    body.append(f"CONSTRAINT {table}_pkey PRIMARY KEY ({', '.join(key)})")
    return f"CREATE TABLE IF NOT EXISTS {{p}}{table} ({', '.join(body)})"


#: Where a step runs the tallies' triggers of the database at hand
#: (:func:`~agentfn_asgi.store.sql.compile.sql_tallies`).
_TALLY_TRIGGERS: Final = "tally triggers"
#: Version 2 counts what version 1 counted by reading every row: the tallies and their
#: triggers, counted once from the rows there (the opener's transaction holds the tables:
#: nothing is written in between); the listings' indexes. Additive: the release before
#: keeps working beside it (its writes move the tallies too: the triggers are the
#: database's).
_TALLIES_AND_LISTINGS: Final = (
    _create_table("tallies"),
    _TALLY_TRIGGERS,
    "DELETE FROM {p}tallies",  # counted afresh, whatever a step taken before left
    "INSERT INTO {p}tallies (namespace, name, shard, n)"
    f" SELECT namespace, {sql_tally_name('')}, 0, count(*) FROM {{p}}calls"
    f" GROUP BY namespace, {sql_tally_name('')}",
    "INSERT INTO {p}tallies (namespace, name, shard, n)"
    " SELECT namespace, 'deliveries', 0, count(*) FROM {p}deliveries GROUP BY namespace",
    "DROP INDEX IF EXISTS {p}deliveries_received",  # deliveries_listed, one column longer
    *_LISTING_INDEXES,
)

#: The schema's steps, oldest first (see :mod:`agentfn_asgi.store._versions`): the first
#: makes a new database with the newest tables, triggers and indexes (:data:`TABLES`,
#: :data:`INDEXES`).
STEPS: Final = (
    Step((*map(_create_table, TABLES), _TALLY_TRIGGERS, *INDEXES), readable_from=2),
    # 0.2: call budgets (CallRecord.counted); the waiting line's index; the tallies and the
    # listings' indexes; prune's index made again for the finished states 0.2 adds. Its
    # calls may be ``cancelled``, ``unanswered`` or ``retired``, states 0.1.0 cannot read:
    # readable from 2 only, so a 0.1.0 replica refuses the store at start instead of
    # failing on such a call.
    Step(
        (
            "ALTER TABLE {p}calls ADD COLUMN counted {integer}",
            _LINE_INDEX,
            *_TALLIES_AND_LISTINGS,
            "DROP INDEX IF EXISTS {p}calls_finished",
            _FINISHED_INDEX,
        ),
        readable_from=2,
    ),
)

#: Where a database keeps its version (one row), and how it is read.
VERSION_TABLE: Final = (
    "CREATE TABLE IF NOT EXISTS {p}schema_version"
    " (version {integer} NOT NULL, readable_from {integer} NOT NULL)"
)
READ_VERSION: Final = "SELECT version, readable_from FROM {p}schema_version"


def schema_changes(found: Row | None, where: str, *, engine: str) -> list[str]:
    """The statements that bring a ``engine`` (``sqlite`` or ``postgres``) database whose
    version row is ``found`` (None: a new database) to the last of :data:`STEPS`, recording
    its version last; none when it is there or ahead. Run them in one transaction, after
    :data:`VERSION_TABLE` and :data:`READ_VERSION`, with no other opener at work. Raises
    :class:`StoreError` when the database is of a version this code cannot work on."""
    steps = STEPS
    version, readable_from = (int(found[0]), int(found[1])) if found else (0, 0)
    check_readable(where, version=version, readable_from=readable_from, steps=len(steps))
    if version >= len(steps):
        return []
    readable = readable_after(steps, version, readable_from)
    changes = [change for step in steps_to_take(steps, version) for change in step.change]
    return [
        *(
            fill(statement)
            for change in changes
            for statement in (sql_tallies(engine) if change == _TALLY_TRIGGERS else (change,))
        ),
        "DELETE FROM {p}schema_version",
        "INSERT INTO {p}schema_version (version, readable_from)"
        f" VALUES ({len(steps)}, {readable})",
    ]
