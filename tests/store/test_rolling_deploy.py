# ruff: noqa: S608 - the SQL here interpolates only the schema names the tests generate.
"""A rolling deploy: the next release expands the schema while this one keeps working.

A test-only next step (SQL: a column and a partial index on the calls; Redis: an index of
the calls by tool) is taken by a store opened with it, as a replica of the next release
opens the store. A replica of this release, open since before, goes on answering calls
(claims, saves, submissions, deliveries) beside it, on the same calls; and a replica of
this release started after the step (a restart mid-deploy) opens the store one step ahead.
"""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import pytest

from agentfn_asgi.calls.records import CallKey, CallState, ClaimStatus
from agentfn_asgi.store import Store
from agentfn_asgi.store._versions import Step
from agentfn_asgi.store.redis import layout as _redis_layout
from agentfn_asgi.store.sql import schema as _sql_schema

from .conftest import POSTGRES_URL, REDIS_URL, StoreFactory, claim, result

pytestmark = pytest.mark.anyio

#: The next release's step on SQL: a column every existing row has as NULL, and an index.
SQL_STEP = Step(
    (
        "ALTER TABLE {p}calls ADD COLUMN note {text}",
        "CREATE INDEX IF NOT EXISTS calls_note ON {p}calls (namespace, note)"
        " WHERE note IS NOT NULL",
    ),
    readable_from=1,
)
#: The next release's step on Redis: a new index of every namespace's calls, by tool.
REDIS_STEP = Step(
    (
        """
for _, key in ipairs(redis.call('KEYS', P .. 'n:*:c:*')) do
  local space = string.sub(key, 1, #P + 43)
  local tool = redis.call('HGET', key, 'tool_name')
  redis.call('ZADD', space .. 'i:by_tool', 0, tool .. ':' .. key)
end
redis.call('INCR', P .. 'test:steps_taken')
""",
    ),
    readable_from=1,
)


#: What the next release's step left: the version row, what it added, the calls noted.
Expanded = tuple[list[tuple[int, int]], list[str], list[str]]


async def _expanded(backend: str, store: Any) -> Expanded:
    """The store's version, the index the next release's step added, the calls it noted."""
    if backend == "sqlite":
        with sqlite3.connect(store.path) as raw:
            version = raw.execute("SELECT version, readable_from FROM schema_version").fetchall()
            index = raw.execute("SELECT name FROM sqlite_master WHERE name = 'calls_note'")
            indexes = [name for (name,) in index]
            notes = [c for (c,) in raw.execute("SELECT call_id FROM calls WHERE note > ''")]
        raw.close()
        return version, indexes, notes
    if backend == "postgres":
        import asyncpg

        conn = await asyncpg.connect(POSTGRES_URL)
        try:
            schema = store._schema
            rows = await conn.fetch(f'SELECT version, readable_from FROM "{schema}".schema_version')
            made = await conn.fetch(
                "SELECT indexname FROM pg_indexes"
                " WHERE schemaname = $1 AND indexname = 'calls_note'",
                schema,
            )
            noted = await conn.fetch(f"SELECT call_id FROM \"{schema}\".calls WHERE note > ''")
        finally:
            await conn.close()
        return [tuple(row) for row in rows], [row[0] for row in made], [r[0] for r in noted]
    import redis.asyncio as redis_asyncio

    client: Any = redis_asyncio.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        marker = await client.hgetall(store._prefix + "layout")
        members = await client.zrange(store._index("by_tool"), 0, -1)
    finally:
        await client.aclose()
    return [(int(marker["version"]), int(marker["readable_from"]))], members, []


async def _note(backend: str, store: Any, key: CallKey) -> None:
    """The next release writing its new column (SQL only) on the call ``key``."""
    if backend == "sqlite":
        with sqlite3.connect(store.path) as raw:
            raw.execute("UPDATE calls SET note = 'n+1' WHERE call_id = ?", (key.call_id,))
        raw.close()
    elif backend == "postgres":
        import asyncpg

        conn = await asyncpg.connect(POSTGRES_URL)
        try:
            await conn.execute(
                f"UPDATE \"{store._schema}\".calls SET note = 'n+1' WHERE call_id = $1",
                key.call_id,
            )
        finally:
            await conn.close()


