"""PostgreSQL store (``postgresql://`` / ``postgres://``): several replicas sharing one database.

Every step is one statement decided inside PostgreSQL: ``INSERT … ON CONFLICT`` for deliveries
and claims (a lease takeover is the conditional ``DO UPDATE … WHERE`` of the same statement),
conditional ``UPDATE … WHERE state = … RETURNING`` for results and state changes. When a
conditional write matches nothing, the row is read back only to *report* what the database
already decided. The statements and the store's methods are shared with SQLite
(:mod:`agentfn_asgi.store.sql.store`); this module is the asyncpg plumbing.

Flow control is the one exception: the claim of a limited tool's call and its holder's poll
count the limiter's holders, waiters and tokens and change the call in one transaction,
under a transaction-scoped advisory lock on the schema, namespace and limiter (taken before
any row lock, so two such transactions never wait for each other), with the call's row
held ``FOR UPDATE``.

Tables live in their own schema (``schema="agentfn"``), created or migrated at
:meth:`PostgresStore.open` under a transaction-level advisory lock so replicas starting
together do not race on DDL, in one transaction. The schema's version is kept in its
``schema_version`` table (see :mod:`agentfn_asgi.store._versions`).

Time: every timestamp and lease comparison uses the injected ``clock`` (passed as a query
parameter, never ``now()``), so leases are compared in the callers' time and tests can use a
fake clock.
"""

from __future__ import annotations

import asyncio
import re
import shlex
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from agentfn_asgi.errors import (
    ConfigurationError,
    StoreError,
    StoreRefusedError,
    StoreUnavailableError,
)
from agentfn_asgi.store import redact_url
from agentfn_asgi.store.sql.dialect import postgres_dialect, quote_identifier
from agentfn_asgi.store.sql.schema import READ_VERSION, VERSION_TABLE, Row, schema_changes
from agentfn_asgi.store.sql.statements import FOLD_TALLIES
from agentfn_asgi.store.sql.store import SQLStore, Statement, Steps

try:
    import asyncpg
    from asyncpg import exceptions as pg_errors

    from agentfn_asgi.store.sql.pg_pool import ConnectionPool  # imports the driver too
except ImportError as exc:  # pragma: no cover - depends on the installed extras
    raise ConfigurationError(
        "the postgresql:// store needs the asyncpg driver: pip install 'agentfn-asgi[postgres]'"
    ) from exc

__all__ = ["PostgresStore"]

_T = TypeVar("_T")

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


def _refused(url: str, exc: BaseException) -> ConfigurationError | None:
    """A connection refused for a mistake in the store URL, as the start-up's one line
    naming the fix (the server's words alone do not say what to run or what to change)."""
    shown = f"PostgreSQL store {redact_url(url)!r}: {exc}"
    quoted = re.search(r'"(.+)"', str(exc))
    name = shlex.quote(quoted.group(1)) if quoted else "NAME"
    if isinstance(exc, pg_errors.InvalidCatalogNameError):
        return ConfigurationError(
            f"{shown}: create it (createdb {name}) or fix the database name in the store URL"
        )
    if isinstance(exc, pg_errors.InvalidPasswordError):
        return ConfigurationError(f"{shown}: fix the password in the store URL")
    if isinstance(exc, pg_errors.InvalidAuthorizationSpecificationError):
        return ConfigurationError(
            f"{shown}: create the role (createuser {name}) or fix the user in the store URL"
        )
    if isinstance(exc, pg_errors.UndefinedObjectError) and quoted:
        # asyncpg sends every query key it does not know to the server as a setting.
        return ConfigurationError(
            f"{shown}: ?{quoted.group(1)}= in the store URL is neither a PostgreSQL setting"
            " nor ours (schema=): fix or remove it"
        )
    return None


def _translate(action: str, exc: BaseException) -> StoreError:
    if isinstance(exc, pg_errors.ClientConfigurationError):
        return StoreError(f"PostgreSQL store misconfigured ({action}): {exc}")
    if isinstance(exc, pg_errors.DataError | pg_errors.ProgramLimitExceededError):
        # A value it will never take (a NUL, a lone surrogate, an index row past its size).
        return StoreRefusedError(f"PostgreSQL store refused the data ({action}): {exc}")
    if isinstance(exc, _UNAVAILABLE):
        return StoreUnavailableError(f"PostgreSQL store unavailable during {action}: {exc}")
    return StoreError(f"PostgreSQL store failed during {action}: {exc}")


