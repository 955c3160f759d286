"""The PostgreSQL store's connection pool (:mod:`agentfn_asgi.store.sql.pg_pool`), on a real
PostgreSQL: connections reused, callers served in line, failed and lost connections never
handed out again, nothing leaked when a caller gives up.

Needs PostgreSQL on 127.0.0.1:5432 (database ``test``, user ``postgres``); skipped when it is
unreachable, failed instead under CI=true.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from ..support.clock import FakeClock
from ..support.waiting import until
from .conftest import POSTGRES_URL, require_service

pytestmark = [pytest.mark.anyio, pytest.mark.backends]

asyncpg = pytest.importorskip("asyncpg")
from agentfn_asgi.store.sql.pg_pool import ConnectionPool  # noqa: E402 - after the driver check

PoolMaker = Callable[..., Any]


@pytest.fixture
async def make_pool() -> AsyncIterator[PoolMaker]:
    pools: list[ConnectionPool] = []

    async def make(max_size: int = 2, wait: float = 5.0, **options: Any) -> ConnectionPool:
        name = f"agentfn-pool-{uuid.uuid4().hex[:12]}"

        async def connect() -> Any:
            return await asyncpg.connect(
                POSTGRES_URL, timeout=wait, server_settings={"application_name": name}
            )

        pool = ConnectionPool(connect, max_size=max_size, timeout=wait, **options)
        pool.name = name  # type: ignore[attr-defined]  # for the admin queries below
        try:
            await pool.start(1)
        except (OSError, asyncpg.PostgresError) as exc:
            require_service("postgres", str(exc))
        pools.append(pool)
        return pool

    yield make
    for pool in pools:
        await asyncio.wait_for(pool.close(), 10)


async def _on_backends(what: str, name: str) -> list[Any]:
    """``SELECT what`` for each server backend of the pool named ``name``, from outside it."""
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        rows = await conn.fetch(
            f"SELECT {what} FROM pg_stat_activity WHERE application_name = $1",  # noqa: S608
            name,
        )
        return [row[0] for row in rows]
    finally:
        await conn.close()


async def _backends(name: str) -> list[Any]:
    return await _on_backends("pid", name)


async def _terminate(name: str) -> None:
    await _on_backends("pg_terminate_backend(pid)", name)


async def _pid(pool: ConnectionPool) -> int:
    conn = await pool.acquire()
    try:
        pid: int = await conn.fetchval("SELECT pg_backend_pid()")
        return pid
    finally:
        pool.release(conn)


async def _take(pool: ConnectionPool, name: str, order: list[str]) -> None:
    """Take a connection, note who got it, hold it a moment, give it back."""
    conn = await pool.acquire()
    order.append(name)
    await asyncio.sleep(0.01)
    pool.release(conn)


async def test_one_step_at_a_time_reuses_one_connection(make_pool: PoolMaker) -> None:
    pool = await make_pool(max_size=4)
    pids = {await _pid(pool) for _ in range(20)}
    assert len(pids) == 1 and pool.size == 1


async def test_never_more_than_max_size_and_callers_in_line_are_all_served(
    make_pool: PoolMaker,
) -> None:
    pool = await make_pool(max_size=3)

    async def step(n: int) -> int:
        conn = await pool.acquire()
        try:
            value: int = await conn.fetchval("SELECT $1::int FROM pg_sleep(0.01)", n)
            return value
        finally:
            pool.release(conn)

    assert await asyncio.gather(*(step(n) for n in range(40))) == list(range(40))
    assert pool.size == 3
    assert len(await _backends(pool.name)) == 3


async def test_waiting_for_a_connection_is_bounded_by_the_timeout(make_pool: PoolMaker) -> None:
    pool = await make_pool(max_size=1, wait=0.3)
    held = await pool.acquire()
    with pytest.raises(TimeoutError, match=r"no PostgreSQL connection within 0\.3 s"):
        await pool.acquire()
    pool.release(held)
    assert await _pid(pool) > 0  # the caller that timed out left nothing behind


async def test_a_released_connection_goes_to_the_first_caller_in_line(
    make_pool: PoolMaker,
) -> None:
    pool = await make_pool(max_size=1)
    held = await pool.acquire()
    order: list[str] = []
    first = asyncio.create_task(_take(pool, "first", order))
    await asyncio.sleep(0.01)
    second = asyncio.create_task(_take(pool, "second", order))
    await asyncio.sleep(0.01)
    pool.release(held)
    await asyncio.gather(first, second)
    assert order == ["first", "second"]


async def test_a_connection_handed_to_a_cancelled_caller_goes_to_the_next(
    make_pool: PoolMaker,
) -> None:
    pool = await make_pool(max_size=1, wait=2.0)
    held = await pool.acquire()
    doomed = asyncio.create_task(pool.acquire())
    await asyncio.sleep(0.01)  # in line
    pool.release(held)  # handed to it; its task has not run yet
    doomed.cancel()
    with pytest.raises(asyncio.CancelledError):
        await doomed
    # The connection was passed on, not lost with the cancelled caller: no timeout here.
    assert await _pid(pool) > 0
    assert pool.size == 1


async def test_a_failed_step_s_connection_is_closed_not_reused(make_pool: PoolMaker) -> None:
    pool = await make_pool(max_size=2)
    before = await _pid(pool)
    conn = await pool.acquire()
    with pytest.raises(asyncpg.PostgresError):
        await conn.execute("SELECT no_such_column FROM pg_class")
    pool.release(conn, reusable=False)
    assert await _pid(pool) != before


async def test_a_step_cancelled_mid_query_leaves_a_working_pool(make_pool: PoolMaker) -> None:
    pool = await make_pool(max_size=1)
    before = await _pid(pool)

    async def slow() -> None:
        conn = await pool.acquire()
        done = False
        try:
            await conn.execute("SELECT pg_sleep(5)")
            done = True
        finally:
            pool.release(conn, reusable=done)

    task = asyncio.create_task(slow())
    await asyncio.sleep(0.2)  # the query is running on the server
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The cancelled connection is closed once its cancellation is through; a new one serves.
    after = await asyncio.wait_for(_pid(pool), 5)
    assert after != before


async def test_after_a_lost_connection_no_older_connection_is_reused(
    make_pool: PoolMaker,
) -> None:
    pool = await make_pool(max_size=3)
    conns = [await pool.acquire() for _ in range(3)]
    old = {await conn.fetchval("SELECT pg_backend_pid()") for conn in conns}
    pool.release(conns[1])
    pool.release(conns[2])  # idle, as far as the pool can tell
    pool.expire(conns[0])  # the first died under its caller
    pool.release(conns[0], reusable=False)
    pids = set()
    held = []
    for _ in range(3):
        conn = await pool.acquire()
        held.append(conn)
        pids.add(await conn.fetchval("SELECT pg_backend_pid()"))
    assert pids.isdisjoint(old)
    for conn in held:
        pool.release(conn)


async def test_idle_connections_killed_by_the_server_are_skipped(make_pool: PoolMaker) -> None:
    pool = await make_pool(max_size=2)
    first, second = await pool.acquire(), await pool.acquire()
    pool.release(first)
    pool.release(second)
    await _terminate(pool.name)

    async def seen_closed() -> bool:  # the sockets' EOF has reached the loop
        return bool(first.is_closed() and second.is_closed())

    await until(seen_closed)  # not a fixed sleep: pg_terminate_backend only signals
    assert await _pid(pool) > 0


async def test_a_connection_idle_too_long_is_replaced(make_pool: PoolMaker) -> None:
    clock = FakeClock()
    pool = await make_pool(max_size=2, idle_lifetime=60.0, clock=clock)
    before = await _pid(pool)
    clock.advance(30)
    assert await _pid(pool) == before
    clock.advance(61)
    assert await _pid(pool) != before


async def test_close_waits_for_connections_in_use_and_then_refuses(make_pool: PoolMaker) -> None:
    pool = await make_pool(max_size=2)
    conn = await pool.acquire()
    closing = asyncio.create_task(pool.close())
    await asyncio.sleep(0.05)
    assert not closing.done()
    with pytest.raises(asyncpg.InterfaceError, match="closed"):
        await pool.acquire()
    pool.release(conn)
    await asyncio.wait_for(closing, 5)
    assert conn.is_closed()
    assert await _backends(pool.name) == []


async def test_a_caller_in_line_is_told_when_the_pool_closes(make_pool: PoolMaker) -> None:
    pool = await make_pool(max_size=1)
    held = await pool.acquire()
    waiting = asyncio.create_task(pool.acquire())
    await asyncio.sleep(0.01)
    pool.terminate()
    with pytest.raises(asyncpg.InterfaceError, match="closed"):
        await waiting
    assert held.is_closed()
    pool.release(held)  # after terminate(): nothing to do, nothing raised


class _BlackHole:
    """A TCP proxy to PostgreSQL that, once frozen, swallows everything in both directions
    without closing: what a firewall that dropped an idle flow looks like."""

    def __init__(self) -> None:
        self.frozen = False
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port: int = self.server.sockets[0].getsockname()[1]
        return port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", 5432)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            while data := await src.read(1 << 16):
                if not self.frozen:
                    dst.write(data)
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def close(self) -> None:
        assert self.server is not None
        self.server.close()


async def test_stale_idle_connections_never_hold_up_a_caller(make_pool: PoolMaker) -> None:
    """A full pool whose idle connections have all outlived ``idle_lifetime``, on flows a
    firewall dropped (their close would wait for its timeout): the next caller gets a new
    connection at once instead of waiting for room."""
    hole = _BlackHole()
    port = await hole.start()
    clock = FakeClock()
    made: list[Any] = []

    async def connect() -> Any:
        url = f"postgresql://postgres@127.0.0.1:{port}/test" if not made else POSTGRES_URL
        conn = await asyncpg.connect(url, timeout=5)
        made.append(conn)
        return conn

    pool = ConnectionPool(connect, max_size=1, timeout=1.0, idle_lifetime=60.0, clock=clock)
    try:
        await pool.start(1)  # through the proxy
        hole.frozen = True
        clock.advance(61)
        conn = await pool.acquire()  # timed out waiting for the old one's close before
        assert conn is made[1]
        assert await conn.fetchval("SELECT 1") == 1
        pool.release(conn)
    finally:
        pool.terminate()
        await hole.close()


async def test_terminate_while_connecting_keeps_the_count_right(make_pool: PoolMaker) -> None:
    pool = await make_pool(max_size=2)
    held = await pool.acquire()
    connecting = asyncio.create_task(pool.acquire())  # room for one more: it connects
    await asyncio.sleep(0)
    pool.terminate()
    with pytest.raises(asyncpg.InterfaceError, match="closed"):
        await connecting
    assert pool.size == 0
    pool.release(held)
    assert pool.size == 0


async def test_room_freed_for_the_caller_in_line_is_not_taken_by_a_later_one(
    make_pool: PoolMaker,
) -> None:
    pool = await make_pool(max_size=1)
    held = await pool.acquire()
    order: list[str] = []
    first = asyncio.create_task(_take(pool, "first in line", order))
    await asyncio.sleep(0.01)
    later = asyncio.create_task(_take(pool, "later", order))  # runs before the woken caller resumes
    held.terminate()  # lost: its room is free at once, for the caller in line
    pool.release(held, reusable=False)
    await asyncio.wait_for(asyncio.gather(first, later), 10)
    assert order == ["first in line", "later"]


@pytest.mark.parametrize("how", ["close", "terminate"])
async def test_room_kept_for_a_caller_in_line_as_the_pool_closes_opens_nothing(
    make_pool: PoolMaker, how: str
) -> None:
    """A lost connection frees room for the caller in line, and the pool closes in the same
    turn: that caller is told the pool is closed without connecting first (a connect after
    close() returned would outlive it, and be cut half way when the loop stops)."""
    pool = await make_pool(max_size=1)
    connects = 0
    connect = pool._connect

    async def counted() -> Any:
        nonlocal connects
        connects += 1
        return await connect()

    pool._connect = counted
    held = await pool.acquire()
    waiting = asyncio.create_task(pool.acquire())
    await asyncio.sleep(0.01)
    held.terminate()
    pool.release(held, reusable=False)  # its room is the caller in line's
    if how == "close":
        await pool.close()
    else:
        pool.terminate()
    with pytest.raises(asyncpg.InterfaceError, match="closed"):
        await waiting
    assert (connects, pool.size) == (0, 0)
