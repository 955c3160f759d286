# ruff: noqa: S608 - the SQL here is built from this module's constants only.
"""The operator's reads at scale: ``python -m benchmarks.page_reads`` (``make bench-reads``).

For each store (SQLite, PostgreSQL, Redis) a store is filled in bulk with ``--calls`` calls
and as many resolved deliveries (mostly submitted successes, some failures and stale
calls, a few in doubt, held and waiting for submission, spread over two days), then an
:class:`~agentfn_asgi.AgentWebhookApp` runs over it against the package's fake Agents API,
in this process, on one event loop:

- **reads alone**: the operator's overview (``Operator.overview``, what ``status`` prints
  and the page's first screen shows) and the first page of calls (``Operator.calls``, 50
  newest), each timed ``--reads`` times;
- **acks**: signed deliveries (one call each, a plain async tool) are posted at ``--rate`` a
  second for ``--seconds`` seconds, their acknowledgement latency recorded, first with no
  page read (what this machine gives at that rate), then while the overview and the first
  page are read once a second.

Nothing is timed until the app's start-up sweep is done (a few seconds) and each read ran
once (the reader's connection, the caches).

Everything shares one loop, as in a server process that also serves the operator page: a
read that runs on the loop's thread delays every ack behind it. Prints one table: the
median and the worst of each read, and ack p50/p99/max. No number here is a test.

The fill writes rows straight into the tables (SQLite, PostgreSQL ``COPY``, its tallies'
triggers off meanwhile and the tallies counted once after) after the store made its
schema; Redis has no bulk path that keeps its indexes, so its calls go through the store's
own operations (``--redis-calls``, 10^5 by default: about 100 s here, where 10^6 would
take over 15 minutes; its counts and pages read sorted-set sizes and ranges, whose cost
grows with the logarithm of the calls stored).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import secrets
import sqlite3
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

from agentfn_asgi import FunctionTools
from agentfn_asgi.calls.records import CallKey, SavedResult
from agentfn_asgi.operator import CallFilter
from agentfn_asgi.store import open_store
from agentfn_asgi.store.base import Store
from agentfn_asgi.testing import FakeCall, action_required_event, connect, signed_delivery

__all__ = ["main"]

PG_URL = "postgresql://127.0.0.1:5432/test?schema=agentfn_bench_reads"
REDIS_URL = "redis://127.0.0.1:6379/0?key_prefix=agentfn-bench:reads:"

#: Seconds the app is left to its start-up sweep before anything is timed.
_SETTLE = 3.0
_EVENT = (
    '{"type":"agent.session.input.tool_result","turn_id":"turn_x","call_id":"call_x",'
    '"success":true,"output":"{\\"found\\":true}"}'
)
_COLUMNS = (
    "namespace", "session_id", "turn_id", "call_id", "tool_name", "state", "attempt", "owner",
    "lease_expires_at", "created_at", "updated_at", "delivery_id", "success", "event_json",
    "idempotency_key", "source", "next_attempt_at",
)  # fmt: skip
#: The calls' first seen times spread over the last two days: within the deliveries' dedup
#: window and the calls' retention, so the app's prune has nothing to do while measured.
_SPREAD = 2 * 86400.0


def _rows(n: int, now: float) -> Iterator[tuple[tuple[Any, ...], tuple[Any, ...]]]:
    """``n`` (call, delivery) rows: 97 % submitted successes, 1 % failures, 1 % stale, and
    per 10,000 calls 10 in doubt, 5 held and 10 saved, not yet submitted."""
    for i in range(n):
        sid = "sess_" + secrets.token_hex(10)
        did = "wh_" + secrets.token_hex(16)
        created = now - _SPREAD * (n - i) / n  # older first, as a store fills
        state, success = "submitted", True
        if i % 100 == 1:
            success = False
        elif i % 100 == 2:
            state, success = "stale", None
        elif i % 10_000 < 10 and i % 100 > 2:
            state, success = "claimed", None
        elif 10 <= i % 10_000 < 15:
            state, success = "quarantined", None
        elif 15 <= i % 10_000 < 25:
            state = "succeeded"
        lease = now - 3600 if state == "claimed" else created + 30
        saved = state in ("submitted", "succeeded")
        call = (
            "", sid, "turn_" + secrets.token_hex(6), "call_" + secrets.token_hex(8),
            "get_customer" if i % 3 else "lookup_order", state, 1, "bench", lease, created,
            created + 1, did, success, _EVENT if saved else None,
            "afn-submit-" + secrets.token_hex(24) if saved else None, "ran" if saved else None,
            created + 1,
        )  # fmt: skip
        yield call, (did, sid, created, True, "")


def _batches(n: int, size: int = 50_000) -> Iterator[list[tuple[tuple[Any, ...], tuple[Any, ...]]]]:
    now, batch = time.time(), []
    for pair in _rows(n, now):
        batch.append(pair)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


async def _fill_sqlite(path: str, n: int) -> None:
    store = open_store(f"sqlite:///{path}")
    await store.open()
    await store.close()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA synchronous = OFF")
        columns, marks = ", ".join(_COLUMNS), ", ".join("?" * len(_COLUMNS))
        insert_call = f"INSERT INTO calls ({columns}) VALUES ({marks})"
        for batch in _batches(n):
            conn.execute("BEGIN")
            conn.executemany(insert_call, [call for call, _ in batch])
            conn.executemany(
                "INSERT INTO deliveries (delivery_id, session_id, received_at, resolved,"
                " namespace) VALUES (?, ?, ?, ?, ?)",
                [delivery for _, delivery in batch],
            )
            conn.execute("COMMIT")
        conn.execute("ANALYZE")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


async def _fill_postgres(n: int) -> None:
    import asyncpg

    schema = "agentfn_bench_reads"
    conn = await asyncpg.connect("postgresql://127.0.0.1:5432/test")
    try:
        await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    finally:
        await conn.close()
    store = open_store(PG_URL)
    await store.open()
    await store.close()
    conn = await asyncpg.connect("postgresql://127.0.0.1:5432/test")
    tallied = await conn.fetchval(f"SELECT to_regclass('{schema}.tallies') IS NOT NULL")
    try:
        # A bulk load is one transaction per batch: the tallies' row triggers would update
        # one row 50,000 times in each (a chain of row versions as long): off while loading,
        # then counted once from the rows, as a store of the release before is on upgrade.
        for table in ("calls", "deliveries") if tallied else ():
            await conn.execute(f"ALTER TABLE {schema}.{table} DISABLE TRIGGER USER")
        for batch in _batches(n):
            await conn.copy_records_to_table(
                "calls", records=[c for c, _ in batch], columns=_COLUMNS, schema_name=schema
            )
            await conn.copy_records_to_table(
                "deliveries",
                records=[d for _, d in batch],
                columns=("delivery_id", "session_id", "received_at", "resolved", "namespace"),
                schema_name=schema,
            )
        if tallied:
            await _recount(conn, schema)
        await conn.execute(f"VACUUM ANALYZE {schema}.calls")
        await conn.execute(f"VACUUM ANALYZE {schema}.deliveries")
    finally:
        await conn.close()


async def _recount(conn: Any, schema: str) -> None:
    from agentfn_asgi.store.sql.compile import sql_tally_name

    name = sql_tally_name("")
    await conn.execute(f"DELETE FROM {schema}.tallies")
    await conn.execute(
        f"INSERT INTO {schema}.tallies (namespace, name, shard, n) SELECT namespace, {name},"
        f" 0, count(*) FROM {schema}.calls GROUP BY namespace, {name}"
    )
    await conn.execute(
        f"INSERT INTO {schema}.tallies (namespace, name, shard, n) SELECT namespace,"
        f" 'deliveries', 0, count(*) FROM {schema}.deliveries GROUP BY namespace"
    )
    for table in ("calls", "deliveries"):
        await conn.execute(f"ALTER TABLE {schema}.{table} ENABLE TRIGGER USER")


async def _fill_redis(n: int) -> None:
    import redis.asyncio as redis

    client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    try:
        async for key in client.scan_iter(match="agentfn-bench:reads:*", count=10_000):
            await client.delete(key)
    finally:
        await client.aclose()
    store = open_store(REDIS_URL)
    await store.open()
    result = SavedResult(True, _EVENT, "afn-submit-x")

    async def one(i: int) -> None:
        sid, did = "sess_" + secrets.token_hex(10), "wh_" + secrets.token_hex(16)
        key = CallKey(sid, "turn_" + secrets.token_hex(6), "call_" + secrets.token_hex(8))
        await store.record_delivery(did, sid)
        tool = "get_customer" if i % 3 else "lookup_order"
        await store.claim_call(
            key, tool_name=tool, owner="bench", lease_seconds=30, delivery_id=did,
            resolves_delivery=True,
        )  # fmt: skip
        if i % 10_000 < 10:
            return  # left claimed: in doubt once its lease runs out
        await store.save_result(key, owner="bench", attempt=1, result=result)
        if i % 100 == 2:
            await store.mark_stale(key)
        elif i % 10_000 >= 25:
            await store.mark_submitted(key)

    try:
        step = 500
        for start in range(0, n, step):
            await asyncio.gather(*(one(i) for i in range(start, min(n, start + step))))
    finally:
        await store.close()


@contextlib.asynccontextmanager
async def _store(kind: str, n: int, tmp: str) -> AsyncIterator[str]:
    started = time.perf_counter()
    if kind == "sqlite":
        path = os.path.join(tmp, "reads.sqlite3")
        await _fill_sqlite(path, n)
        url = f"sqlite:///{path}"
    elif kind == "postgres":
        await _fill_postgres(n)
        url = PG_URL
    else:
        await _fill_redis(n)
        url = REDIS_URL
    print(f"  {kind}: {n:,} calls filled in {time.perf_counter() - started:.0f} s", flush=True)
    yield url


def _ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1000:.1f} / {max(samples) * 1000:.1f}"


def _p(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def _timed(work: Callable[[], Any]) -> float:
    started = time.perf_counter()
    await work()
    return time.perf_counter() - started


async def measure(url: str, *, reads: int, seconds: float, rate: float) -> dict[str, Any]:
    """After the app's start-up sweep (a few seconds) and one untimed read of each (the
    reader's connection, the caches): the reads alone; acks at ``rate`` for ``seconds``
    with no page read (what the machine gives without it); acks at ``rate`` for
    ``seconds`` while the page is read every second."""
    tools = FunctionTools()

    @tools.function
    async def get_customer(customer_id: str = "c") -> dict[str, str]:
        """Look up a customer."""
        return {"id": customer_id}

    store: Store = open_store(url)
    async with connect(tools, store=store, webhooks=False) as conn:
        view = conn.app.operator()
        await asyncio.sleep(_SETTLE)
        await view.overview()
        await view.calls(CallFilter(limit=50))
        overview = [await _timed(view.overview) for _ in range(reads)]
        first = [await _timed(lambda: view.calls(CallFilter(limit=50))) for _ in range(reads)]

        async def read_page(until: float, page: list[float]) -> None:
            while time.monotonic() < until:
                page.append(await _timed(view.overview))
                await view.calls(CallFilter(limit=50))
                await asyncio.sleep(1.0)

        async def deliver(until: float, acks: list[float]) -> None:
            sent: list[asyncio.Task[None]] = []

            async def one() -> None:
                sid = conn.fake.create_session([[FakeCall("get_customer")]], deliver=False)
                body, headers = signed_delivery(
                    conn.fake.webhook_secrets, action_required_event(sid)
                )
                started = time.perf_counter()
                response = await conn.post_webhook(body, headers)
                acks.append(time.perf_counter() - started)
                assert response.status_code < 300, response.status_code

            while time.monotonic() < until:
                sent.append(asyncio.create_task(one()))
                await asyncio.sleep(1.0 / rate)
            await asyncio.gather(*sent)

        quiet: list[float] = []
        await deliver(time.monotonic() + seconds, quiet)
        acks: list[float] = []
        page: list[float] = []
        until = time.monotonic() + seconds
        await asyncio.gather(read_page(until, page), deliver(until, acks))
        return {
            "overview": overview,
            "first_page": first,
            "quiet": quiet,
            "acks": acks,
            "page": page,
        }


_HEADER = (
    "| store | calls | overview ms (median / max) | first page ms (median / max) |"
    " ack p99 ms, no page read | acks while read | ack p50 ms | ack p99 ms | ack max ms |"
    " overview while acking ms (median / max) |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def _row(kind: str, n: int, found: dict[str, Any]) -> str:
    acks = found["acks"]
    return (
        f"| {kind} | {n:,} | {_ms(found['overview'])} | {_ms(found['first_page'])} |"
        f" {_p(found['quiet'], 0.99):.1f} | {len(acks)} | {_p(acks, 0.5):.1f} |"
        f" {_p(acks, 0.99):.1f} | {max(acks) * 1000:.1f} |"
        f" {_ms(found['page'])} |"
    )


async def _main(args: argparse.Namespace) -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.store:
            n = args.redis_calls if kind == "redis" else args.calls
            async with _store(kind, n, tmp) as url:
                found = await measure(url, reads=args.reads, seconds=args.seconds, rate=args.rate)
            rows.append(_row(kind, n, found))
            print(rows[-1], flush=True)  # each store's as it is done, the table at the end
    print()
    print(_HEADER)
    print("\n".join(rows))


def main(argv: list[str] | None = None) -> None:
    """Fill, read, print the table (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--store", action="append", choices=["sqlite", "postgres", "redis"], default=None
    )
    parser.add_argument("--calls", type=int, default=1_000_000)
    parser.add_argument("--redis-calls", type=int, default=100_000)
    parser.add_argument("--reads", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=50.0)
    args = parser.parse_args(argv)
    args.store = args.store or ["sqlite", "postgres", "redis"]
    logging.getLogger("agentfn_asgi").setLevel(logging.WARNING)  # not a line per call
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
