"""PostgreSQL-specific behaviour of :class:`PostgresStore` (shared contract: test_contract.py).

Needs PostgreSQL on 127.0.0.1:5432 (database ``test``, user ``postgres``); skipped when it is
unreachable, failed instead under CI=true.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from agentfn_asgi.errors import StoreUnavailableError
from agentfn_asgi.records import CallKey, CallState, ClaimStatus, SavedResult

from .conftest import FakeClock as Clock
from .conftest import require_service

pytestmark = [pytest.mark.anyio, pytest.mark.backends]

asyncpg = pytest.importorskip("asyncpg")
from agentfn_asgi.store.postgres import PostgresStore  # noqa: E402 - after the driver check

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


def _result(text: str = "ok") -> SavedResult:
    return SavedResult(success=True, event_json=f'{{"output":"{text}"}}', idempotency_key="ik")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


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
    assert [row["table_name"] for row in tables] == ["calls", "deliveries"]
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


async def test_clock_values_round_trip_exactly(make_store: StoreMaker) -> None:
    """Times are stored as double precision from the injected clock, without rounding."""
    clock = Clock(1_712_345_678.987654321)
    store = await make_store(clock=clock)
    key = CallKey("s", "t", "c")
    outcome = await store.claim_call(key, tool_name="t", owner="o", lease_seconds=0.000123)
    assert outcome.record.created_at == clock.now
    assert outcome.record.lease_expires_at == clock.now + 0.000123
    await store.record_delivery("m", "s")
    [delivery] = await store.unresolved_deliveries(older_than=clock.now)
    assert delivery.received_at == clock.now


async def test_lease_takeover_uses_the_callers_clock_not_server_time(
    make_store: StoreMaker,
) -> None:
    """Lease expiry is judged by the injected clock: a clock far in the past still sees it live."""
    clock = Clock(1000.0)
    store = await make_store(clock=clock)
    key = CallKey("s", "t", "c")
    await store.claim_call(key, tool_name="t", owner="a", lease_seconds=5)
    clock.now += 4
    assert (await store.claim_call(key, tool_name="t", owner="b", lease_seconds=5)).status is (
        ClaimStatus.BUSY
    )
    clock.now += 2
    taken = await store.claim_call(key, tool_name="t", owner="b", lease_seconds=5)
    assert taken.status is ClaimStatus.IN_DOUBT
    assert taken.record.attempt == 2


async def test_concurrent_claims_from_two_instances_elect_one_owner(make_store: StoreMaker) -> None:
    """Two stores (two pools) racing on one call: exactly one CLAIMED, the rest BUSY."""
    clock = Clock()
    first, second = await make_store(clock=clock), await make_store(clock=clock)
    key = CallKey("sess", "turn", "call")
    outcomes = await asyncio.gather(
        *(
            store.claim_call(key, tool_name="t", owner=f"owner-{i}", lease_seconds=30)
            for i, store in enumerate([first, second] * 25)
        )
    )
    statuses = [o.status for o in outcomes]
    assert statuses.count(ClaimStatus.CLAIMED) == 1
    assert statuses.count(ClaimStatus.BUSY) == 49


async def test_concurrent_takeovers_of_an_expired_lease_elect_one(make_store: StoreMaker) -> None:
    """Racing re-claims of an expired lease: exactly one IN_DOUBT (attempt 2), the rest BUSY."""
    clock = Clock()
    first, second = await make_store(clock=clock), await make_store(clock=clock)
    key = CallKey("sess", "turn", "call")
    await first.claim_call(key, tool_name="t", owner="dead", lease_seconds=1)
    clock.now += 5
    outcomes = await asyncio.gather(
        *(
            store.claim_call(key, tool_name="t", owner=f"owner-{i}", lease_seconds=30)
            for i, store in enumerate([first, second] * 10)
        )
    )
    statuses = [o.status for o in outcomes]
    assert statuses.count(ClaimStatus.IN_DOUBT) == 1
    assert statuses.count(ClaimStatus.BUSY) == 19
    record = await first.get_call(key)
    assert record is not None
    assert record.attempt == 2


async def test_200_concurrent_record_delivery_accept_one(make_store: StoreMaker) -> None:
    """200 concurrent records of one delivery id over two instances: exactly one is new."""
    clock = Clock()
    stores = [await make_store(clock=clock, max_size=8) for _ in range(2)]
    results = await asyncio.gather(
        *(stores[i % 2].record_delivery("msg_same", "sess") for i in range(200))
    )
    assert results.count(True) == 1
    assert len(await stores[0].unresolved_deliveries(older_than=clock.now)) == 1


async def test_prune_deletes_in_batches(make_store: StoreMaker) -> None:
    """More rows than one batch are all pruned; newer rows and live calls stay."""
    clock = Clock()
    store = await make_store(clock=clock)
    for i in range(1_100):
        await store._execute(
            "seed",
            f"INSERT INTO {store._s}.deliveries (delivery_id, session_id, received_at)"  # noqa: S608
            " VALUES ($1, 's', $2)",
            f"old-{i}",
            clock.now - 1000,
        )
    done, live = CallKey("s", "t", "done"), CallKey("s", "t", "live")
    for key in (done, live):
        await store.claim_call(key, tool_name="t", owner="o", lease_seconds=10)
    await store.mark_stale(done)
    clock.now += 10
    await store.record_delivery("new", "s")
    assert await store.prune(deliveries_before=clock.now - 1, calls_before=clock.now) == 1_101
    stats = await store.stats()
    assert stats.deliveries == 1
    assert stats.calls_by_state[CallState.CLAIMED] == 1
    assert stats.calls_by_state.get(CallState.STALE, 0) == 0


async def test_unreachable_postgres_raises_unavailable_quickly() -> None:
    """A closed port gives StoreUnavailableError within about a second, for open and for use."""
    store = PostgresStore(
        f"postgresql://postgres@127.0.0.1:{_free_port()}/test", command_timeout=1.0
    )
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError, match="unavailable"):
        await store.open()
    with pytest.raises(StoreUnavailableError):
        await store.record_delivery("m", "s")
    assert time.monotonic() - started < 3.0
    await store.close()


async def test_closed_store_is_unavailable(make_store: StoreMaker) -> None:
    """After close() every call raises StoreUnavailableError; open() makes it usable again."""
    store = await make_store(clock=Clock())
    await store.close()
    await store.close()
    with pytest.raises(StoreUnavailableError):
        await store.ping()
    await store.open()
    await store.ping()


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