class PostgresStore(SQLStore):
    """A :class:`~agentfn_asgi.store.base.Store` on PostgreSQL (11+) through asyncpg.

    Its connections are kept by a small pool of its own
    (:class:`~agentfn_asgi.store.sql.pg_pool.ConnectionPool`: a checkout costs no task or timer);
    ``max_size`` connections at most, ``min_size`` opened at start. Every query is bounded by
    ``command_timeout`` (also the connect timeout and the wait for a free connection),
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
        namespace: str = "",
    ) -> None:
        if not schema:
            raise ConfigurationError("the PostgreSQL store needs a non-empty schema name")
        if not 0 <= min_size <= max_size or max_size < 1:
            raise ConfigurationError(
                f"the PostgreSQL store needs 0 <= min_size <= max_size and max_size >= 1"
                f" (got min_size={min_size}, max_size={max_size})"
            )
        super().__init__(clock=clock, namespace=namespace)
        self._url = url
        self._schema = schema
        self._s = quote_identifier(schema)
        self._dialect = postgres_dialect(schema)
        self._min_size = min_size
        self._max_size = max_size
        self._timeout = command_timeout
        self._pool: ConnectionPool | None = None
        self._lock = asyncio.Lock()
        self._closed = False

    @property
    def location(self) -> str:
        """The server, database and schema, password hidden, for logs and operators."""
        where = f"{redact_url(self._url)} (schema {self._schema}"
        return where + (f", namespace {self.namespace})" if self.namespace else ")")

    # -- plumbing --------------------------------------------------------------------------
    async def _ensure_pool(self) -> ConnectionPool:
        if self._closed:
            raise StoreUnavailableError("the PostgreSQL store is closed")
        if self._pool is not None:
            return self._pool
        async with self._lock:
            if self._pool is None:
                self._pool = await self._create_pool()
            return self._pool

    async def _connect(self) -> asyncpg.Connection[Any]:
        return await asyncpg.connect(
            self._url, timeout=self._timeout, command_timeout=self._timeout
        )

    async def _create_pool(self) -> ConnectionPool:
        pool = ConnectionPool(self._connect, max_size=self._max_size, timeout=self._timeout)
        try:
            try:
                await pool.start(self._min_size)
            except (pg_errors.ClientConfigurationError, ValueError) as exc:
                raise ConfigurationError(f"bad PostgreSQL store URL: {exc}") from exc
            except Exception as exc:
                raise _refused(self._url, exc) or _translate("connect", exc) from exc
            try:
                conn = await pool.acquire()
                async with conn.transaction():
                    # Serialise DDL across replicas starting at once (CREATE ... IF NOT
                    # EXISTS alone can still fail with a duplicate-key error when two run
                    # together).
                    await conn.execute(
                        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                        f"agentfn-asgi schema {self._schema}",
                    )
                    await self._migrate(conn)
                pool.release(conn)
            except StoreError:
                raise
            except Exception as exc:
                raise _translate("schema creation", exc) from exc
        except BaseException:  # a cancelled open() too: no connection is left open
            pool.terminate()
            raise
        return pool

    async def _migrate(self, conn: asyncpg.Connection[Any]) -> None:
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {self._s}")
        await conn.execute(self._dialect.render(VERSION_TABLE).text)
        found = await conn.fetchrow(self._dialect.render(READ_VERSION).text)
        for template in schema_changes(
            found, f"PostgreSQL schema {self._schema!r}", engine="postgres"
        ):
            await conn.execute(self._dialect.render(template).text)

    async def _with_conn(
        self, action: str, work: Callable[[asyncpg.Connection[Any]], Awaitable[_T]]
    ) -> _T:
        pool = await self._ensure_pool()
        retried = False
        while True:
            conn_lost = False
            try:
                conn = await pool.acquire()
                done = False
                try:
                    result = await work(conn)
                    done = True
                    return result
                except _DRIVER_ERRORS:
                    # asyncpg reports a connection dying mid-query in several shapes
                    # (ConnectionDoesNotExistError, AdminShutdownError, even an
                    # InternalClientError); the connection's own state is what tells.
                    conn_lost = conn.is_closed()
                    if conn_lost:  # its siblings are likely gone too: retry on a new one
                        pool.expire(conn)
                    raise
                finally:
                    # A connection whose work failed or was cancelled is not reused.
                    pool.release(conn, reusable=done)
            except _DRIVER_ERRORS as exc:
                if (conn_lost or isinstance(exc, _RECONNECT)) and not retried:
                    retried = True  # the pool replaces the dead connection
                    continue
                if conn_lost:
                    raise StoreUnavailableError(
                        f"PostgreSQL connection lost during {action}: {exc}"
                    ) from exc
                raise _translate(action, exc) from exc

    async def _execute(self, action: str, query: str, *args: object) -> str:
        async def work(conn: asyncpg.Connection[Any]) -> str:
            return await conn.execute(query, *args)

        return await self._with_conn(action, work)

    # -- the primitives of SQLStore --------------------------------------------------------
    async def _count(self, action: str, statement: Statement) -> int:
        query = self._dialect.render(statement.template)
        status = await self._execute(action, query.text, *query.arguments(statement.params))
        return int(status.rsplit(" ", 1)[-1])  # "UPDATE 1", "INSERT 0 1", "DELETE 500"

    async def _rows(self, action: str, statement: Statement) -> list[Row]:
        query = self._dialect.render(statement.template)

        async def work(conn: asyncpg.Connection[Any]) -> list[Row]:
            return await conn.fetch(query.text, *query.arguments(statement.params))

        return await self._with_conn(action, work)

    async def _first_row(
        self, action: str, *statements: Statement, also: str | None = None
    ) -> tuple[int, Row] | None:
        templates = [s.template for s in statements]
        if also is not None:
            # A data-modifying WITH runs once, to completion, whether or not the statement
            # reads it: one statement, so one commit and one round trip for both.
            templates[0] = f"WITH also AS ({also}) {templates[0]}"
        queries = [self._dialect.render(template) for template in templates]

        async def work(conn: asyncpg.Connection[Any]) -> tuple[int, Row] | None:
            for index, (query, statement) in enumerate(zip(queries, statements, strict=True)):
                row = await conn.fetchrow(query.text, *query.arguments(statement.params))
                if row is not None:
                    return index, row
            return None

        return await self._with_conn(action, work)

    async def _transaction(self, action: str, limiter: str, work: Callable[[], Steps[_T]]) -> _T:
        # The limiter's lock is taken first, before any row's: every transaction takes its
        # locks in that order, so two never wait for each other.
        lock = f"agentfn-asgi limiter {self._schema}\x1f{self.namespace}\x1f{limiter}"

        async def work_in(conn: asyncpg.Connection[Any]) -> _T:
            async with conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", lock)
                steps = work()
                try:
                    statement = next(steps)
                    while True:
                        query = self._dialect.render(statement.template)
                        rows = await conn.fetch(query.text, *query.arguments(statement.params))
                        statement = steps.send(rows)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]

        return await self._with_conn(action, work_in)

    # -- lifecycle -------------------------------------------------------------------------
    async def prune(self, *, deliveries_before: float, calls_before: float) -> int:
        """As :meth:`SQLStore.prune`, then the tallies' shards of server processes folded
        into one (their rows would otherwise pile up as connections come and go)."""
        removed = await super().prune(
            deliveries_before=deliveries_before, calls_before=calls_before
        )
        await self._count("prune", Statement(FOLD_TALLIES, {"namespace": self.namespace}))
        return removed

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
            except BaseException:  # close() itself cancelled: the store no longer holds
                pool.terminate()  # the pool, so nothing else would ever close it
                raise

    async def ping(self) -> None:
        """``SELECT 1``; raises :class:`StoreUnavailableError` when PostgreSQL is unreachable."""
        await self._execute("ping", "SELECT 1")

    async def destroy(self) -> None:
        """Drop this store's schema and everything in it (tests and teardown)."""
        await self._execute("destroy", f"DROP SCHEMA IF EXISTS {self._s} CASCADE")
