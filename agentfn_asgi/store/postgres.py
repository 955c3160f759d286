# ruff: noqa: S608 - the only interpolated SQL is the schema name, quoted by _quote_ident.
"""PostgreSQL store (``postgresql://`` / ``postgres://``): several replicas sharing one database.

Every step is one statement decided inside PostgreSQL: ``INSERT … ON CONFLICT`` for deliveries
and claims (a lease takeover is the conditional ``DO UPDATE … WHERE`` of the same statement),
conditional ``UPDATE … WHERE state = … RETURNING`` for results and state changes. When a
conditional write matches nothing, the row is read back only to *report* what the database
already decided.

Tables live in their own schema (``schema="agentfn"``), created at :meth:`PostgresStore.open`
under a transaction-level advisory lock so replicas starting together do not race on DDL.

Time: every timestamp and lease comparison uses the injected ``clock`` (passed as a query
parameter, never ``now()``), so leases are compared in the callers' time and tests can use a
fake clock.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from agentfn_asgi.errors import ConfigurationError, StoreError, StoreUnavailableError
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
from agentfn_asgi.store._codec import CALL_FIELDS, claim_status_for, record_from_mapping

try:
    import asyncpg
    from asyncpg import exceptions as pg_errors
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ConfigurationError(
        "the postgresql:// store needs the asyncpg driver: pip install 'agentfn-asgi[postgres]'"
    ) from exc

__all__ = ["PostgresStore"]

_T = TypeVar("_T")
_PRUNE_BATCH = 500

# Errors meaning "the database cannot be reached right now" (refused, reset, restarting,
# terminated backend, full, pool closed, timed out).
_UNAVAILABLE: tuple[type[Exception], ...] = (
    pg_errors.PostgresConnectionError,
    pg_errors.OperatorInterventionError,  # admin shutdown, cannot connect now, cancelled
    pg_errors.InsufficientResourcesError,  # too many connections
    pg_errors.InterfaceError,
    OSError,  # includes TimeoutError (asyncio's too, on Python 3.11+)
)
# Errors after which the same request on a fresh connection is worth one more try: the
# connection died under us (backend terminated, server restarted).
_RECONNECT: tuple[type[Exception], ...] = (
    pg_errors.ConnectionDoesNotExistError,
    pg_errors.AdminShutdownError,
    pg_errors.CannotConnectNowError,
    ConnectionResetError,
)
# Everything the driver raises on purpose; any of it becomes a StoreError.
_DRIVER_ERRORS: tuple[type[Exception], ...] = (
    pg_errors.PostgresError,
    pg_errors.InterfaceError,
    pg_errors.InternalClientError,
    *_UNAVAILABLE,
)
_CLOSE_ERRORS: tuple[type[Exception], ...] = (TimeoutError, *_UNAVAILABLE)

_COLUMNS = ", ".join(CALL_FIELDS)

_SCHEMA_DDL = """
CREATE SCHEMA IF NOT EXISTS {s};
CREATE TABLE IF NOT EXISTS {s}.deliveries (
    delivery_id text PRIMARY KEY,
    session_id text NOT NULL,
    received_at double precision NOT NULL,
    resolved boolean NOT NULL DEFAULT false
);
CREATE INDEX IF NOT EXISTS deliveries_unresolved
    ON {s}.deliveries (received_at) WHERE NOT resolved;
CREATE INDEX IF NOT EXISTS deliveries_received ON {s}.deliveries (received_at);
CREATE TABLE IF NOT EXISTS {s}.calls (
    session_id text NOT NULL,
    turn_id text NOT NULL,
    call_id text NOT NULL,
    tool_name text NOT NULL,
    state text NOT NULL,
    attempt integer NOT NULL,
    owner text,
    lease_expires_at double precision NOT NULL,
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL,
    delivery_id text,
    success boolean,
    event_json text,
    idempotency_key text,
    error_type text,
    source text,
    full_output text,
    quarantine_reason text,
    PRIMARY KEY (session_id, turn_id, call_id)
);
CREATE INDEX IF NOT EXISTS calls_claimed
    ON {s}.calls (lease_expires_at) WHERE state = 'claimed';
CREATE INDEX IF NOT EXISTS calls_unsubmitted
    ON {s}.calls (updated_at) WHERE state IN ('succeeded', 'failed');
CREATE INDEX IF NOT EXISTS calls_terminal
    ON {s}.calls (updated_at) WHERE state IN ('submitted', 'stale', 'quarantined');
