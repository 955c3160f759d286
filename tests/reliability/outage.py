"""Making a shared store unreachable for a while, from the test process, per backend.

Each helper is an async context manager: inside the block the replicas' store operations
hang (as in a failover or a network partition), when it exits they go through again. None
of them touches anything but the test's own store (its SQLite file, its PostgreSQL schema,
its own connections to Redis), so tests running beside it on the same servers are not
stalled (``CLIENT PAUSE`` would pause every client of the server).

- SQLite: another connection holds ``BEGIN EXCLUSIVE`` on the file (every write waits);
- PostgreSQL: another connection holds ``LOCK TABLE <schema>.calls IN ACCESS EXCLUSIVE
  MODE`` (every read and write of a call waits);
- Redis (or anything over TCP): :class:`StallingProxy` stops forwarding bytes in both
  directions and holds new connections, as a partitioned network does.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import anyio.to_thread
import asyncpg

__all__ = ["StallingProxy", "postgres_locked", "sqlite_locked"]


@contextlib.asynccontextmanager
async def sqlite_locked(path: Path) -> AsyncIterator[None]:
    """Hold the write lock of the SQLite file at ``path`` while the block runs."""
    conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    try:
        # Waits for a writer mid-transaction (bounded by the timeout), in a thread.
        await anyio.to_thread.run_sync(conn.execute, "BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
    finally:
        conn.close()


@contextlib.asynccontextmanager
async def postgres_locked(dsn: str, schema: str) -> AsyncIterator[None]:
    """Hold an ACCESS EXCLUSIVE lock on ``schema``'s calls table while the block runs."""
    conn = await asyncpg.connect(dsn, timeout=10)
    try:
        transaction = conn.transaction()
        await transaction.start()
        try:
            quoted = '"' + schema.replace('"', '""') + '"'
            await conn.execute(f"LOCK TABLE {quoted}.calls IN ACCESS EXCLUSIVE MODE")
            yield
        finally:
            await transaction.rollback()
    finally:
        await conn.close()


class StallingProxy:
    """A TCP proxy on a loopback port in front of ``upstream``, which can stall.

    While :meth:`stalled` runs, no byte crosses in either direction and new connections
    are accepted but not connected upstream; afterwards everything held goes through in
    order (nothing is dropped: a paused, not a broken, network).
    """

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.port = 0

    async def __aenter__(self) -> StallingProxy:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self._flowing.set()
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    @contextlib.asynccontextmanager
    async def stalled(self) -> AsyncIterator[None]:
        """Forward nothing while the block runs."""
        self._flowing.clear()
        try:
            yield
        finally:
            self._flowing.set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._flowing.wait()
            up_reader, up_writer = await asyncio.open_connection(*self._upstream)
            try:
                async with asyncio.TaskGroup() as group:
                    group.create_task(self._pipe(reader, up_writer))
                    group.create_task(self._pipe(up_reader, writer))
            finally:
                up_writer.close()
        except (OSError, ExceptionGroup):
            pass  # one side went away: the other is closed below
        finally:
            writer.close()
            self._tasks.discard(task)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while chunk := await reader.read(65536):
            await self._flowing.wait()
            writer.write(chunk)
            await writer.drain()
        writer.close()
