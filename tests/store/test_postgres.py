# ruff: noqa: S608 - the SQL here interpolates only the schema names the tests generate.
"""PostgreSQL-specific behaviour of :class:`PostgresStore` (shared contract: test_contract.py).

Needs PostgreSQL on 127.0.0.1:5432 (database ``test``, user ``postgres``); skipped when it is
unreachable, failed instead under CI=true.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from agentfn_asgi.calls.records import CallKey, ClaimStatus, Limit
from agentfn_asgi.errors import (
    ConfigurationError,
    StoreError,
    StoreRefusedError,
    StoreUnavailableError,
)
from agentfn_asgi.store.sql.schema import STEPS

from ..support.clock import FakeClock as Clock
from ..support.ports import free_port
from ..support.waiting import until
from .conftest import hold_for_approval, require_service

pytestmark = [pytest.mark.anyio, pytest.mark.backends]

asyncpg = pytest.importorskip("asyncpg")
from agentfn_asgi.store.sql.postgres import PostgresStore  # noqa: E402 - after the driver check

POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"


StoreMaker = Callable[..., Any]


@pytest.fixture
async def make_store() -> AsyncIterator[StoreMaker]:
    """Factory of opened PostgresStores on one unique schema; closes them, drops the schema."""
    schema = f"agentfn_test_{uuid.uuid4().hex[:16]}"
    made: list[PostgresStore] = []
    schemas = {schema}

    async def make(url: str = POSTGRES_URL, **options: Any) -> PostgresStore:
        options.setdefault("schema", schema)
        schemas.add(options["schema"])
        store = PostgresStore(url, **options)
        made.append(store)
        try:
            await store.open()
        except StoreUnavailableError as exc:
            require_service("postgres", str(exc))
        return store

    try:
        yield make
    finally:
        for store in made:
            await store.close()
        for name in schemas:
            cleaner = PostgresStore(POSTGRES_URL, schema=name)
            try:
                await cleaner.destroy()
            except StoreUnavailableError:
                pass
            finally:
                await cleaner.close()


async def _query(sql: str, *args: object) -> list[Any]:
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def _execute(sql: str) -> None:
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


async def test_schemas_isolate_stores_and_destroy_drops_only_its_own(
    make_store: StoreMaker,
) -> None:
    """Two schemas hold separate data; tables live in the named schema; destroy() drops one."""
    other = f"agentfn_test_{uuid.uuid4().hex[:16]}"
    mine = await make_store(clock=Clock())
    theirs = await make_store(clock=Clock(), schema=other)
    key = CallKey("sess", "turn", "call")
    for store in (mine, theirs):
        assert await store.record_delivery("msg_1", "sess") is True
        assert (await store.claim_call(key, tool_name="t", owner="o", lease_seconds=30)).status is (
            ClaimStatus.CLAIMED
        )
    tables = await _query(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = $1"
        " ORDER BY table_name",
        other,
    )
    assert [row["table_name"] for row in tables] == [
        "buckets",
        "calls",
        "deliveries",
        "revoked_tokens",
        "schema_version",
        "tallies",
    ]
    await theirs.destroy()
    assert await _query("SELECT 1 FROM pg_namespace WHERE nspname = $1", other) == []
    assert await mine.get_call(key) is not None


async def test_schema_name_is_quoted(make_store: StoreMaker) -> None:
    """A schema name with capitals, spaces and quotes is used verbatim, never as SQL."""
    name = f'Odd "name"; DROP {uuid.uuid4().hex[:6]}'
    store = await make_store(clock=Clock(), schema=name)
    assert await store.record_delivery("m", "s") is True
    assert await _query("SELECT 1 FROM pg_namespace WHERE nspname = $1", name) != []


async def test_replicas_opening_together_create_the_schema_once(make_store: StoreMaker) -> None:
    """Eight stores opening a fresh schema at once do not race on DDL (advisory lock)."""
    schema = f"agentfn_test_{uuid.uuid4().hex[:16]}"
    stores = await asyncio.gather(
        *(make_store(clock=Clock(), schema=schema, min_size=1, max_size=2) for _ in range(8))
    )
    assert await stores[0].record_delivery("m", "s") is True
    assert await stores[7].record_delivery("m", "s") is False


async def test_unreachable_postgres_raises_unavailable_quickly() -> None:
    """A closed port gives StoreUnavailableError within about a second, for open and for use."""
    store = PostgresStore(
        f"postgresql://postgres@127.0.0.1:{free_port()}/test", command_timeout=1.0
    )
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError, match="unavailable"):
        await store.open()
    with pytest.raises(StoreUnavailableError):
        await store.record_delivery("m", "s")
    assert time.monotonic() - started < 3.0
    await store.close()


@pytest.mark.parametrize(
    ("url", "fix"),
    [
        (
            "postgresql://postgres@127.0.0.1:5432/agentfn_no_such_db",
            'database "agentfn_no_such_db" does not exist: create it (createdb agentfn_no_such_db)',
        ),
        (
            "postgresql://agentfn_no_such_role@127.0.0.1:5432/test",
            "create the role (createuser agentfn_no_such_role) or fix the user",
        ),
        (
            "postgresql://postgres@127.0.0.1:5432/test?statment_timeout=5000",
            "?statment_timeout= in the store URL is neither a PostgreSQL setting nor ours",
        ),
    ],
)
async def test_a_url_the_server_refuses_is_named_with_its_fix(url: str, fix: str) -> None:
    """A missing database, role or setting ended in a StoreError traceback at start-up; it
    is now the configuration error the start-up prints as one line, with what to run."""
    await _reachable()
    store = PostgresStore(url, command_timeout=5.0)
    with pytest.raises(ConfigurationError, match=re.escape(fix)):
        await store.open()
    await store.close()


async def _reachable() -> None:
    try:
        await (await asyncpg.connect(POSTGRES_URL, timeout=5)).close()
    except (OSError, asyncpg.PostgresError) as exc:
        require_service("postgres", str(exc))


@pytest.mark.parametrize(("min_size", "max_size"), [(3, 2), (0, 0), (-1, 4)])
def test_pool_sizes_that_cannot_work_are_a_configuration_error(
    min_size: int, max_size: int
) -> None:
    with pytest.raises(ConfigurationError, match="min_size"):
        PostgresStore(POSTGRES_URL, min_size=min_size, max_size=max_size)


async def test_an_open_cancelled_half_way_leaves_no_connection_open() -> None:
    """open() cancelled while it waits for the schema lock (another replica upgrading):
    the connections it opened are closed, not left to the garbage collector."""
    name = f"agentfn-test-{uuid.uuid4().hex[:12]}"
    schema = f"agentfn_test_{uuid.uuid4().hex[:16]}"
    try:
        other = await asyncpg.connect(POSTGRES_URL)
    except OSError as exc:
        require_service("postgres", str(exc))
    try:
        async with other.transaction():
            await other.execute(
                "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
                f"agentfn-asgi schema {schema}",
            )
            store = PostgresStore(
                f"{POSTGRES_URL}?application_name={name}", schema=schema, min_size=2
            )
            opening = asyncio.create_task(store.open())
            # connected, waiting for the lock
            await until(lambda: _count(_BY_NAME, name, 2))
            opening.cancel()
            with pytest.raises(asyncio.CancelledError):
                await opening
        await until(lambda: _count(_BY_NAME, name, 0))  # the server sees the sockets close
    finally:
        await other.close()


async def test_a_cancelled_close_still_closes_every_connection(make_store: StoreMaker) -> None:
    """close() cancelled while a step is in flight (a host's shutdown cut short): the pool
    is terminated, not dropped with its connections open."""
    name = f"agentfn-test-{uuid.uuid4().hex[:12]}"
    store = await make_store(f"{POSTGRES_URL}?application_name={name}", min_size=2)
    step = asyncio.create_task(store._execute("sleep", "SELECT pg_sleep(0.5)"))
    await until(lambda: _count(_BY_NAME_RUNNING, name, 1))
    closing = asyncio.create_task(store.close())
    await asyncio.sleep(0.05)  # waiting for the step's connection to come back
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    await asyncio.gather(step, return_exceptions=True)  # terminated under it, or done
    await until(lambda: _count(_BY_NAME, name, 0))
    await store.close()  # still idempotent


_BY_NAME = "SELECT pid FROM pg_stat_activity WHERE application_name = $1"
_BY_NAME_RUNNING = _BY_NAME + " AND query LIKE 'SELECT pg_sleep%' AND state = 'active'"


async def _count(sql: str, name: str, n: int) -> bool:
    return len(await _query(sql, name)) == n


async def test_recovers_after_its_backends_are_terminated(make_store: StoreMaker) -> None:
    """pg_terminate_backend of every pooled connection: the next calls reconnect and succeed."""
    name = f"agentfn-test-{uuid.uuid4().hex[:12]}"
    store = await make_store(f"{POSTGRES_URL}?application_name={name}", clock=Clock(), max_size=4)
    await asyncio.gather(*(store.record_delivery(f"m{i}", "s") for i in range(10)))
    # Only this store's connections (by application_name): other tests may share the server.
    killed = await _query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", name
    )
    assert killed
    results = await asyncio.gather(*(store.record_delivery(f"after-{i}", "s") for i in range(8)))
    assert all(results)
    await store.ping()


async def test_schema_version_is_recorded_and_an_unreadable_one_is_refused(
    make_store: StoreMaker,
) -> None:
    """open() makes the newest schema (its indexes are these) and records its version; data a later
    release made unreadable to this one (a contract step) is refused with a StoreError
    naming both versions."""
    schema = f"agentfn_test_{uuid.uuid4().hex[:16]}"
    await make_store(clock=Clock(), schema=schema)
    versions = await _query(f'SELECT version, readable_from FROM "{schema}".schema_version')
    assert [tuple(row) for row in versions] == [(len(STEPS), 2)]
    indexes = await _query("SELECT indexname FROM pg_indexes WHERE schemaname = $1", schema)
    assert {row["indexname"] for row in indexes} == {
        "deliveries_pkey",
        "deliveries_due",
        "deliveries_listed",
        "deliveries_unresolved",
        "calls_pkey",
        "calls_listed",
        "calls_state",
        "calls_tool",
        "calls_claimed",
        "calls_due",
        "calls_finished",
        "calls_approval",
        "calls_waiting",
        "calls_approved",
        "calls_limiter",
        "calls_line",
        "calls_waiters",
        "revoked_tokens_pkey",
        "buckets_pkey",
        "tallies_pkey",
    }
    await _execute(f'UPDATE "{schema}".schema_version SET version = 3, readable_from = 3')
    newer = PostgresStore(POSTGRES_URL, schema=schema)
    with pytest.raises(StoreError, match="schema version 3, readable from version 3") as info:
        await newer.open()
    assert not isinstance(info.value, StoreUnavailableError)
    await newer.close()
    await _execute(
        f'UPDATE "{schema}".schema_version SET version = {len(STEPS)}, readable_from = 1'
    )


async def test_values_postgres_refuses_are_refused_not_failed(make_store: StoreMaker) -> None:
    """A NUL, a lone surrogate, and a limiter's name past the size of an index row: each is
    a StoreRefusedError (retrying never succeeds: the dispatcher fails such a call instead
    of treating it as an outage), and the store goes on."""
    store = await make_store()
    huge = Limit(name="t\x1f" + secrets.token_hex(5_000), concurrency=1)  # does not compress
    refused: list[tuple[str, Limit | None]] = [("a\x00b", None), ("a\ud800", None), ("t", huge)]
    for n, (tool_name, limit) in enumerate(refused):
        with pytest.raises(StoreRefusedError, match="refused the data"):
            await store.claim_call(
                CallKey("s", "t", f"c{n}"),
                tool_name=tool_name,
                owner="o",
                lease_seconds=5,
                limit=limit,
            )
    claimed = await store.claim_call(
        CallKey("s", "t", "c"), tool_name="t", owner="o", lease_seconds=5
    )
    assert claimed.status is ClaimStatus.CLAIMED


async def test_the_approvals_list_reads_only_the_rows_it_shows(make_store: StoreMaker) -> None:
    """With 1,000 requests waiting (one expiry: the key breaks the tie), the page's list of
    200 reads 200 rows from the index in its order, never sorting every waiting row."""
    from agentfn_asgi.store.sql.dialect import postgres_dialect
    from agentfn_asgi.store.sql.statements import WORKLIST_READS

    store = await make_store()
    await hold_for_approval(store, 1000, expires_at=time.time() + 3600)
    listed = await store.waiting_approvals(limit=200)
    assert [r.key.call_id for r in listed] == [f"c{i:05}" for i in range(200)]
    assert await store.count_waiting_approvals() == 1000
    dialect = postgres_dialect(store._schema)
    await _execute(f"ANALYZE {dialect.prefix}calls")
    listing = dialect.render(WORKLIST_READS["waiting_approvals", False, False])
    query = "EXPLAIN (ANALYZE, FORMAT JSON) " + listing.text
    [row] = await _query(query, "", 200)
    nodes, plan = [], json.loads(row[0])[0]["Plan"]
    while plan:
        nodes.append(plan)
        plan = (plan.get("Plans") or [None])[0]
    assert not [n for n in nodes if "Sort" in n["Node Type"]], nodes
    [scan] = [n for n in nodes if "Scan" in n["Node Type"]]
    assert scan.get("Index Name") == "calls_waiting" and scan["Actual Rows"] <= 201, nodes
