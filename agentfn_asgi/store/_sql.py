"""The SQL state machine of the SQLite and PostgreSQL stores, written once; read top to bottom.

1. **Fragments** the statements share, such as the state predicates.
2. **Schema**: the tables, their partial indexes, the schema version and the upgrades that
   bring an older database to it.
3. **Statements**, in the order of a call's life. What a claim does to which state, the
   first-writer-wins save and the allowed transitions are decided here, inside one statement
   each, never by reading and then writing from Python.
4. :class:`SQLStore`: every :class:`~agentfn_asgi.store.base.Store` method over those
   statements. A backend subclasses it and supplies only the plumbing: connecting, and three
   primitives that run statements with its driver.

How the text is written. Parameters are named (``:now``). ``{p}`` before every table and
index name, the column types (``{text}``…) and the rest of what the two databases spell
differently are filled in by the dialect layer (:mod:`agentfn_asgi.store._sql_dialect`). The
shared fragments (``{key}``, ``{columns}``, and the state predicates ``{claimed}``,
``{saved}``, ``{pending}``, ``{terminal}``) are filled in here, once. Queries and partial
indexes use the *same* predicate text on purpose: SQLite uses a partial index only when the
query repeats the index's condition term for term.

Adding a column: its ``(name, type)`` in :data:`CALL_COLUMNS` (a database made before gets it
from :func:`schema_changes` on open), the statement that writes it below, its field in
:class:`~agentfn_asgi.records.CallRecord` and its reading in
:func:`~agentfn_asgi.store._codec.record_from_mapping`. A data migration goes into
:data:`UPGRADES` with a bump of :data:`SCHEMA_VERSION`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from agentfn_asgi.errors import StoreError
from agentfn_asgi.records import (
    CallKey,
    CallRecord,
    CallState,
    ClaimOutcome,
    ClaimStatus,
    DeliveryRecord,
    SavedResult,
    StoreStats,
)
from agentfn_asgi.store._codec import claim_status_for, record_from_mapping
from agentfn_asgi.store._sql_dialect import WORDS

__all__ = [
    "CALL_COLUMNS",
    "FRAGMENTS",
    "SCHEMA_VERSION",
    "TABLES",
    "UPGRADES",
    "Row",
    "SQLStore",
    "Statement",
    "check_schema_version",
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
    "count_by_state": ", ".join(
        f"count(*) FILTER (WHERE {_state_in(state)})" for state in CallState
    ),
}


def _sql(template: str) -> str:
    """``template`` with the shared fragments filled in; the dialect's words are kept."""
    kept = {word: "{" + word + "}" for word in WORDS}
    return template.format(**kept, **FRAGMENTS, columns=_COLUMN_LIST)


# -- 2. schema -----------------------------------------------------------------------------

#: Bump with an entry in UPGRADES. SQLite keeps it in ``PRAGMA user_version``, PostgreSQL in
#: the ``schema_version`` table of the store's schema.
SCHEMA_VERSION: Final = 2

DELIVERY_COLUMNS: Final = (
    ("delivery_id", "{text} PRIMARY KEY"),
    ("session_id", "{text} NOT NULL"),
    ("received_at", "{real} NOT NULL"),
    ("resolved", "{boolean} NOT NULL DEFAULT false"),
)
#: The columns of a call, in the order every statement returns them.
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
)
_COLUMN_NAMES: Final = tuple(name for name, _ in CALL_COLUMNS)
_COLUMN_LIST: Final = ", ".join(_COLUMN_NAMES)

#: table -> (columns, table constraint)
TABLES: Final = {
    "deliveries": (DELIVERY_COLUMNS, ""),
    "calls": (CALL_COLUMNS, "PRIMARY KEY (session_id, turn_id, call_id)"),
}

# Each one serves a query below, so recovery and pruning never scan the whole table; stats()
# does, once (operators only). Every index costs each write that changes its rows: none more.
INDEXES: Final = (
    # unresolved_deliveries
    "CREATE INDEX IF NOT EXISTS deliveries_unresolved ON {p}deliveries (received_at)"
    " WHERE NOT resolved",
    # prune
    "CREATE INDEX IF NOT EXISTS deliveries_received ON {p}deliveries (received_at)",
    # expired_claims
    "CREATE INDEX IF NOT EXISTS calls_claimed ON {p}calls (lease_expires_at) WHERE {claimed}",
    # unsubmitted_results
    "CREATE INDEX IF NOT EXISTS calls_unsubmitted ON {p}calls (updated_at) WHERE {saved}",
    # prune
    "CREATE INDEX IF NOT EXISTS calls_terminal ON {p}calls (updated_at) WHERE {terminal}",
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
    default), then the indexes and the data upgrades follow. Run them in one transaction.
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
    changes += INDEXES
    for target in range(version + 1, SCHEMA_VERSION + 1):
        changes += UPGRADES.get(target, ())
    return [_sql(change) for change in changes]