#: Every store with a schema (the memory store has none).
BACKENDS = pytest.mark.parametrize(
    "store_factory",
    [
        "sqlite",
        pytest.param("redis", marks=pytest.mark.backends),
        pytest.param("postgres", marks=pytest.mark.backends),
    ],
    indirect=True,
)


def _next_release(backend: str, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """From now on, stores opened are of the next release: they know its step. The version
    (and readable_from) that step gives."""
    module: Any = _redis_layout if backend == "redis" else _sql_schema
    step = REDIS_STEP if backend == "redis" else SQL_STEP
    monkeypatch.setattr(module, "STEPS", (*module.STEPS, step))
    return len(module.STEPS), 1


@BACKENDS
async def test_replicas_of_two_releases_answer_calls_on_one_store_during_a_rolling_deploy(
    store_factory: StoreFactory, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next release's additive step is taken while a replica of this release holds a
    claim; afterwards each replica saves, submits, claims and deduplicates on the other's
    records, the new one's column and index stay, and this release still opens the store."""
    backend: str = request.node.callspec.params["store_factory"]
    old = await store_factory()
    in_flight, later, restarted_call = (CallKey("s", "t", name) for name in ("a", "b", "c"))
    assert await claim(old, "old", in_flight) is ClaimStatus.CLAIMED
    assert await old.record_delivery("d1", "s") is True

    with monkeypatch.context() as patch:
        next_version = _next_release(backend, patch)
        new = await store_factory()
    version, added, _ = await _expanded(backend, new)
    assert version == [next_version]
    if backend == "redis":
        assert added == [f"lookup:{new._call_key(in_flight)}"]  # type: ignore[attr-defined]
    else:
        assert added == ["calls_note"]
        await _note(backend, new, in_flight)

    # The call claimed before the deploy: this release saves it, the next one submits it.
    saved = await old.save_result(in_flight, owner="old", attempt=1, result=result("a"))
    assert saved.state is CallState.SUCCEEDED
    await new.mark_submitted(in_flight)
    # A call the next release claims: this release sees it taken, then submits its result.
    assert await claim(new, "new", later) is ClaimStatus.CLAIMED
    assert await claim(old, "old", later) is ClaimStatus.BUSY
    await new.save_result(later, owner="new", attempt=1, result=result("b"))
    await old.mark_submitted(later)
    # Deliveries are deduplicated across the two.
    assert await new.record_delivery("d1", "s") is False
    assert await new.record_delivery("d2", "s") is True
    assert {d.delivery_id for d in await old.unresolved_deliveries(due_before=1e12)} == {
        "d1",
        "d2",
    }

    # A replica of this release restarted mid-deploy opens the store one step ahead.
    restarted: Store = await store_factory()
    assert await claim(restarted, "restarted", restarted_call) is ClaimStatus.CLAIMED
    await restarted.save_result(restarted_call, owner="restarted", attempt=1, result=result("c"))
    await new.mark_submitted(restarted_call)
    for key in (in_flight, later, restarted_call):
        record = await restarted.get_call(key)
        assert record is not None and record.state is CallState.SUBMITTED
    version, _, noted = await _expanded(backend, new)
    assert version == [next_version]
    assert noted == ([] if backend == "redis" else ["a"])


@BACKENDS
async def test_replicas_of_the_next_release_starting_together_take_its_step_once(
    store_factory: StoreFactory, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two replicas of the next release open a store of this one at once: both open and the
    step runs once (on SQL its ALTER TABLE would fail a second time; on Redis it counts its
    runs)."""
    backend: str = request.node.callspec.params["store_factory"]
    await store_factory()
    next_version = _next_release(backend, monkeypatch)
    first, second = await asyncio.gather(store_factory(), store_factory())
    version, _, _ = await _expanded(backend, first)
    assert version == [next_version]
    assert await claim(second, "second") is ClaimStatus.CLAIMED
    if backend == "redis":
        import redis.asyncio as redis_asyncio

        client: Any = redis_asyncio.Redis.from_url(REDIS_URL, decode_responses=True)
        try:
            assert await client.get(first._prefix + "test:steps_taken") == "1"  # type: ignore[attr-defined]
        finally:
            await client.aclose()
