# ruff: noqa: S608 - statements are built from constants of this module only, never input.
"""The statements of the SQL state machine (SQLite and PostgreSQL), in the order of a call's
life; :mod:`agentfn_asgi.store._sql` runs them.

What a claim does to which state, the first-writer-wins save and the allowed transitions
are decided here, inside one statement each, never by reading and then writing from
Python. Parameters are named (``:now``); ``{p}``, the column types and what else the two
databases spell differently are filled in by :mod:`agentfn_asgi.store._sql_dialect`; the
shared fragments (``{key}``, ``{columns}``, ``{claimed}``...) by
:func:`~agentfn_asgi.store._sql_schema.fill`, here, once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from agentfn_asgi.store._sql_schema import (
    DELIVERY_LIST,
    DETAIL_SQL,
    HOT_COLUMNS,
    OWNER_SQL,
    append_sql,
    event_sql,
    fill,
)

__all__ = [
    "ADMISSION",
    "ADMIT",
    "ADOPT",
    "APPROVE",
    "APPROVED_CALLS",
    "CALLS_FOR_SESSION",
    "CLAIM",
    "CLAIM_APPROVED",
    "CLAIM_NEW",
    "DELIVERY_FAILED",
    "DENY",
    "DUE_RETRIES",
    "EXPIRED_CLAIMS",
    "EXPIRE_APPROVAL",
    "FIND_APPROVAL",
    "FIND_CALLS",
    "GET_CALL",
    "GET_CALL_DETAIL",
    "GET_CALL_FOR_UPDATE",
    "KEEP_WAITING",
    "LIST_DELIVERIES",
    "LIST_FILTERS",
    "LIST_UNRESOLVED",
    "MARK_STALE",
    "MARK_STALE_UNCHANGED",
    "MARK_SUBMITTED",
    "PRUNE_BATCH",
    "PRUNE_CALLS",
    "PRUNE_DELIVERIES",
    "QUARANTINE",
    "RECORD_DELIVERY",
    "RELEASE",
    "RENEW_LEASE",
    "REQUEST_APPROVAL",
    "RESOLVE_DELIVERY",
    "RETRY_CALL",
    "REVOKE_TOKEN",
    "ROWS",
    "SAVE_RESULT",
    "SCHEDULE_RETRY",
    "SETTLE",
    "SPEND_TOKEN",
    "STATS",
    "SUBMISSION_FAILED",
    "TAKE_SLOT",
    "TOKENS_EXPIRED",
    "TOKEN_REVOKED",
    "UNRESOLVED_DELIVERIES",
    "UNRESOLVED_DELIVERIES_AFTER",
    "UNSUBMITTED_RESULTS",
    "UNSUBMITTED_RESULTS_AFTER",
    "WAIT",
    "WAITING_APPROVALS",
    "WAITING_APPROVALS_EXPIRED",
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


def _claim(on_conflict: str) -> str:
    """The insert of a new call, claimed (the ``claim`` row), and what else it does when the
    call exists."""
    return fill(
        """
    INSERT INTO {p}calls AS c (session_id, turn_id, call_id, tool_name, state, attempt, owner,
                               lease_expires_at, created_at, updated_at, delivery_id,
                               next_attempt_at, namespace, history, history_count)
    VALUES (:session_id, :turn_id, :call_id, :tool_name, 'claimed', 1, :owner,
            :lease_expires_at, :now, :now, :delivery_id, :now, :namespace, """
        + event_sql("claimed", "1", owner=OWNER_SQL)
        + """, 1)
    ON CONFLICT (namespace, session_id, turn_id, call_id) """
        + on_conflict
    )


# The claim. Absent: insert it claimed, attempt 1. Claimed with a lease expired before
# :takeover_before (now minus the margin): take it over, attempt + 1, holding no slot.
# Claimed (or waiting) by the same owner with a live lease (our own claim, retried after
# its answer was lost): return it unchanged (every column: the retried claim is the same
# claim). Anything else: leave it, and RETURNING yields no row. A fresh insert is told
# from a takeover by the attempt it returns: 1, against the old attempt + 1 >= 2.
CLAIM: Final = _claim(
    """DO UPDATE SET
        attempt = CASE WHEN {may_reclaim_upsert} THEN c.attempt ELSE c.attempt + 1 END,
        """
    + append_sql(
        event_sql("taken_over", "c.attempt + 1", owner=OWNER_SQL),
        row="c.",
        unless="{may_reclaim_upsert}",
    )
    + """,
        owner = excluded.owner,
        lease_expires_at = CASE WHEN {may_reclaim_upsert} THEN c.lease_expires_at
                                ELSE excluded.lease_expires_at END,
        updated_at = CASE WHEN {may_reclaim_upsert} THEN c.updated_at
                          ELSE excluded.updated_at END,
        delivery_id = CASE WHEN {may_reclaim_upsert} THEN c.delivery_id
                           ELSE coalesce(c.delivery_id, excluded.delivery_id) END,
        limiter = CASE WHEN {may_reclaim_upsert} THEN c.limiter ELSE NULL END
    WHERE {may_take_over_upsert} OR {may_reclaim_upsert}
    RETURNING {columns}"""
)
# The claim of a limited tool (claim_call with a limit) runs in a transaction: the insert of
# a new call first, and when the call exists, a read that holds its row to the end.
CLAIM_NEW: Final = _claim("DO NOTHING RETURNING {columns}")
GET_CALL: Final = fill("SELECT {columns} FROM {p}calls WHERE {key}")
GET_CALL_FOR_UPDATE: Final = fill("SELECT {columns} FROM {p}calls WHERE {key} {for_update}")
GET_CALL_DETAIL: Final = fill("SELECT {detail_columns} FROM {p}calls WHERE {key}")
# Fenced: only the holder of the claim's current attempt renews, saves or quarantines.
RENEW_LEASE: Final = fill("""
    UPDATE {p}calls SET lease_expires_at = :lease_expires_at, updated_at = :now
    WHERE {key} AND {may_renew}""")
# A row comes back only when this save wrote it, so its caller holds the result already: the
# text columns come back empty rather than as a second copy of a (possibly 4 MiB) result.
_SAVED_RETURNING: Final = ", ".join(
    "CAST(NULL AS {text})" if name in ("event_json", "full_output") else name
    for name in HOT_COLUMNS
)
# First writer wins: only the claim's holder saves, and only while it is claimed (even when
# its lease expired, as long as nobody took it over); otherwise the stored record stands.
SAVE_RESULT: Final = fill(
    """
    UPDATE {p}calls SET state = :state, updated_at = :now, next_attempt_at = :now,
        success = :success, event_json = :event_json, idempotency_key = :idempotency_key,
        error_type = :error_type, source = :source, full_output = :full_output,
        """
    + append_sql(event_sql("saved", "attempt", owner=OWNER_SQL, detail=DETAIL_SQL))
    + """
    WHERE {key} AND {may_save}
    RETURNING """
    + _SAVED_RETURNING
)
MARK_SUBMITTED: Final = fill(
    """
    UPDATE {p}calls SET state = 'submitted', updated_at = :now,
        """
    + append_sql(event_sql("submitted", "attempt", detail=DETAIL_SQL))
    + """
    WHERE {key} AND {may_mark_submitted}"""
)
SUBMISSION_FAILED: Final = fill(
    """
    UPDATE {p}calls SET failures = failures + 1, next_attempt_at = :retry_at,
        """
    + append_sql(event_sql("submit_failed", "attempt", detail=DETAIL_SQL))
    + """
    WHERE {key} AND {may_submission_failed}"""
)


def _stale(guard: str) -> str:
    return fill(
        """
    UPDATE {p}calls SET state = 'stale', updated_at = :now,
        """
        + append_sql(event_sql("stale", "attempt"))
        + """
    WHERE {key} AND """
        + guard
    )


MARK_STALE: Final = _stale("{may_mark_stale}")
MARK_STALE_UNCHANGED: Final = _stale("{may_mark_stale_unchanged}")
# Only the claim's holder quarantines, and a saved result always wins over it.
QUARANTINE: Final = fill(
    """
    UPDATE {p}calls SET state = 'quarantined', updated_at = :now, quarantine_reason = :detail,
        """
    + append_sql(event_sql("quarantined", "attempt", owner=OWNER_SQL, detail=DETAIL_SQL))
    + """
    WHERE {key} AND {may_quarantine}"""
)
# -- flow control: retries -------------------------------------------------------
# Fenced like quarantine: only the holder schedules its call's next attempt, at :at (kept in
# lease_expires_at, which the `due` guard compares, and in next_attempt_at, which listings show).
SCHEDULE_RETRY: Final = fill(
    """
    UPDATE {p}calls SET state = 'retry_scheduled', lease_expires_at = :at,
        next_attempt_at = :at, updated_at = :now,
        """
    + append_sql(event_sql("retry_scheduled", "attempt", owner=OWNER_SQL, detail=DETAIL_SQL))
    + """
    WHERE {key} AND {may_schedule_retry}"""
)
# The claim of a scheduled retry once due (run by claim_call after the upsert declined the
# row): one claimant wins, with the next attempt.
RETRY_CALL: Final = fill(
    """
    UPDATE {p}calls SET state = 'claimed', attempt = attempt + 1, owner = :owner,
        lease_expires_at = :lease_expires_at, updated_at = :now, limiter = NULL,
        """
    + append_sql(event_sql("retried", "attempt + 1", owner=OWNER_SQL))
    + """
    WHERE {key} AND {may_retry}
    RETURNING {columns}"""
)
# -- flow control: limits ---------------------------------------------------------
# A waiter whose lease lapsed past the margin (its replica died) is adopted by whoever claims
# it next, as the next attempt (nothing ran: not in doubt), holding no slot yet; run by
# claim_call after the upsert and the retry declined the row.
ADOPT: Final = fill(
    """
    UPDATE {p}calls SET state = 'claimed', attempt = attempt + 1, owner = :owner,
        lease_expires_at = :lease_expires_at, updated_at = :now, limiter = NULL,
        """
    + append_sql(event_sql("adopted", "attempt + 1", owner=OWNER_SQL))
    + """
    WHERE {key} AND {may_adopt}
    RETURNING {columns}"""
)
# What the limiter's rule (states.admits) needs for one call, read in the transaction that
# then admits it or not, after the limiter's lock: the others holding a slot (claimed with
# the limiter, lease not lapsed past the margin), the live waiters that arrived before it
# (in the order (created_at, key)), and the bucket as last stored (NULL: none yet, full).
ADMISSION: Final = fill("""
    SELECT
        (SELECT count(*) FROM {p}calls
         WHERE namespace = :namespace AND limiter = :limiter AND {claimed}
           AND lease_expires_at >= :takeover_before
           AND (session_id, turn_id, call_id) <> (:session_id, :turn_id, :call_id)),
        (SELECT count(*) FROM {p}calls
         WHERE namespace = :namespace AND limiter = :limiter AND {waiting}
           AND lease_expires_at >= :takeover_before
           AND (created_at, session_id, turn_id, call_id)
               < (:created_at, :session_id, :turn_id, :call_id)),
        (SELECT tokens FROM {p}buckets WHERE namespace = :namespace AND limiter = :limiter),
        (SELECT updated_at FROM {p}buckets WHERE namespace = :namespace AND limiter = :limiter)
    """)
# The holder's call, by the limiter's answer (:admitted, 1 or 0): a claimed call takes a
# slot or begins to wait (its max_wait counts from next_attempt_at); a waiting one is
# admitted or keeps waiting. Each renews the holder's lease: a live waiter keeps its place.
TAKE_SLOT: Final = fill("""
    UPDATE {p}calls SET limiter = :limiter, lease_expires_at = :lease_expires_at,
        updated_at = :now
    WHERE {key} AND {may_take_slot}
    RETURNING {columns}""")
WAIT: Final = fill(
    """
    UPDATE {p}calls SET state = 'waiting', limiter = :limiter,
        lease_expires_at = :lease_expires_at, updated_at = :now, next_attempt_at = :now,
        """
    + append_sql(event_sql("waiting", "attempt", owner=OWNER_SQL, detail=DETAIL_SQL))
    + """
    WHERE {key} AND {may_wait}
    RETURNING {columns}"""
)
ADMIT: Final = fill(
    """
    UPDATE {p}calls SET state = 'claimed', lease_expires_at = :lease_expires_at,
        updated_at = :now,
        """
    + append_sql(event_sql("admitted", "attempt", owner=OWNER_SQL))
    + """
    WHERE {key} AND {may_admit}
    RETURNING {columns}"""
)
KEEP_WAITING: Final = fill("""
    UPDATE {p}calls SET lease_expires_at = :lease_expires_at, updated_at = :now
    WHERE {key} AND {may_keep_waiting}
    RETURNING {columns}""")
# An admission of a rated limiter spends one token of the bucket as it is now (computed by
# the admission from the row ADMISSION read, in the same transaction).
SPEND_TOKEN: Final = fill("""
    INSERT INTO {p}buckets AS b (namespace, limiter, tokens, updated_at)
    VALUES (:namespace, :limiter, :tokens, :now)
    ON CONFLICT (namespace, limiter) DO UPDATE SET tokens = excluded.tokens,
        updated_at = excluded.updated_at""")

DUE_RETRIES: Final = fill("""
    SELECT {columns} FROM {p}calls
    WHERE namespace = :namespace AND {may_retry}
    ORDER BY lease_expires_at LIMIT :limit""")
SETTLE: Final = fill(
    """
    UPDATE {p}calls SET state = :state, updated_at = :now, next_attempt_at = :now,
        success = :success, event_json = :event_json, idempotency_key = :idempotency_key,
        error_type = :error_type, source = :source, full_output = :full_output,
        quarantine_reason = NULL,
        """
    + append_sql(event_sql("settled", "attempt", detail=DETAIL_SQL))
    + """
    WHERE {key} AND {may_settle}
    RETURNING {columns}"""
)
RELEASE: Final = fill(
    """
    UPDATE {p}calls SET state = 'claimed', attempt = attempt + 1, owner = :owner,
        lease_expires_at = :lease_expires_at, updated_at = :now, quarantine_reason = NULL,
        limiter = NULL,
        """
    + append_sql(event_sql("released", "attempt + 1", owner=OWNER_SQL))
    + """
    WHERE {key} AND {may_release}
    RETURNING {columns}"""
)

# Approval (schema 5). Only the claim's holder asks, after validating the arguments; the
# waiting call's lease becomes the request's expiry, which the approval guards read. Every
# decision names the request (approval_id) and is taken once: its guard needs the call to
# be waiting still.
REQUEST_APPROVAL: Final = fill(
    """
    UPDATE {p}calls SET state = 'awaiting_approval', updated_at = :now,
        lease_expires_at = :expires_at, approval_id = :approval_id, approval = :approval,
        """
    + append_sql(event_sql("approval_requested", "attempt", owner=OWNER_SQL, detail=DETAIL_SQL))
    + """
    WHERE {key} AND {may_request_approval}
    RETURNING {columns}"""
)
APPROVE: Final = fill(
    """
    UPDATE {p}calls SET state = 'approved', updated_at = :now, approval = :approval,
        """
    + append_sql(event_sql("approved", "attempt", detail=DETAIL_SQL))
    + """
    WHERE {key} AND approval_id = :approval_id AND {may_approve}
    RETURNING {columns}"""
)


def _decided_failure(event: str, guard: str) -> str:
    return fill(
        """
    UPDATE {p}calls SET state = :state, updated_at = :now, next_attempt_at = :now,
        success = :success, event_json = :event_json, idempotency_key = :idempotency_key,
        error_type = :error_type, source = :source, full_output = :full_output,
        approval = :approval,
        """
        + append_sql(event_sql(event, "attempt", detail=DETAIL_SQL))
        + """
    WHERE {key} AND approval_id = :approval_id AND """
        + guard
        + """
    RETURNING {columns}"""
    )


DENY: Final = _decided_failure("denied", "{may_deny}")
EXPIRE_APPROVAL: Final = _decided_failure("approval_expired", "{may_expire_approval}")
# Any replica: the first claim of an approved call wins, as a fresh attempt.
CLAIM_APPROVED: Final = fill(
    """
    UPDATE {p}calls SET state = 'claimed', attempt = attempt + 1, owner = :owner,
        lease_expires_at = :lease_expires_at, updated_at = :now, limiter = NULL,
        """
    + append_sql(event_sql("claimed_approved", "attempt + 1", owner=OWNER_SQL))
    + """
    WHERE {key} AND {may_run_approved}
    RETURNING {columns}"""
)
FIND_APPROVAL: Final = fill("""
    SELECT {detail_columns} FROM {p}calls
    WHERE namespace = :namespace AND approval_id = :approval_id""")
_WAITING: Final = """
    SELECT {{columns}} FROM {{p}}calls WHERE namespace = :namespace AND {{awaiting_approval}}
    {expired} ORDER BY lease_expires_at, session_id, turn_id, call_id LIMIT :limit"""
WAITING_APPROVALS: Final = fill(_WAITING.format(expired=""))
WAITING_APPROVALS_EXPIRED: Final = fill(
    _WAITING.format(expired="AND lease_expires_at <= :expired_by")
)
APPROVED_CALLS: Final = fill("""
    SELECT {columns} FROM {p}calls WHERE namespace = :namespace AND {approved}
    ORDER BY updated_at, session_id, turn_id, call_id LIMIT :limit""")

CALLS_FOR_SESSION: Final = fill("""
    SELECT {columns} FROM {p}calls WHERE namespace = :namespace AND session_id = :session_id
    ORDER BY created_at, turn_id, call_id""")
FIND_CALLS: Final = fill("""
    SELECT {detail_columns} FROM {p}calls WHERE namespace = :namespace AND call_id = :call_id
    ORDER BY created_at, session_id, turn_id""")
_UNSUBMITTED: Final = """
    SELECT {{columns}} FROM {{p}}calls
    WHERE namespace = :namespace AND {{saved}} AND next_attempt_at <= :due_before {after}
    ORDER BY next_attempt_at, session_id, turn_id, call_id LIMIT :limit"""
UNSUBMITTED_RESULTS: Final = fill(_UNSUBMITTED.format(after=""))
UNSUBMITTED_RESULTS_AFTER: Final = fill(
    _UNSUBMITTED.format(
        after="AND (next_attempt_at, session_id, turn_id, call_id)"
        " > (:after_at, :after_session, :after_turn, :after_call)"
    )
)
# Claims in doubt (to take over) and waiters whose holder died (to adopt), each from its
# own partial index.
EXPIRED_CLAIMS: Final = fill("""
    SELECT {columns} FROM {p}calls
    WHERE namespace = :namespace AND {claimed} AND lease_expires_at < :takeover_before
    UNION ALL
    SELECT {columns} FROM {p}calls
    WHERE namespace = :namespace AND {waiting} AND lease_expires_at < :takeover_before
    ORDER BY lease_expires_at LIMIT :limit""")
#: list_calls' filters, each a condition over named parameters, joined in this order.
LIST_FILTERS: Final = {
    "in_doubt": "{claimed} AND lease_expires_at < :now",
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


# One statement, so one snapshot, in both databases.
STATS: Final = fill("""
    SELECT (SELECT count(*) FROM {p}deliveries WHERE namespace = :namespace),
           (SELECT count(*) FROM {p}deliveries WHERE namespace = :namespace AND NOT resolved),
           (SELECT count(*) FROM {p}deliveries
            WHERE namespace = :namespace AND NOT resolved AND attempts > 0),
           count(*) FILTER (WHERE {claimed} AND lease_expires_at < :now),
           min(created_at) FILTER (WHERE {pending}),
           count(*) FILTER (WHERE state = 'submitted' AND success),
           count(*) FILTER (WHERE state = 'submitted' AND NOT success),
           {count_by_state}
    FROM {p}calls WHERE namespace = :namespace""")

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
PRUNE_BATCH: Final = 500

# Revoked credentials: a short store-wide list; each revocation drops the expired ones.
REVOKE_TOKEN: Final = fill("""
    INSERT INTO {p}revoked_tokens AS r (token_id, expires_at) VALUES (:token_id, :expires_at)
    ON CONFLICT (token_id) DO UPDATE SET expires_at = excluded.expires_at""")
TOKENS_EXPIRED: Final = fill("DELETE FROM {p}revoked_tokens WHERE expires_at <= :now")
TOKEN_REVOKED: Final = fill("""
    SELECT 1 FROM {p}revoked_tokens WHERE token_id = :token_id AND expires_at > :now""")


#: Which statements carry out each row of the state table (:mod:`agentfn_asgi.states`), by
#: name; ``tests/store/test_state_table.py`` holds each to its row's guard, state and event,
#: and refuses a statement that changes a call without being listed here.
ROWS: Final[Mapping[str, tuple[str, ...]]] = {
    "claim": ("CLAIM", "CLAIM_NEW"),
    "reclaim": ("CLAIM",),
    "take_over": ("CLAIM",),
    "renew": ("RENEW_LEASE",),
    "save": ("SAVE_RESULT",),
    "mark_submitted": ("MARK_SUBMITTED",),
    "submission_failed": ("SUBMISSION_FAILED",),
    "mark_stale": ("MARK_STALE", "MARK_STALE_UNCHANGED"),
    "quarantine": ("QUARANTINE",),
    "settle": ("SETTLE",),
    "release": ("RELEASE",),
    "prune": ("PRUNE_CALLS",),
    "request_approval": ("REQUEST_APPROVAL",),
    "approve": ("APPROVE",),
    "deny": ("DENY",),
    "expire_approval": ("EXPIRE_APPROVAL",),
    "run_approved": ("CLAIM_APPROVED",),
    # flow control
    "schedule_retry": ("SCHEDULE_RETRY",),
    "retry": ("RETRY_CALL",),
    "take_slot": ("TAKE_SLOT",),
    "wait": ("WAIT",),
    "admit": ("ADMIT",),
    "keep_waiting": ("KEEP_WAITING",),
    "adopt": ("ADOPT",),
}