# -- 3. statements, in the order of a call's life ------------------------------------------

RECORD_DELIVERY: Final = _sql("""
    INSERT INTO {p}deliveries (delivery_id, session_id, received_at, resolved)
    VALUES (:delivery_id, :session_id, :now, false)
    ON CONFLICT (delivery_id) DO NOTHING""")
RESOLVE_DELIVERY: Final = _sql("""
    UPDATE {p}deliveries SET resolved = true WHERE delivery_id = :delivery_id AND NOT resolved""")
UNRESOLVED_DELIVERIES: Final = _sql("""
    SELECT delivery_id, session_id, received_at FROM {p}deliveries
    WHERE NOT resolved AND received_at <= :older_than
    ORDER BY received_at, delivery_id LIMIT :limit""")

# The claim. Absent: insert it claimed, attempt 1. Claimed with an expired lease: take it
# over (attempt + 1). Anything else: leave it, and RETURNING yields no row. A fresh insert
# is told from a takeover by the attempt it returns: the insert writes 1 and a takeover
# writes the old attempt + 1 >= 2, in both databases (PostgreSQL's "xmax = 0" is an
# implementation detail SQLite has no counterpart of).
CLAIM: Final = _sql("""
    INSERT INTO {p}calls AS c (session_id, turn_id, call_id, tool_name, state, attempt, owner,
                               lease_expires_at, created_at, updated_at, delivery_id)
    VALUES (:session_id, :turn_id, :call_id, :tool_name, 'claimed', 1, :owner,
            :lease_expires_at, :now, :now, :delivery_id)
    ON CONFLICT (session_id, turn_id, call_id) DO UPDATE SET
        attempt = c.attempt + 1,
        owner = excluded.owner,
        lease_expires_at = excluded.lease_expires_at,
        updated_at = excluded.updated_at,
        delivery_id = coalesce(c.delivery_id, excluded.delivery_id)
    WHERE c.state = 'claimed' AND c.lease_expires_at < :now
    RETURNING {columns}""")
GET_CALL: Final = _sql("SELECT {columns} FROM {p}calls WHERE {key}")
RENEW_LEASE: Final = _sql("""
    UPDATE {p}calls SET lease_expires_at = :lease_expires_at, updated_at = :now
    WHERE {key} AND {claimed} AND owner = :owner""")
# First writer wins: only a claimed call takes a result (even when its lease expired, as
# long as nobody saved since); otherwise nothing is returned and the stored one stands.
SAVE_RESULT: Final = _sql("""
    UPDATE {p}calls SET state = :state, owner = :owner, updated_at = :now,
        success = :success, event_json = :event_json, idempotency_key = :idempotency_key,
        error_type = :error_type, source = :source, full_output = :full_output
    WHERE {key} AND {claimed}
    RETURNING {columns}""")
MARK_SUBMITTED: Final = _sql("""
    UPDATE {p}calls SET state = 'submitted', updated_at = :now WHERE {key} AND {saved}""")
MARK_STALE: Final = _sql("""
    UPDATE {p}calls SET state = 'stale', updated_at = :now WHERE {key} AND {pending}""")
# Only the claim's holder quarantines, and a saved result always wins over it.
QUARANTINE: Final = _sql("""
    UPDATE {p}calls SET state = 'quarantined', updated_at = :now,
        quarantine_reason = :reason
    WHERE {key} AND {claimed} AND owner = :owner""")

CALLS_FOR_SESSION: Final = _sql("""
    SELECT {columns} FROM {p}calls WHERE session_id = :session_id
    ORDER BY created_at, turn_id, call_id""")
UNSUBMITTED_RESULTS: Final = _sql("""
    SELECT {columns} FROM {p}calls WHERE {saved} ORDER BY updated_at LIMIT :limit""")
EXPIRED_CLAIMS: Final = _sql("""
    SELECT {columns} FROM {p}calls WHERE {claimed} AND lease_expires_at < :now
    ORDER BY lease_expires_at LIMIT :limit""")
# One statement, so one snapshot, in both databases.
STATS: Final = _sql("""
    SELECT (SELECT count(*) FROM {p}deliveries),
           (SELECT count(*) FROM {p}deliveries WHERE NOT resolved),
           count(*) FILTER (WHERE {claimed} AND lease_expires_at < :now),
           min(created_at) FILTER (WHERE {pending}),
           {count_by_state}
    FROM {p}calls""")

