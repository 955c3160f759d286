"""``sqlite:///path``: the embedded default store (one host, any number of processes).

Concurrency. Every claim and every save is one conditional statement (an upsert or an
``UPDATE … WHERE state = 'claimed'``, written once for SQLite and PostgreSQL in
:mod:`agentfn_asgi.store.sql.store`), so several :class:`SQLiteStore` instances, in one process
or in several, can share a file: SQLite serialises writers on the file lock and
``busy_timeout`` makes a writer wait for it instead of failing at once. Flow control's
claims and polls (several statements: count a limiter's holders, waiters and tokens, then
change the call) run in a transaction begun with ``BEGIN IMMEDIATE``, which holds the write
lock from its first read: one step for every process on the file.

Event loop. The store's connection belongs to one writer thread, with group commit; the
operations of one loop turn run inline, in one transaction, when that thread is idle and
the write lock is free (see :mod:`agentfn_asgi.store.sql.sqlite_writer`); the loop never waits
on locks or fsync. The operators' reads (the overview's counts, the listings: what the CLI
and the operator page show) run on a reader thread with a connection of its own, never on
the loop and never in the writer's way: in WAL mode a reader sees the last commit and
neither waits for writers nor holds them up.

Durability. The journal is WAL with ``synchronous=NORMAL`` by default: a committed write
survives the process being killed (SIGKILL, OOM) because it is already in the WAL file;
an operating-system crash or power loss may lose the last transactions before the next
checkpoint. Pass ``synchronous="FULL"`` (or ``?synchronous=FULL`` in the URL) to fsync on
every commit at a throughput cost.

Space. A file is made with ``auto_vacuum=INCREMENTAL``: after each batch of
:meth:`~agentfn_asgi.store.sql.store.SQLStore.prune`, the pages it freed are given back to
the file system on the writer thread (the file shrinks at the next checkpoint).

Lifecycle. The connection is opened, and the schema created or brought to this release's
version (in one transaction, see :mod:`agentfn_asgi.store._versions`), by
:meth:`SQLiteStore.open`, or automatically by the first operation. After
:meth:`SQLiteStore.close` operations raise :class:`StoreUnavailableError` until ``open()``
is called again.
"""

from __future__ import annotations

import asyncio
import functools
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final, TypeVar

from agentfn_asgi.errors import ConfigurationError, StoreError, StoreUnavailableError
from agentfn_asgi.store.sql.dialect import SQLITE
from agentfn_asgi.store.sql.schema import READ_VERSION, VERSION_TABLE, Row, schema_changes
from agentfn_asgi.store.sql.sqlite_writer import STOP, Writer
from agentfn_asgi.store.sql.store import SQLStore, Statement, Steps, run_steps

__all__ = ["SQLiteStore"]

T = TypeVar("T")

_SYNCHRONOUS_MODES: Final = frozenset({"NORMAL", "FULL", "EXTRA"})
#: Free pages one job gives back at most (about 10 ms of the write lock), so webhooks'
#: writes get the lock in between.
VACUUM_PAGES: Final = 1000


def _connect(path: str, *, busy_timeout: float, synchronous: str) -> sqlite3.Connection:
    """Open the file, set the pragmas, create or migrate the schema (on the writer thread)."""
    parent = Path(path).parent
    if not parent.exists():
        # Never created: a typo in AGENTFN_STORE_URL at a redeploy would otherwise start an
        # empty store and forget every delivery and running call without a word.
        raise ConfigurationError(
            f"SQLite store {path}: the directory {parent} does not exist; create it (the store "
            "never creates directories, so a mistyped path cannot start an empty store) or fix "
            "AGENTFN_STORE_URL"
        )
    # Shared with the loop thread for inline batches, always under the writer's lock.
    conn = sqlite3.connect(
        path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
    )
    try:
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        # Before the first table (a file's mode is fixed once it has one): pages that prune
        # frees can be given back to the file system (see SQLiteStore._pruned).
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        _enable_wal(conn, busy_timeout)
        conn.execute(f"PRAGMA synchronous = {synchronous}")
        conn.execute("BEGIN IMMEDIATE")  # one opener at a time creates or migrates
        try:
            _migrate(conn, path)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    except BaseException:
        conn.close()
        raise
    return conn


def _migrate(conn: sqlite3.Connection, path: str) -> None:
    """Bring the file to this release's schema (inside the opener's transaction)."""
    conn.execute(SQLITE.render(VERSION_TABLE).text)
    found = conn.execute(SQLITE.render(READ_VERSION).text).fetchone()
    for template in schema_changes(found, f"SQLite store {path}", engine="sqlite"):
        conn.execute(SQLITE.render(template).text)


def _enable_wal(conn: sqlite3.Connection, busy_timeout: float) -> None:
    """Switch to WAL, waiting out other openers (runs on the writer thread).

    SQLite does not call the busy handler for this switch: two processes opening a new file
    at once would otherwise fail with "database is locked" immediately.
    """
    deadline = time.monotonic() + busy_timeout
    while True:
        try:
            conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