CREATE INDEX IF NOT EXISTS calls_pending
    ON {s}.calls (created_at) WHERE state IN ('claimed', 'succeeded', 'failed');
"""


def _quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _record(row: asyncpg.Record) -> CallRecord:
    return record_from_mapping({name: row[name] for name in CALL_FIELDS})


def _is_closed(conn: asyncpg.pool.PoolConnectionProxy[Any]) -> bool:
    try:
        return conn.is_closed()
    except pg_errors.InterfaceError:
        return True  # the pool already detached the proxy because its connection closed


def _translate(action: str, exc: BaseException) -> StoreError:
    if isinstance(exc, pg_errors.ClientConfigurationError):
        return StoreError(f"PostgreSQL store misconfigured ({action}): {exc}")
    if isinstance(exc, pg_errors.DataError):
        return StoreError(f"PostgreSQL store refused the data ({action}): {exc}")
    if isinstance(exc, _UNAVAILABLE):
        return StoreUnavailableError(f"PostgreSQL store unavailable during {action}: {exc}")
    return StoreError(f"PostgreSQL store failed during {action}: {exc}")


class PostgresStore:
    """A :class:`~agentfn_asgi.store.base.Store` on PostgreSQL (11+) through an asyncpg pool.

    Every query is bounded by ``command_timeout`` (also the connect and pool-acquire timeout),
    after which :class:`StoreUnavailableError` is raised. A connection that died (server
    restart, terminated backend) is replaced by the pool; the request that met it is tried
    once more on a fresh connection.
    """

    def __init__(
        self,
        url: str,
        *,
        schema: str = "agentfn",
        clock: Callable[[], float] = time.time,
        min_size: int = 1,
        max_size: int = 16,
        command_timeout: float = 10.0,
    ) -> None:
        if not schema:
            raise ConfigurationError("the PostgreSQL store needs a non-empty schema name")
        self._url = url
        self._schema = schema
        self._s = _quote_ident(schema)
        self._clock = clock
        self._min_size = min_size
        self._max_size = max_size
        self._timeout = command_timeout
        self._pool: asyncpg.Pool[asyncpg.Record] | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    # -- plumbing --------------------------------------------------------------------------
    async def _ensure_pool(self) -> asyncpg.Pool[asyncpg.Record]:
        if self._closed:
            raise StoreUnavailableError("the PostgreSQL store is closed")
        if self._pool is not None:
            return self._pool
        async with self._lock:
            if self._pool is None:
                self._pool = await self._create_pool()
            return self._pool

    async def _create_pool(self) -> asyncpg.Pool[asyncpg.Record]:
        try:
            pool = await asyncpg.create_pool(
                self._url,
                min_size=self._min_size,
                max_size=self._max_size,
                command_timeout=self._timeout,
                timeout=self._timeout,
            )
        except (pg_errors.ClientConfigurationError, ValueError) as exc:
            raise ConfigurationError(f"bad PostgreSQL store URL: {exc}") from exc
        except Exception as exc:
            raise _translate("connect", exc) from exc
        try:
            async with pool.acquire(timeout=self._timeout) as conn, conn.transaction():
                # Serialise DDL across replicas starting at once (CREATE ... IF NOT EXISTS
                # alone can still fail with a duplicate-key error when two run together).
                await conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                    f"agentfn-asgi schema {self._schema}",
                )
                await conn.execute(_SCHEMA_DDL.format(s=self._s))
        except Exception as exc:
            pool.terminate()
            raise _translate("schema creation", exc) from exc
        return pool

    async def _with_conn(
        self, action: str, work: Callable[[asyncpg.pool.PoolConnectionProxy[Any]], Awaitable[_T]]
    ) -> _T:
        pool = await self._ensure_pool()
        retried = False
        while True:
            conn_lost = False
            try:
                async with pool.acquire(timeout=self._timeout) as conn:
                    try:
                        return await work(conn)
                    except _DRIVER_ERRORS:
                        # asyncpg reports a connection dying mid-query in several shapes
                        # (ConnectionDoesNotExistError, AdminShutdownError, even an
                        # InternalClientError); the connection's own state is what tells.
                        conn_lost = _is_closed(conn)
                        raise
            except _DRIVER_ERRORS as exc:
                if (conn_lost or isinstance(exc, _RECONNECT)) and not retried:
                    retried = True  # the pool replaces the dead connection
                    continue
                if conn_lost:
                    raise StoreUnavailableError(
                        f"PostgreSQL connection lost during {action}: {exc}"
                    ) from exc
                raise _translate(action, exc) from exc

    async def _fetch(self, action: str, query: str, *args: object) -> list[asyncpg.Record]:
        async def work(conn: asyncpg.pool.PoolConnectionProxy[Any]) -> list[asyncpg.Record]:
            return await conn.fetch(query, *args)

        return await self._with_conn(action, work)

    async def _fetchrow(self, action: str, query: str, *args: object) -> asyncpg.Record | None:
        async def work(conn: asyncpg.pool.PoolConnectionProxy[Any]) -> asyncpg.Record | None:
            return await conn.fetchrow(query, *args)

        return await self._with_conn(action, work)

    async def _execute(self, action: str, query: str, *args: object) -> str:
        async def work(conn: asyncpg.pool.PoolConnectionProxy[Any]) -> str:
            return await conn.execute(query, *args)

        return await self._with_conn(action, work)

    # -- lifecycle -------------------------------------------------------------------------
    async def open(self) -> None:
        """Create the pool and the schema (under an advisory lock). Idempotent."""
        self._closed = False
        await self._ensure_pool()

    async def close(self) -> None:
        """Close the pool. Idempotent."""
        self._closed = True
        async with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await asyncio.wait_for(pool.close(), timeout=self._timeout)
            except _CLOSE_ERRORS:
                pool.terminate()

    async def ping(self) -> None:
        """``SELECT 1``; raises :class:`StoreUnavailableError` when PostgreSQL is unreachable."""
        await self._execute("ping", "SELECT 1")

    async def destroy(self) -> None:
        """Drop this store's schema and everything in it (tests and teardown)."""
        await self._execute("destroy", f"DROP SCHEMA IF EXISTS {self._s} CASCADE")

    # -- deliveries ------------------------------------------------------------------------
    async def record_delivery(self, delivery_id: str, session_id: str) -> bool:
        """``INSERT … ON CONFLICT DO NOTHING RETURNING``: the primary key decides."""
        row = await self._fetchrow(
            "record_delivery",
            f"INSERT INTO {self._s}.deliveries (delivery_id, session_id, received_at)"
            " VALUES ($1, $2, $3) ON CONFLICT (delivery_id) DO NOTHING RETURNING 1",
            delivery_id,
            session_id,
            self._clock(),
        )
        return row is not None

    async def mark_delivery_resolved(self, delivery_id: str) -> None:
        """Set ``resolved``."""
        await self._execute(
            "mark_delivery_resolved",
            f"UPDATE {self._s}.deliveries SET resolved = true"
            " WHERE delivery_id = $1 AND NOT resolved",
            delivery_id,
        )

    async def unresolved_deliveries(
        self, *, older_than: float, limit: int = 100
    ) -> list[DeliveryRecord]:
        """Unresolved deliveries received at or before ``older_than``, oldest first."""
        rows = await self._fetch(
            "unresolved_deliveries",
            f"SELECT delivery_id, session_id, received_at FROM {self._s}.deliveries"
            " WHERE NOT resolved AND received_at <= $1"
            " ORDER BY received_at, delivery_id LIMIT $2",
            older_than,
            max(0, limit),
        )
        return [
            DeliveryRecord(
                delivery_id=row["delivery_id"],
                session_id=row["session_id"],
                received_at=float(row["received_at"]),
            )
            for row in rows
        ]

    async def _delete_batches(self, table: str, condition: str, before: float) -> int:
        # Small batches of rows nobody else holds (SKIP LOCKED) keep each statement short.
        query = (
            f"DELETE FROM {self._s}.{table} WHERE ctid IN ("
            f"SELECT ctid FROM {self._s}.{table} WHERE {condition}"
            f" LIMIT {_PRUNE_BATCH} FOR UPDATE SKIP LOCKED)"
        )
        removed = 0
        while True:
            status = await self._execute("prune", query, before)
            count = int(status.rsplit(" ", 1)[-1])
            removed += count
            if count < _PRUNE_BATCH:
                return removed

    async def prune(self, *, deliveries_before: float, calls_before: float) -> int:
        """Delete old deliveries and old terminal calls in batches of 500."""
        removed = await self._delete_batches("deliveries", "received_at < $1", deliveries_before)
        removed += await self._delete_batches(
            "calls",
            "state IN ('submitted', 'stale', 'quarantined') AND updated_at < $1",
            calls_before,
        )
        return removed

    # -- calls -----------------------------------------------------------------------------
    async def _get(self, action: str, key: CallKey) -> CallRecord | None:
        row = await self._fetchrow(
            action,
            f"SELECT {_COLUMNS} FROM {self._s}.calls"
            " WHERE session_id = $1 AND turn_id = $2 AND call_id = $3",
            key.session_id,
            key.turn_id,
            key.call_id,
        )
        return _record(row) if row is not None else None

    async def claim_call(
        self,
        key: CallKey,
        *,
        tool_name: str,
        owner: str,
        lease_seconds: float,
        delivery_id: str | None = None,
    ) -> ClaimOutcome:
        """One ``INSERT … ON CONFLICT DO UPDATE … WHERE <lease expired>`` decides."""
        # A prune or nothing-returned race can only repeat the classification, so bound it.
        for _ in range(3):
            now = self._clock()
            row = await self._fetchrow(
                "claim_call",
                f"INSERT INTO {self._s}.calls AS c (session_id, turn_id, call_id, tool_name,"
                " state, attempt, owner, lease_expires_at, created_at, updated_at, delivery_id)"
                " VALUES ($1, $2, $3, $4, 'claimed', 1, $5, $6, $7, $7, $8)"
                " ON CONFLICT (session_id, turn_id, call_id) DO UPDATE SET"
                " owner = EXCLUDED.owner, attempt = c.attempt + 1,"
                " lease_expires_at = EXCLUDED.lease_expires_at, updated_at = EXCLUDED.updated_at,"
                " delivery_id = COALESCE(c.delivery_id, EXCLUDED.delivery_id)"
                " WHERE c.state = 'claimed' AND c.lease_expires_at < $7"
                f" RETURNING {_COLUMNS}, (c.xmax = 0) AS inserted",
                key.session_id,
                key.turn_id,
                key.call_id,
                tool_name,
                owner,
                now + lease_seconds,
                now,
                delivery_id,
            )
            if row is not None:
                status = ClaimStatus.CLAIMED if row["inserted"] else ClaimStatus.IN_DOUBT
                return ClaimOutcome(status, _record(row))
            record = await self._get("claim_call", key)
            if record is None:
                continue  # pruned in between: decide again
            return ClaimOutcome(claim_status_for(record), record)
        raise StoreError(f"could not decide the claim of {key}")

    async def renew_lease(self, key: CallKey, *, owner: str, lease_seconds: float) -> bool:
        """Extend the lease if ``owner`` still holds the claim."""
        now = self._clock()
        row = await self._fetchrow(
            "renew_lease",
            f"UPDATE {self._s}.calls SET lease_expires_at = $5, updated_at = $6"
            " WHERE session_id = $1 AND turn_id = $2 AND call_id = $3"
            " AND state = 'claimed' AND owner = $4 RETURNING 1",
            key.session_id,
            key.turn_id,
            key.call_id,
            owner,
            now + lease_seconds,
            now,
        )
        return row is not None

    async def save_result(self, key: CallKey, *, owner: str, result: SavedResult) -> CallRecord:
        """``UPDATE … WHERE state = 'claimed' RETURNING``; else the stored record (first wins)."""
        state = CallState.SUCCEEDED if result.success else CallState.FAILED
        row = await self._fetchrow(
            "save_result",
            f"UPDATE {self._s}.calls SET state = $4, owner = $5, updated_at = $6,"
            " success = $7, event_json = $8, idempotency_key = $9,"
            " error_type = $10, source = $11, full_output = $12"
            " WHERE session_id = $1 AND turn_id = $2 AND call_id = $3 AND state = 'claimed'"
            f" RETURNING {_COLUMNS}",
            key.session_id,
            key.turn_id,
            key.call_id,
            state.value,
            owner,
            self._clock(),
            result.success,
            result.event_json,
            result.idempotency_key,
            result.error_type,
            result.source,
            result.full_output,
        )
        if row is not None:
            return _record(row)
        record = await self._get("save_result", key)
        if record is None:
            raise StoreError(f"cannot save a result for unknown call {key}")
        return record

    async def _transition(
        self,
        key: CallKey,
        target: CallState,
        allowed: Sequence[CallState],
        *,
        owner: str | None = None,
        reason: str | None = None,
    ) -> None:
        await self._execute(
            f"mark {target.value}",
            f"UPDATE {self._s}.calls SET state = $4, updated_at = $5,"
            " quarantine_reason = COALESCE($7, quarantine_reason)"
            " WHERE session_id = $1 AND turn_id = $2 AND call_id = $3"
            " AND state = ANY($6::text[]) AND ($8::text IS NULL OR owner = $8)",
            key.session_id,
            key.turn_id,
            key.call_id,
            target.value,
            self._clock(),
            [state.value for state in allowed],
            reason,
            owner,
        )

    async def mark_submitted(self, key: CallKey) -> None:
        """``succeeded``/``failed`` → ``submitted``."""
        await self._transition(key, CallState.SUBMITTED, (CallState.SUCCEEDED, CallState.FAILED))

    async def mark_stale(self, key: CallKey) -> None:
        """Any non-terminal state → ``stale``."""
        await self._transition(
            key, CallState.STALE, (CallState.CLAIMED, CallState.SUCCEEDED, CallState.FAILED)
        )

    async def quarantine(self, key: CallKey, *, owner: str, reason: str) -> None:
        """``claimed`` by ``owner`` → ``quarantined`` (the reason is kept on the row)."""
        await self._transition(
            key, CallState.QUARANTINED, (CallState.CLAIMED,), owner=owner, reason=reason
        )

    async def get_call(self, key: CallKey) -> CallRecord | None:
        """The call's row, or None."""
        return await self._get("get_call", key)

    async def calls_for_session(self, session_id: str) -> list[CallRecord]:
        """Every call of the session, oldest first."""
        rows = await self._fetch(
            "calls_for_session",
            f"SELECT {_COLUMNS} FROM {self._s}.calls WHERE session_id = $1"
            " ORDER BY created_at, turn_id, call_id",
            session_id,
        )
        return [_record(row) for row in rows]

    async def unsubmitted_results(self, *, limit: int = 100) -> list[CallRecord]:
        """Saved, not yet accepted results, oldest first."""
        rows = await self._fetch(
            "unsubmitted_results",
            f"SELECT {_COLUMNS} FROM {self._s}.calls WHERE state IN ('succeeded', 'failed')"
            " ORDER BY updated_at LIMIT $1",
            max(0, limit),
        )
        return [_record(row) for row in rows]

    async def expired_claims(self, *, limit: int = 100) -> list[CallRecord]:
        """Claims whose lease expired by the store's clock (``lease_expires_at < now``)."""
        rows = await self._fetch(
            "expired_claims",
            f"SELECT {_COLUMNS} FROM {self._s}.calls"
            " WHERE state = 'claimed' AND lease_expires_at < $1"
            " ORDER BY lease_expires_at LIMIT $2",
            self._clock(),
            max(0, limit),
        )
        return [_record(row) for row in rows]

    async def stats(self) -> StoreStats:
        """Counts (``count(*)`` scans: meant for operators, not hot paths)."""
        now = self._clock()

        async def work(conn: asyncpg.pool.PoolConnectionProxy[Any]) -> StoreStats:
            totals = await conn.fetchrow(
                f"SELECT (SELECT count(*) FROM {self._s}.deliveries) AS deliveries,"
                f" (SELECT count(*) FROM {self._s}.deliveries WHERE NOT resolved) AS unresolved,"
                f" (SELECT count(*) FROM {self._s}.calls"
                "   WHERE state = 'claimed' AND lease_expires_at < $1) AS in_doubt,"
                f" (SELECT min(created_at) FROM {self._s}.calls"
                "   WHERE state IN ('claimed', 'succeeded', 'failed')) AS oldest",
                now,
            )
            by_state = await conn.fetch(
                f"SELECT state, count(*) AS n FROM {self._s}.calls GROUP BY state"
            )
            if totals is None:  # pragma: no cover - a SELECT without FROM returns one row
                raise StoreError("PostgreSQL returned no stats row")
            return StoreStats(
                deliveries=int(totals["deliveries"]),
                unresolved_deliveries=int(totals["unresolved"]),
                calls_by_state={row["state"]: int(row["n"]) for row in by_state},
                in_doubt=int(totals["in_doubt"]),
                oldest_pending_at=(
                    float(totals["oldest"]) if totals["oldest"] is not None else None
                ),
            )

        return await self._with_conn("stats", work)