# Small batches by physical row address keep each delete short, so the write lock (SQLite)
# or the rows (PostgreSQL) are never held for long. Pending calls are never pruned.
PRUNE_DELIVERIES: Final = _sql("""
    DELETE FROM {p}deliveries WHERE {rowid} IN (
        SELECT {rowid} FROM {p}deliveries WHERE received_at < :before
        LIMIT :batch {skip_locked})""")
PRUNE_CALLS: Final = _sql("""
    DELETE FROM {p}calls WHERE {rowid} IN (
        SELECT {rowid} FROM {p}calls WHERE {terminal} AND updated_at < :before
        LIMIT :batch {skip_locked})""")
PRUNE_BATCH: Final = 500


# -- 4. the store, over three primitives ---------------------------------------------------


@dataclass(frozen=True, slots=True)
class Statement:
    """A statement template (above) with the values of its named parameters."""

    template: str
    params: Mapping[str, object] = field(default_factory=dict)


def _key(key: CallKey) -> dict[str, object]:
    return {"session_id": key.session_id, "turn_id": key.turn_id, "call_id": key.call_id}


def _call_record(row: Row) -> CallRecord:
    return record_from_mapping(dict(zip(_COLUMN_NAMES, row, strict=True)))


class SQLStore(abc.ABC):
    """Every :class:`~agentfn_asgi.store.base.Store` method over the statements above.

    A backend adds ``open``/``close``/``ping`` and the three primitives, each of which turns
    its driver's errors into :class:`StoreError`/:class:`StoreUnavailableError` (``action``
    names the operation, for those messages).
    """

    def __init__(self, *, clock: Callable[[], float]) -> None:
        self._clock = clock

    @abc.abstractmethod
    async def _count(self, action: str, statement: Statement) -> int:
        """Run one statement; the number of rows it changed."""

    @abc.abstractmethod
    async def _rows(self, action: str, statement: Statement) -> list[Row]:
        """Run one statement; every row it returned."""

    @abc.abstractmethod
    async def _first_row(self, action: str, *statements: Statement) -> tuple[int, Row] | None:
        """Run statements in order on one connection until one returns a row.

        Returns that statement's index and first row, or None when none returned a row.
        """

    # -- deliveries ------------------------------------------------------------------------
    async def record_delivery(self, delivery_id: str, session_id: str) -> bool:
        """Record a delivery; True if new. Decided by the primary key."""
        params = {"delivery_id": delivery_id, "session_id": session_id, "now": self._clock()}
        return await self._count("record_delivery", Statement(RECORD_DELIVERY, params)) == 1

    async def mark_delivery_resolved(self, delivery_id: str) -> None:
        """Mark a delivery resolved; unknown ids are ignored."""
        params = {"delivery_id": delivery_id}
        await self._count("mark_delivery_resolved", Statement(RESOLVE_DELIVERY, params))

    async def unresolved_deliveries(
        self, *, older_than: float, limit: int = 100
    ) -> list[DeliveryRecord]:
        """Unresolved deliveries received at or before ``older_than``, oldest first."""
        params = {"older_than": older_than, "limit": max(0, limit)}
        rows = await self._rows("unresolved_deliveries", Statement(UNRESOLVED_DELIVERIES, params))
        return [DeliveryRecord(str(d), str(s), float(r)) for d, s, r in rows]

    async def prune(self, *, deliveries_before: float, calls_before: float) -> int:
        """Delete old deliveries and old terminal calls in batches of 500 rows.

        Each batch is its own short statement, so other work gets the lock in between.
        """
        removed = 0
        for template, before in (
            (PRUNE_DELIVERIES, deliveries_before),
            (PRUNE_CALLS, calls_before),
        ):
            statement = Statement(template, {"before": before, "batch": PRUNE_BATCH})
            while True:
                count = await self._count("prune", statement)
                removed += count
                if count < PRUNE_BATCH:
                    break
        return removed

    # -- calls -----------------------------------------------------------------------------
    async def claim_call(
        self,
        key: CallKey,
        *,
        tool_name: str,
        owner: str,
        lease_seconds: float,
        delivery_id: str | None = None,
    ) -> ClaimOutcome:
        """Decide who runs ``key`` with one upsert; see :meth:`Store.claim_call`."""
        now = self._clock()
        claim = Statement(
            CLAIM,
            {
                **_key(key),
                "tool_name": tool_name,
                "owner": owner,
                "now": now,
                "lease_expires_at": now + lease_seconds,
                "delivery_id": delivery_id,
            },
        )
        read = Statement(GET_CALL, _key(key))
        # Left alone, the row is read back only to report what the upsert decided: states
        # never return to "claimed", so that read classifies correctly (claim_status_for
        # has the one clock-skew case). It finds nothing only when prune() removed a
        # terminal call in between; the next upsert then inserts it afresh.
        for _ in range(3):
            found = await self._first_row("claim_call", claim, read)
            if found is None:
                continue
            taken, row = found
            record = _call_record(row)
            if taken == 0:
                status = ClaimStatus.CLAIMED if record.attempt == 1 else ClaimStatus.IN_DOUBT
                return ClaimOutcome(status, record)
            return ClaimOutcome(claim_status_for(record), record)
        raise StoreError(f"call {key} changed under the claim three times")

    async def renew_lease(self, key: CallKey, *, owner: str, lease_seconds: float) -> bool:
        """Extend ``owner``'s lease; False if the call is not claimed by ``owner``."""
        now = self._clock()
        params = {**_key(key), "owner": owner, "now": now, "lease_expires_at": now + lease_seconds}
        return await self._count("renew_lease", Statement(RENEW_LEASE, params)) == 1

    async def save_result(self, key: CallKey, *, owner: str, result: SavedResult) -> CallRecord:
        """First writer wins; see :meth:`Store.save_result`."""
        state = CallState.SUCCEEDED if result.success else CallState.FAILED
        save = Statement(
            SAVE_RESULT,
            {
                **_key(key),
                "state": state.value,
                "owner": owner,
                "now": self._clock(),
                "success": result.success,
                "event_json": result.event_json,
                "idempotency_key": result.idempotency_key,
                "error_type": result.error_type,
                "source": result.source,
                "full_output": result.full_output,
            },
        )
        found = await self._first_row("save_result", save, Statement(GET_CALL, _key(key)))
        if found is None:
            raise StoreError(f"cannot save a result for call {key}: it was never claimed")
        return _call_record(found[1])

    async def mark_submitted(self, key: CallKey) -> None:
        """``succeeded``/``failed`` → ``submitted``; anything else is left alone."""
        params = {**_key(key), "now": self._clock()}
        await self._count("mark submitted", Statement(MARK_SUBMITTED, params))

    async def mark_stale(self, key: CallKey) -> None:
        """Any non-terminal state → ``stale``; terminal states are left alone."""
        params = {**_key(key), "now": self._clock()}
        await self._count("mark stale", Statement(MARK_STALE, params))

    async def quarantine(self, key: CallKey, *, owner: str, reason: str) -> None:
        """``claimed`` by ``owner`` → ``quarantined``, with ``reason`` kept on the record."""
        params = {**_key(key), "now": self._clock(), "owner": owner, "reason": reason}
        await self._count("quarantine", Statement(QUARANTINE, params))

    async def get_call(self, key: CallKey) -> CallRecord | None:
        """The record of ``key``, or None."""
        found = await self._first_row("get_call", Statement(GET_CALL, _key(key)))
        return None if found is None else _call_record(found[1])

    async def calls_for_session(self, session_id: str) -> list[CallRecord]:
        """Every call of a session, oldest first."""
        statement = Statement(CALLS_FOR_SESSION, {"session_id": session_id})
        return [_call_record(row) for row in await self._rows("calls_for_session", statement)]

    async def unsubmitted_results(self, *, limit: int = 100) -> list[CallRecord]:
        """Saved, not yet submitted results, least recently updated first."""
        statement = Statement(UNSUBMITTED_RESULTS, {"limit": max(0, limit)})
        return [_call_record(row) for row in await self._rows("unsubmitted_results", statement)]

    async def expired_claims(self, *, limit: int = 100) -> list[CallRecord]:
        """Claims whose lease has expired by the store's clock, earliest expiry first."""
        statement = Statement(EXPIRED_CLAIMS, {"now": self._clock(), "limit": max(0, limit)})
        return [_call_record(row) for row in await self._rows("expired_claims", statement)]

    async def stats(self) -> StoreStats:
        """Counts for operators, read in one snapshot; every state is listed, zeros too."""
        found = await self._first_row("stats", Statement(STATS, {"now": self._clock()}))
        if found is None:  # pragma: no cover - an aggregate without GROUP BY returns one row
            raise StoreError("the stats query returned no row")
        deliveries, unresolved, in_doubt, oldest, *counts = found[1]
        return StoreStats(
            deliveries=int(deliveries),
            unresolved_deliveries=int(unresolved),
            calls_by_state={
                state.value: int(count) for state, count in zip(CallState, counts, strict=True)
            },
            in_doubt=int(in_doubt),
            oldest_pending_at=None if oldest is None else float(oldest),
        )