# The jobs the writer thread runs. Each fetches every row: SQLite finishes a statement (and,
# outside a group's transaction, commits it) only once it has been stepped to the end.


def _count_job(text: str, params: Mapping[str, object], conn: sqlite3.Connection) -> int:
    return conn.execute(text, params).rowcount


def _rows_job(text: str, params: Mapping[str, object], conn: sqlite3.Connection) -> list[Row]:
    return conn.execute(text, params).fetchall()


def _first_row_job(
    queries: list[tuple[str, Mapping[str, object]]], conn: sqlite3.Connection
) -> tuple[int, Row] | None:
    for index, (text, params) in enumerate(queries):
        rows = conn.execute(text, params).fetchall()
        if rows:
            return index, rows[0]
    return None


def _first_row_also_job(
    also: str, queries: list[tuple[str, Mapping[str, object]]], conn: sqlite3.Connection
) -> tuple[int, Row] | None:
    # ``also`` and the first query commit together (SQLite has no data-modifying WITH).
    def first(conn: sqlite3.Connection) -> tuple[int, Row] | None:
        conn.execute(also, queries[0][1]).fetchall()
        return _first_row_job(queries[:1], conn)

    found = _in_transaction(first, conn)
    if found is not None:
        return found
    later = _first_row_job(queries[1:], conn)
    return None if later is None else (later[0] + 1, later[1])


def _vacuum_job(conn: sqlite3.Connection) -> tuple[int, int]:
    """Give up to :data:`VACUUM_PAGES` free pages back; the free pages before and after
    (none in a file made without ``auto_vacuum=INCREMENTAL``: it keeps them)."""
    if int(conn.execute("PRAGMA auto_vacuum").fetchone()[0]) != 2:
        return 0, 0
    before = int(conn.execute("PRAGMA freelist_count").fetchone()[0])
    # One page per run: Python's sqlite3 steps a statement without result columns once.
    for _ in range(min(before, VACUUM_PAGES)):
        conn.execute("PRAGMA incremental_vacuum(1)")
    return before, int(conn.execute("PRAGMA freelist_count").fetchone()[0])


def _transaction_job(work: Callable[[], Steps[T]], conn: sqlite3.Connection) -> T:
    return _in_transaction(
        lambda conn: run_steps(
            work(),
            lambda s: conn.execute(SQLITE.render(s.template).text, s.params).fetchall(),
        ),
        conn,
    )


def _in_transaction(work: Callable[[sqlite3.Connection], T], conn: sqlite3.Connection) -> T:
    # A batch run inline or grouped on the thread is one transaction begun with BEGIN
    # IMMEDIATE already (this job has a savepoint of it); a job run alone on the thread is
    # in autocommit mode and begins its own. Either way the transaction holds the file's
    # write lock from its start: no other connection, of any process, changes anything
    # until it ends, so it holds every limiter's lock.
    own = not conn.in_transaction
    if own:
        conn.execute("BEGIN IMMEDIATE")
    try:
        answer = work(conn)
    except BaseException:
        if own and conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    if own:
        conn.execute("COMMIT")
    return answer


class _Reader:
    """The operators' reads: one thread and its own connection to the file (opened on that
    thread, on its first read), so a read never runs on the event loop's thread."""

    def __init__(self, path: str, busy_timeout: float) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self.conn: sqlite3.Connection | None = None
        self.pool = ThreadPoolExecutor(1, thread_name_prefix=f"agentfn-sqlite-reader:{path}")

    def _rows(self, text: str, params: Mapping[str, object]) -> list[Row]:
        try:
            if self.conn is None:
                conn = sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None)
                conn.execute("PRAGMA query_only = 1")  # it reads: a mistake cannot write
                self.conn = conn
            return self.conn.execute(text, params).fetchall()
        except (sqlite3.OperationalError, OSError) as exc:
            raise StoreUnavailableError(f"SQLite store {self.path} is unavailable: {exc}") from exc
        except sqlite3.Error as exc:
            raise StoreError(f"SQLite store {self.path} failed: {exc}") from exc

    async def rows(self, text: str, params: Mapping[str, object]) -> list[Row]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, self._rows, text, params)

    def _close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.pool, self._close)
        self.pool.shutdown(wait=False)


