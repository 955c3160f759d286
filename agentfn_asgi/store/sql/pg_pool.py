"""The PostgreSQL store's connections: a small pool of asyncpg connections, cheap to use.

Every store step is one short statement (or one short transaction), so what a pool costs per
checkout is paid four times a call. asyncpg's own ``Pool`` costs ≈ 60–80 µs of CPU per
checkout on top of the statement (measured here: 202 against 123 µs for an upsert one at a
time, 125 against 82 µs 16 at a time): a task for the acquire's timeout, a shielded task for
the release, a timer re-armed for every idle period. :class:`ConnectionPool` keeps the
connections in a list and hands them out directly:

- a free connection is taken with no task, timer or wait (the most recently used first, so
  a quiet store keeps using the same warm connection);
- when none is free and the pool is full, the caller waits in line; a released connection,
  or the room a closed one frees, goes to the first caller in line, never to one that
  arrives later; waiting and opening a connection are bounded together by ``timeout``
  (then :class:`TimeoutError`, which the store reports as unavailable);
- a connection is made by a task of its own, to the end: a caller that stops waiting
  (cancelled, timed out) leaves it to the next caller, and asyncpg's connect is never cut
  half way (that leaves a failed future of its TLS negotiation behind);
- a connection whose work failed in any way (a PostgreSQL error, a lost connection, a
  timeout, a cancellation) is closed rather than put back, and a fresh one is opened when
  needed: errors are rare, and after a cancellation asyncpg may still be cancelling the
  query on it. It is closed in the background with ``Connection.close()``, which first
  lets that cancellation finish, and it counts towards ``max_size`` until it is closed. A
  connection left inside a transaction, or closed by the server, is never handed out again;
- after a connection is lost (:meth:`ConnectionPool.expire`), every connection made before
  the loss is closed instead of reused: a server restart or a mass termination ends them
  all, and their sockets may not show it yet, so the caller's retry runs on a connection
  opened after the loss;
- a connection idle for longer than ``idle_lifetime`` (asyncpg's default, 300 s) is closed
  when it would next be handed out, or when another is given back (so the pool shrinks
  after a burst), and one a firewall dropped in silence is not used. An idle connection
  has nothing in flight, so its room is free at once, whatever its close takes.

What the store does not use is left out: no per-connection ``setup``/``init``, no session
reset on release (the store keeps no session state: no ``SET``, ``LISTEN``, cursors or
session-level locks). One pool belongs to one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from asyncpg import Connection
from asyncpg import exceptions as pg_errors

__all__ = ["ConnectionPool"]

Connector = Callable[[], Coroutine[Any, Any, "Connection[Any]"]]


def _closed_error() -> pg_errors.InterfaceError:
    return pg_errors.InterfaceError("the PostgreSQL store's connection pool is closed")


class ConnectionPool:
    """At most ``max_size`` connections made by ``connect`` (see the module doc)."""

    def __init__(
        self,
        connect: Connector,
        *,
        max_size: int,
        timeout: float,
        idle_lifetime: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_size < 1:
            raise ValueError("a pool needs room for at least one connection")
        self._connect = connect
        self._max = max_size
        self._timeout = timeout
        self._idle_lifetime = idle_lifetime
        self._clock = clock
        self._size = 0  # connections open, being opened or being closed
        self._generation = 0  # bumped by expire(): older connections are not reused
        self._idle: deque[tuple[Connection[Any], int, float]] = deque()  # (conn, gen, since)
        self._in_use: dict[Connection[Any], int] = {}  # conn -> its generation
        # A caller in line gets a connection, or None: there is room to open one.
        self._waiters: deque[asyncio.Future[Connection[Any] | None]] = deque()
        self._opening: set[asyncio.Task[Connection[Any]]] = set()
        # Closing in the background: failed ones (still counted in _size until closed)
        # and idle ones (not counted: nothing was in flight on them).
        self._retiring: dict[Connection[Any], asyncio.Task[None]] = {}
        self._dropping: set[asyncio.Task[None]] = set()
        self._closing = False
        self._returned = asyncio.Event()  # closing: the last connection in use came back

    @property
    def size(self) -> int:
        """Connections open, being opened or being closed."""
        return self._size

    async def start(self, count: int) -> None:
        """Open ``count`` connections now (at least one: a wrong URL or password shows at
        start, not at the first step)."""
        if count > self._max:
            raise ValueError(f"cannot open {count} connections in a pool of {self._max}")
        opened = [await self.acquire() for _ in range(max(count, 1))]
        for conn in opened:
            self.release(conn)

    async def acquire(self) -> Connection[Any]:
        """A connection for one step; give it back with :meth:`release`."""
        conn = self._take_idle()
        if conn is not None:
            return conn
        try:
            async with asyncio.timeout(self._timeout):
                return await self._acquire_waiting()
        except TimeoutError as exc:
            raise TimeoutError(
                f"no PostgreSQL connection within {self._timeout:g} s"
                f" ({self._size} of at most {self._max} open, in use or connecting)"
            ) from exc

    def release(self, conn: Connection[Any], *, reusable: bool = True) -> None:
        """Give ``conn`` back; ``reusable=False`` (its work failed) closes it."""
        generation = self._in_use.pop(conn, None)
        if generation is None:  # handed out before terminate() (a second release of one
            conn.terminate()  # checkout is the caller's bug: the pool cannot tell)
            return
        if (
            not reusable
            or generation < self._generation
            or conn.is_closed()
            or conn.is_in_transaction()
        ):
            self._retire(conn)
        elif self._closing:
            self._idle.append((conn, generation, self._clock()))  # close() closes it
        else:
            while self._waiters:
                waiter = self._waiters.popleft()
                if not waiter.done():
                    self._in_use[conn] = generation
                    waiter.set_result(conn)
                    return
            now = self._clock()
            self._idle.append((conn, generation, now))
            if now - self._idle[0][2] > self._idle_lifetime:  # the longest idle: shrink
                self._drop(self._idle.popleft()[0])
        if self._closing and not self._in_use:
            self._returned.set()

    def expire(self, lost: Connection[Any]) -> None:
        """``lost`` (not yet released) died under its caller: the connections opened
        before it are closed instead of reused; the ones opened since are kept."""
        if self._in_use.get(lost, -1) < self._generation:
            return  # an older loss already expired it
        self._generation += 1
        while self._idle:
            self._drop(self._idle.pop()[0])

    async def close(self) -> None:
        """Refuse new checkouts, wait for the connections in use to come back, close all
        of them gracefully. Bound it with a timeout and call :meth:`terminate` after."""
        self._closing = True
        self._fail_waiters()
        if self._in_use:
            await self._returned.wait()
        # A connection still being made is closed as soon as it is made. asyncio.wait, not
        # gather: a close() cut short by its caller's timeout must not cancel them.
        if self._opening:
            await asyncio.wait(set(self._opening))
        while self._idle:
            self._drop(self._idle.pop()[0])
        closing = {*self._retiring.values(), *self._dropping}
        if closing:
            await asyncio.wait(closing)

    def terminate(self) -> None:
        """Close every connection at once, in use or not."""
        self._closing = True
        self._fail_waiters()
        # The connections being made keep their count: each drops it when made.
        self._size -= len(self._idle) + len(self._in_use) + len(self._retiring)
        for conn in [*(idle[0] for idle in self._idle), *self._in_use, *self._retiring]:
            conn.terminate()
        for task in [*self._retiring.values(), *self._dropping]:
            task.cancel()
        self._idle.clear()
        self._in_use.clear()
        self._retiring.clear()
        self._returned.set()

    # -- inside ----------------------------------------------------------------------------
    def _take_idle(self) -> Connection[Any] | None:
        if self._closing:
            raise _closed_error()
        now = self._clock()
        while self._idle:
            conn, generation, since = self._idle.pop()
            if conn.is_closed() or now - since > self._idle_lifetime:
                self._drop(conn)
                continue
            self._in_use[conn] = generation
            return conn
        return None

    async def _acquire_waiting(self) -> Connection[Any]:
        while True:
            conn = self._take_idle()
            if conn is not None:
                return conn
            if self._size < self._max:
                self._size += 1
                return await self._open()
            handed = await self._wait()
            if handed is not None:
                return handed
            # None: a connection was closed and its room kept for this caller (counted in
            # _size already), so a caller arriving later cannot take it first.
            return await self._open()

    async def _open(self) -> Connection[Any]:
        """Make a connection in the room the caller holds (counted in ``_size``)."""
        if self._closing:  # room kept for this caller just before close(): connect nothing
            self._size -= 1
            raise _closed_error()
        opening: asyncio.Task[Connection[Any]] = asyncio.get_running_loop().create_task(
            self._connect()
        )
        self._opening.add(opening)
        try:
            conn = await asyncio.shield(opening)
        except asyncio.CancelledError:
            opening.add_done_callback(self._adopt)  # it goes to the next caller when made
            raise
        except BaseException:
            self._opened(opening)
            raise
        self._opened(opening)
        if self._closing:  # closed while this one was connecting
            self._size -= 1
            conn.terminate()
            raise _closed_error()
        self._in_use[conn] = self._generation
        return conn

    def _opened(self, opening: asyncio.Task[Connection[Any]]) -> bool:
        """Bookkeeping once a connection is made, or failed to be; whether it was made."""
        self._opening.discard(opening)
        if opening.cancelled() or opening.exception() is not None:
            self._size -= 1
            self._wake_for_room()
            return False
        return True

    def _adopt(self, opening: asyncio.Task[Connection[Any]]) -> None:
        """A connection made for a caller that stopped waiting: the next caller's."""
        if not self._opened(opening):
            return
        conn = opening.result()
        if self._closing:
            self._size -= 1
            conn.terminate()
            return
        self._in_use[conn] = self._generation
        self.release(conn)

    async def _wait(self) -> Connection[Any] | None:
        waiter: asyncio.Future[Connection[Any] | None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except BaseException:
            # Cancelled or timed out: what was handed to us meanwhile goes to the next one.
            if not waiter.done():
                waiter.cancel()
            elif not waiter.cancelled() and waiter.exception() is None:
                handed = waiter.result()
                if handed is None:  # the room kept for us goes to the next one
                    self._size -= 1
                    self._wake_for_room()
                else:
                    self.release(handed)
            raise

    def _retire(self, conn: Connection[Any]) -> None:
        """Close ``conn`` in the background; its room is free once it is closed."""
        if conn.is_closed():
            conn.terminate()  # asyncpg's own clean-up of a connection the server closed
            self._size -= 1
            self._wake_for_room()
            return
        self._retiring[conn] = asyncio.get_running_loop().create_task(self._close(conn))

    def _drop(self, conn: Connection[Any]) -> None:
        """Close an idle ``conn`` (nothing in flight on it): its room is free at once."""
        self._size -= 1
        self._wake_for_room()
        if conn.is_closed():
            conn.terminate()
            return
        task = asyncio.get_running_loop().create_task(self._close(conn))
        self._dropping.add(task)
        task.add_done_callback(self._dropping.discard)

    async def _close(self, conn: Connection[Any]) -> None:
        """Close ``conn`` gracefully; a retired one gives its room back once closed."""
        try:
            # Waits for a cancellation still in flight; closed either way, since close()
            # aborts the connection when it cannot end it cleanly.
            with contextlib.suppress(Exception):
                await conn.close(timeout=self._timeout)
        finally:
            if self._retiring.pop(conn, None) is not None:  # retired, and not terminate()d
                self._size -= 1
                self._wake_for_room()

    def _wake_for_room(self) -> None:
        """Room was freed: keep it for the first caller in line, if any."""
        if self._size >= self._max:
            return
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._size += 1  # the room is that caller's now
                waiter.set_result(None)
                return

    def _fail_waiters(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_exception(_closed_error())
