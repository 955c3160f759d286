"""The statements of the SQL state machine (SQLite and PostgreSQL), in the order of a call's
life; :mod:`agentfn_asgi.store.sql.store` runs them.

What a claim does to which state, the first-writer-wins save and the allowed transitions
are decided here, inside one statement each, never by reading and then writing from
Python. Parameters are named (``:now``); ``{p}``, the column types and what else the two
databases spell differently are filled in by :mod:`agentfn_asgi.store.sql.dialect`; the
shared fragments (``{key}``, ``{columns}``, ``{claimed}``...) by
:func:`~agentfn_asgi.store.sql.schema.fill`, here, once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from agentfn_asgi.calls.states import TRANSITIONS, WORKLISTS, Guard, Target
from agentfn_asgi.store.sql.compile import sql_claim, sql_transition, sql_worklist
from agentfn_asgi.store.sql.schema import DELIVERY_LIST, HOT_COLUMNS, fill

__all__ = [
    "ADMISSION",
    "BUDGET_COUNTED",
    "CALLS_FOR_SESSION",
    "CLAIM",
    "CLAIM_NEW",
    "COUNT_WAITING_APPROVALS",
    "DELIVERY_FAILED",
    "FIND_APPROVAL",
    "FIND_CALLS",
    "FOLD_TALLIES",
    "GET_CALL",
    "GET_CALL_DETAIL",
    "GET_CALL_FOR_UPDATE",
    "LIST_DELIVERIES",
    "LIST_FILTERS",
    "LIST_UNRESOLVED",
    "PRUNE_BATCH",
    "PRUNE_BUCKETS",
    "PRUNE_CALLS",
    "PRUNE_DELIVERIES",
    "RECORD_DELIVERY",
    "RESOLVE_DELIVERY",
    "REVOKE_TOKEN",
    "SPEND_TOKEN",
    "STATS",
    "TOKENS_EXPIRED",
    "TOKEN_REVOKED",
    "TRANSITIONS_COUNTED",
    "TRANSITIONS_RETURNING",
    "UNRESOLVED_DELIVERIES",
    "UNRESOLVED_DELIVERIES_AFTER",
    "WORKLIST_READS",
    "list_calls_statement",
]


# A repeat of our own write (same nonce: its answer was lost) "updates" the row to itself,
# so it counts one row like an insert; anyone else's repeat changes nothing.
RECORD_DELIVERY: Final = fill("""
    INSERT INTO {p}deliveries AS d (delivery_id, session_id, received_at, resolved,
                                    namespace, next_attempt_at, nonce)
    VALUES (:delivery_id, :session_id, :now, false, :namespace, :now, :nonce)
    ON CONFLICT (namespace, delivery_id) DO UPDATE SET nonce = d.nonce
    WHERE d.nonce = excluded.nonce""")
RESOLVE_DELIVERY: Final = fill("""
    UPDATE {p}deliveries SET resolved = true
    WHERE namespace = :namespace AND delivery_id = :delivery_id AND NOT resolved""")
DELIVERY_FAILED: Final = fill("""
    UPDATE {p}deliveries SET attempts = attempts + 1, last_error = :error,
        next_attempt_at = :retry_at
    WHERE namespace = :namespace AND delivery_id = :delivery_id AND NOT resolved""")
_UNRESOLVED: Final = """
    SELECT {delivery_list} FROM {{p}}deliveries
    WHERE namespace = :namespace AND NOT resolved AND next_attempt_at <= :due_before {after}
    ORDER BY next_attempt_at, delivery_id LIMIT :limit"""
UNRESOLVED_DELIVERIES: Final = fill(_UNRESOLVED.format(delivery_list=DELIVERY_LIST, after=""))
UNRESOLVED_DELIVERIES_AFTER: Final = fill(
    _UNRESOLVED.format(
        delivery_list=DELIVERY_LIST,
        after="AND (next_attempt_at, delivery_id) > (:after_at, :after_id)",
    )
)
_LISTED: Final = """
    SELECT {delivery_list} FROM {{p}}deliveries WHERE namespace = :namespace {unresolved}
    ORDER BY received_at DESC, delivery_id DESC LIMIT :limit"""
LIST_DELIVERIES: Final = fill(_LISTED.format(delivery_list=DELIVERY_LIST, unresolved=""))
LIST_UNRESOLVED: Final = fill(
    _LISTED.format(delivery_list=DELIVERY_LIST, unresolved="AND NOT resolved")
)


# The claim, one statement: absent, the `claim` row inserts it; claimed with a lapsed lease,
# the `take_over` row takes it over; our own live claim (the `reclaim` row: its answer was
# lost) is returned unchanged. Anything else: left alone, and RETURNING yields no row. A
# fresh insert is told from a takeover by the attempt it returns: 1, against 2 or more.
CLAIM: Final = fill(sql_claim("{columns}"))
# The claim of a limited tool (claim_call with a limit) runs in a transaction: the insert of
# a new call first, and when the call exists, a read that holds its row to the end.
CLAIM_NEW: Final = fill(sql_claim(None))
GET_CALL: Final = fill("SELECT {columns} FROM {p}calls WHERE {key}")
GET_CALL_FOR_UPDATE: Final = fill("SELECT {columns} FROM {p}calls WHERE {key} {for_update}")
GET_CALL_DETAIL: Final = fill("SELECT {detail_columns} FROM {p}calls WHERE {key}")
# A row comes back only when the step wrote it, so a step that saves a result holds it
# already: the text columns come back empty rather than as a second copy of a (possibly
# 4 MiB) result.
_SAVED_RETURNING: Final = ", ".join(
    "CAST(NULL AS {text})" if name in ("event_json", "full_output") else name
    for name in HOT_COLUMNS
)


def _transitions(*, returning: bool) -> dict[str, str]:
    """The statement of every row that changes an existing call (the claim's are above,
    prune's below), by name; ``<name>+since`` is a row with its optional
    ``unchanged_since`` guard (``mark_stale``)."""
    rendered: dict[str, str] = {}
    for name, row in TRANSITIONS.items():
        if name in ("claim", "reclaim", "take_over") or row.target is Target.REMOVED:
            continue
        saves = row.target is Target.BY_RESULT
        columns = (_SAVED_RETURNING if saves else "{columns}") if returning else None
        rendered[name] = fill(sql_transition(name, returning=columns))
        if any(Guard.UNCHANGED_SINCE in way.guards for way in row.ways):
            rendered[f"{name}+since"] = fill(sql_transition(name, returning=columns, since=True))
    return rendered


#: Each row's statement, returning the call as it is after the step.
TRANSITIONS_RETURNING: Final = _transitions(returning=True)
#: Each row's statement, returning nothing (its count of changed rows answers).
TRANSITIONS_COUNTED: Final = _transitions(returning=False)
# What the limiter's rule (states.admits) needs for one call, read in the transaction that
# then admits it or not, after the limiter's lock: the others holding a slot (claimed with
# the limiter, lease not lapsed past the margin), the live waiters that arrived before it
# (in the order (created_at, key)), each counted up to its bound (states.admission_bounds:
# past it the answer is the same), and the bucket as last stored (NULL: none yet, full).
# The bounded counts read at most that many entries of an index (calls_limiter for the
# live holders, calls_line in the line's order for the waiters ahead): the same cost at
# any length of line.
ADMISSION: Final = fill("""
    SELECT
        (SELECT count(*) FROM (SELECT 1 FROM {p}calls
         WHERE namespace = :namespace AND limiter = :limiter AND {claimed}
           AND lease_expires_at >= :takeover_before
           AND (session_id, turn_id, call_id) <> (:session_id, :turn_id, :call_id)
         LIMIT :holders_bound) AS holders),
        (SELECT count(*) FROM (SELECT 1 FROM {p}calls
         WHERE namespace = :namespace AND limiter = :limiter AND {waiting}
           AND (created_at, session_id, turn_id, call_id)
               < (:created_at, :session_id, :turn_id, :call_id)
           AND lease_expires_at >= :takeover_before
         ORDER BY namespace, limiter, created_at, session_id, turn_id, call_id
         LIMIT :ahead_bound) AS ahead),
        (SELECT tokens FROM {p}buckets WHERE namespace = :namespace AND limiter = :limiter),
        (SELECT updated_at FROM {p}buckets WHERE namespace = :namespace AND limiter = :limiter)
    """)
# An admission of a rated limiter spends one token of the bucket as it is now (computed by
# the admission from the row ADMISSION read, in the same transaction).
SPEND_TOKEN: Final = fill("""
    INSERT INTO {p}buckets AS b (namespace, limiter, tokens, updated_at)
    VALUES (:namespace, :limiter, :tokens, :now)
    ON CONFLICT (namespace, limiter) DO UPDATE SET tokens = excluded.tokens,
        updated_at = excluded.updated_at""")

# What a call budget's rule (states.within_budget) needs, read in the transaction that then
# counts the call or not, after the session's budget lock: the calls of the session and tool
# already counted, in any state (the primary key's session prefix finds them).
BUDGET_COUNTED: Final = fill("""
    SELECT count(*) FROM {p}calls
    WHERE namespace = :namespace AND session_id = :session_id AND tool_name = :tool_name
      AND counted IS NOT NULL""")

FIND_APPROVAL: Final = fill("""
    SELECT {detail_columns} FROM {p}calls
    WHERE namespace = :namespace AND approval_id = :approval_id""")
COUNT_WAITING_APPROVALS: Final = fill("""
    SELECT coalesce(sum(n), 0) FROM {p}tallies
    WHERE namespace = :namespace AND name = 'calls.awaiting_approval'""")

# "+created_at": a session's few calls are found by the key and sorted; without it SQLite
# (no statistics) walked the listing index in created_at order instead, every call of the
# namespace for each delivery (111 ms a call at 10^6 stored calls).
CALLS_FOR_SESSION: Final = fill("""
    SELECT {columns} FROM {p}calls WHERE namespace = :namespace AND session_id = :session_id
    ORDER BY +created_at, turn_id, call_id""")
FIND_CALLS: Final = fill("""
    SELECT {detail_columns} FROM {p}calls WHERE namespace = :namespace AND call_id = :call_id
    ORDER BY created_at, session_id, turn_id""")


#: Each worklist's read by (name, bounded, after); a cursor only where the key breaks ties.
WORKLIST_READS: Final = {
    (name, bounded, after): fill(sql_worklist(name, bounded=bounded, after=after))
    for name, work in WORKLISTS.items()
    for bounded in (False, True)
    for after in ((False, True) if work.by_key else (False,))
}
#: list_calls' filters, each a condition over named parameters, joined in this order.
LIST_FILTERS: Final = {
    "in_doubt": "{claimed} AND lease_expires_at < :takeover_before",
    "state": "state = :state",
    "session_id": "session_id = :session_id",
    "tool_name": "tool_name = :tool_name",
    "since": "created_at >= :since",
    "before": "(created_at, session_id, turn_id, call_id)"
    " < (:before_at, :before_session, :before_turn, :before_call)",
}
_LIST_CALLS: Final = """
    SELECT {{columns}} FROM {{p}}calls WHERE namespace = :namespace {filters}
    ORDER BY created_at DESC, session_id DESC, turn_id DESC, call_id DESC LIMIT :limit"""


def list_calls_statement(filters: Sequence[str]) -> str:
    """The ``list_calls`` statement with ``filters`` (names of :data:`LIST_FILTERS`)."""
    where = "".join(f" AND {LIST_FILTERS[name]}" for name in filters)
    return fill(_LIST_CALLS.format(filters=where))


# One statement, so one snapshot, in both databases; one (name, number) row per figure.
# Nothing here reads every row: the counts by state and of deliveries are the tallies'
# (summed over their shards), the others each read an index of what they count (the
# unresolved deliveries, the claims), and the oldest pending call is one seek of the state
# index per pending state.
STATS: Final = fill("""
    SELECT name, CAST(sum(n) AS {real}) FROM {p}tallies WHERE namespace = :namespace
    GROUP BY name
    UNION ALL SELECT 'unresolved', CAST(count(*) AS {real}) FROM {p}deliveries
        WHERE namespace = :namespace AND NOT resolved
    UNION ALL SELECT 'failing', CAST(count(*) AS {real}) FROM {p}deliveries
        WHERE namespace = :namespace AND NOT resolved AND attempts > 0
    UNION ALL SELECT 'in_doubt', CAST(count(*) AS {real}) FROM {p}calls
        WHERE namespace = :namespace AND {claimed} AND lease_expires_at < :takeover_before
    UNION ALL SELECT 'oldest_pending', min(oldest) FROM ({oldest_pending}) AS pending""")

# Small batches by physical row address keep each delete short, so the write lock (SQLite)
# or the rows (PostgreSQL) are never held for long. Pending and quarantined calls are never
# pruned.
PRUNE_DELIVERIES: Final = fill("""
    DELETE FROM {p}deliveries WHERE {rowid} IN (
        SELECT {rowid} FROM {p}deliveries
        WHERE received_at < :before AND namespace = :namespace
        LIMIT :batch {skip_locked})""")
PRUNE_CALLS: Final = fill("""
    DELETE FROM {p}calls WHERE {rowid} IN (
        SELECT {rowid} FROM {p}calls
        WHERE {finished} AND updated_at < :before AND namespace = :namespace
        LIMIT :batch {skip_locked})""")
# A rated limiter's bucket untouched since before the retention goes too: it would read
# full by then at any sensible rate, and a missing bucket reads full (states.bucket_tokens),
# so values of a concurrency_key (the model's) do not pile up buckets for ever.
PRUNE_BUCKETS: Final = fill("""
    DELETE FROM {p}buckets WHERE {rowid} IN (
        SELECT {rowid} FROM {p}buckets
        WHERE updated_at < :before AND namespace = :namespace
        LIMIT :batch {skip_locked})""")
PRUNE_BATCH: Final = 500
# PostgreSQL only (SQLite's tallies have one shard, and no data-modifying WITH): prune folds
# the server processes' shards into shard 0, so a tally has about as many rows as there are
# live processes however many came and went. Rows a transaction holds are skipped, never
# waited for, and shard 0 (no trigger writes it) is written in name order: two folds never
# wait on each other in a cycle.
FOLD_TALLIES: Final = fill("""
    WITH gone AS (
        DELETE FROM {p}tallies WHERE {rowid} IN (
            SELECT {rowid} FROM {p}tallies WHERE namespace = :namespace AND shard <> 0
            {skip_locked})
        RETURNING name, n)
    INSERT INTO {p}tallies AS t (namespace, name, shard, n)
    SELECT :namespace, name, 0, sum(n) FROM gone GROUP BY name ORDER BY name
    ON CONFLICT (namespace, name, shard) DO UPDATE SET n = t.n + excluded.n""")

# Revoked credentials: a short store-wide list; each revocation drops the expired ones.
REVOKE_TOKEN: Final = fill("""
    INSERT INTO {p}revoked_tokens AS r (token_id, expires_at) VALUES (:token_id, :expires_at)
    ON CONFLICT (token_id) DO UPDATE SET expires_at = excluded.expires_at""")
TOKENS_EXPIRED: Final = fill("DELETE FROM {p}revoked_tokens WHERE expires_at <= :now")
TOKEN_REVOKED: Final = fill("""
    SELECT 1 FROM {p}revoked_tokens WHERE token_id = :token_id AND expires_at > :now""")