class SQLiteStore(SQLStore):
    """SQLite-backed :class:`~agentfn_asgi.store.base.Store`. See the module docstring.

    ``path`` is a file path, resolved against the working directory when the store is
    created (:attr:`location`); its directory must exist (opening refuses a missing one with
    :class:`ConfigurationError`), the file is created on first open. ``busy_timeout`` (seconds)
    is how long a writer waits for another process's write lock before the operation fails
    with :class:`StoreUnavailableError`. ``synchronous`` is ``"NORMAL"`` (default),
    ``"FULL"`` or ``"EXTRA"``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        clock: Callable[[], float] = time.time,
        synchronous: str = "NORMAL",
        busy_timeout: float = 5.0,
        namespace: str = "",
    ) -> None:
        super().__init__(clock=clock, namespace=namespace)
        given = os.fspath(path)
        if given in ("", ":memory:") or given.startswith("file::memory:"):
            raise ConfigurationError(
                "an in-memory SQLite database is private to one connection and would lose "
                "every call on restart: use memory:// for tests or give a file path"
            )
        # Resolved once, here: the app and the CLI (both through open_store) agree on the
        # file, and a later chdir cannot move it.
        self.path = os.path.abspath(given)
        mode = synchronous.upper()
        if mode not in _SYNCHRONOUS_MODES:
            raise ConfigurationError(
                f"synchronous must be one of {sorted(_SYNCHRONOUS_MODES)}, not {synchronous!r}"
            )
        if sqlite3.sqlite_version_info < (3, 35, 0):
            raise ConfigurationError(
                f"SQLite {sqlite3.sqlite_version} is too old: the store needs 3.35+ (RETURNING)"
            )
        self.synchronous = mode
        self.busy_timeout = float(busy_timeout)
        self._closed = False
        self._start_lock = threading.Lock()
        self._writer: Writer | None = None
        self._reader: _Reader | None = None

    def __repr__(self) -> str:
        return f"SQLiteStore({self.path!r}, synchronous={self.synchronous!r})"

    @property
    def location(self) -> str:
        """The resolved file as a URL (``sqlite:////abs/path.sqlite3``), for logs and operators."""
        where = f"sqlite:///{self.path}"
        return where + (f" (namespace {self.namespace})" if self.namespace else "")

    def _start(self) -> Writer:
        with self._start_lock:
            if self._closed:
                raise StoreUnavailableError(f"SQLite store {self.path} is closed")
            if self._writer is None:
                connect = functools.partial(
                    _connect,
                    self.path,
                    busy_timeout=self.busy_timeout,
                    synchronous=self.synchronous,
                )
                self._writer = Writer(self.path, connect)
                # Stops the thread when a store is forgotten without close().
                weakref.finalize(self, self._writer.jobs.put, STOP)
            return self._writer

    async def _call(self, work: Callable[[sqlite3.Connection], T]) -> T:
        return await (self._writer or self._start()).submit(work)

    # -- the primitives of SQLStore --------------------------------------------------------
    async def _count(self, action: str, statement: Statement) -> int:
        text = SQLITE.render(statement.template).text
        return await self._call(functools.partial(_count_job, text, statement.params))

    async def _rows(self, action: str, statement: Statement) -> list[Row]:
        text = SQLITE.render(statement.template).text
        return await self._call(functools.partial(_rows_job, text, statement.params))

    async def _first_row(
        self, action: str, *statements: Statement, also: str | None = None
    ) -> tuple[int, Row] | None:
        queries = [(SQLITE.render(s.template).text, s.params) for s in statements]
        if also is None:
            return await self._call(functools.partial(_first_row_job, queries))
        text = SQLITE.render(also).text
        return await self._call(functools.partial(_first_row_also_job, text, queries))

    async def _transaction(self, action: str, limiter: str, work: Callable[[], Steps[T]]) -> T:
        return await self._call(functools.partial(_transaction_job, work))

    async def _read(self, action: str, statement: Statement) -> list[Row]:
        reader = self._reader
        if reader is None:
            await self._call(_nothing)  # the file exists, at this release's schema
            with self._start_lock:
                reader = self._reader = self._reader or _Reader(self.path, self.busy_timeout)
        text = SQLITE.render(statement.template).text
        try:
            return await reader.rows(text, statement.params)
        except RuntimeError:  # its pool was shut down: the store was closed meanwhile
            raise StoreUnavailableError(f"SQLite store {self.path} is closed") from None

    async def _pruned(self) -> None:
        # The file keeps the pages deletes free (for later rows) until they are given back:
        # a file of 2 million pruned rows stayed at 934 MB. Given back on the thread, a
        # few pages a job; the file shrinks at the next checkpoint.
        while True:
            before, after = await (self._writer or self._start()).submit(_vacuum_job, inline=False)
            if after == 0 or after >= before:
                return

    # -- lifecycle -------------------------------------------------------------------------
    async def open(self) -> None:
        """Open the file and create or migrate the schema; idempotent, reopens after close()."""
        self._closed = False
        await self._call(_nothing)

    async def close(self) -> None:
        """Finish queued work, close the connection and stop the thread. Idempotent."""
        with self._start_lock:
            self._closed = True
            writer, self._writer = self._writer, None
            reader, self._reader = self._reader, None
        if reader is not None:
            await reader.close()
        if writer is not None:
            await writer.stop()

    async def ping(self) -> None:
        """Run a trivial query; raise :class:`StoreUnavailableError` when that fails."""
        await self._call(_select_one)


def _nothing(conn: sqlite3.Connection) -> None:
    return None


def _select_one(conn: sqlite3.Connection) -> Any:
    return conn.execute("SELECT 1").fetchone()
