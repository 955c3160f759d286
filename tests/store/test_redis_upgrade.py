"""Upgrading Redis data of key layout 2 (records outside the namespaces) to layout 3.

The data is ``fixtures/redis_layout2.json``, written by the layout 2 code itself (its header
names the commit and the command): work in flight in the namespaces ``""`` and ``proj_x``.
Each test restores it under a fresh key prefix and opens it with today's store.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from agentfn_asgi.errors import StoreUnavailableError
from agentfn_asgi.records import (
    CallKey,
    CallQuery,
    CallState,
    ClaimStatus,
    SavedResult,
)
from agentfn_asgi.states import HISTORY_HEAD, HISTORY_TAIL

from .conftest import FakeClock, require_service

pytestmark = [pytest.mark.anyio, pytest.mark.backends]

redis_asyncio = pytest.importorskip("redis.asyncio")
from agentfn_asgi.store import _redis_scripts  # noqa: E402 - after the driver check
from agentfn_asgi.store.redis import RedisStore  # noqa: E402
from agentfn_asgi.store.redis import _h as h  # noqa: E402

REDIS_URL = "redis://127.0.0.1:6379/0"
FIXTURE = json.loads((Path(__file__).parent / "fixtures" / "redis_layout2.json").read_text())
#: The fixture's namespaces and the tag its ids carry in each.
SPACES = {"": "default", "proj_x": "x"}

Restored = Callable[..., Awaitable[RedisStore]]


async def _restore(prefix: str) -> None:
    """Write the fixture's keys under ``prefix``, as the layout 2 code left them."""
    client = redis_asyncio.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        async with client.pipeline(transaction=True) as pipe:
            for name, entry in FIXTURE["keys"].items():
                key, kind, value = prefix + name, entry["type"], entry["value"]
                if kind == "string":
                    pipe.set(key, value)
                elif kind == "hash":
                    pipe.hset(key, mapping=value)
                elif kind == "list":
                    pipe.rpush(key, *value)
                elif kind == "set":
                    pipe.sadd(key, *value)
                else:
                    assert kind == "zset", kind
                    pipe.zadd(key, dict(value))
            await pipe.execute()
    except OSError as exc:
        require_service("redis", str(exc))
    finally:
        await client.aclose()


async def _dump(prefix: str) -> dict[str, Any]:
    """Every key under ``prefix`` (without it) with its type and value."""
    client = redis_asyncio.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        out: dict[str, Any] = {}
        async for key in client.scan_iter(match=f"{prefix}*", count=1000):
            kind = await client.type(key)
            value: Any
            if kind == "string":
                value = await client.get(key)
            elif kind == "hash":
                value = await client.hgetall(key)
            elif kind == "list":
                value = await client.lrange(key, 0, -1)
            elif kind == "set":
                value = sorted(await client.smembers(key))
            else:
                value = await client.zrange(key, 0, -1, withscores=True)
            out[key[len(prefix) :]] = (kind, value)
        return out
    finally:
        await client.aclose()


@pytest.fixture
async def restored() -> AsyncIterator[tuple[str, Restored]]:
    """A fresh prefix holding the fixture, and a factory of stores on it (not yet opened)."""
    prefix = f"agentfn-test:{uuid.uuid4().hex}:"
    await _restore(prefix)
    made: list[RedisStore] = []

    async def make(namespace: str = "", clock: FakeClock | None = None) -> RedisStore:
        clock = clock or FakeClock(FIXTURE["clock_after"])
        store = RedisStore(REDIS_URL, key_prefix=prefix, namespace=namespace, clock=clock)
        made.append(store)
        return store

    try:
        yield prefix, make
    finally:
        for store in made:
            await store.close()
        cleaner = RedisStore(REDIS_URL, key_prefix=prefix)
        try:
            await cleaner.destroy()
        except StoreUnavailableError:
            pass
        finally:
            await cleaner.close()


def _result(text: str) -> SavedResult:
    return SavedResult(success=True, event_json=f'{{"output":"{text}"}}', idempotency_key="op")


def test_the_fixture_is_layout_2_made_by_the_earlier_code() -> None:
    """The fixture says which code made it, and holds layout 2's keys outside namespaces."""
    assert FIXTURE["layout"] == 2
    assert FIXTURE["commit"] in FIXTURE["made_by"]
    assert FIXTURE["keys"]["layout"] == {"type": "string", "value": "2"}
    kinds = {name.split(":")[0] for name in FIXTURE["keys"]}
    assert kinds == {"layout", "c", "h", "d", "s", "k", "n"}


@pytest.mark.parametrize("namespace", list(SPACES))
async def test_work_in_flight_survives_the_upgrade_in_its_namespace(
    restored: tuple[str, Restored], namespace: str
) -> None:
    """Opened by today's store, layout 2 data is layout 3, and each namespace finds its own
    work where it left it: the owed results are due for the sweep, the quarantined call is
    listed and can be settled, the in-doubt claim is found, the unresolved delivery is due;
    nothing of the other namespace is seen."""
    prefix, make = restored
    tag = SPACES[namespace]
    clock = FakeClock(FIXTURE["clock_after"] + 100)
    store = await make(namespace, clock)
    await store.open()
    dumped = await _dump(prefix)
    assert dumped["layout"] == ("string", str(_redis_scripts.LAYOUT_VERSION))
    assert all(name == "layout" or name.startswith("n:") for name in dumped)

    owed = CallKey(f"sess_{tag}", "turn_1", f"call_owed_{tag}")
    long = CallKey(f"sess_{tag}", "turn_1", f"call_long_{tag}")
    odd = CallKey(f"sess\0{tag}", "turn\0", f"call\0\1_{tag}")
    held = CallKey("sess_shared", f"turn_{tag}", "call_shared")
    doubt = CallKey(f"sess_{tag}", "turn_2", f"call_doubt_{tag}")
    done = CallKey(f"sess_{tag}", "turn_0", "call_shared")

    due = await store.unsubmitted_results(due_before=clock.now)
    assert {r.key for r in due} == {owed, long, odd}
    [owed_record] = [r for r in due if r.key == owed]
    assert owed_record.result is not None and f"owed_{tag}" in owed_record.result.event_json
    assert (owed_record.state, owed_record.failures) == (CallState.SUCCEEDED, 1)
    await store.mark_submitted(owed, detail="200")
    assert (await store.get_call(owed)).state is CallState.SUBMITTED  # type: ignore[union-attr]

    [quarantined] = await store.list_calls(CallQuery(state="quarantined"))
    assert (quarantined.key, quarantined.quarantine_reason) == (held, "reconcile: unknown")
    settled = await store.settle(held, result=_result("by operator"))
    assert settled is not None and settled.state is CallState.SUCCEEDED
    assert held in {r.key for r in await store.unsubmitted_results(due_before=clock.now)}

    assert [r.key for r in await store.expired_claims()] == [doubt]
    outcome = await store.claim_call(doubt, tool_name="refund", owner="new", lease_seconds=30)
    assert (outcome.status, outcome.record.attempt) == (ClaimStatus.IN_DOUBT, 2)

    [delivery] = await store.unresolved_deliveries(due_before=clock.now)
    assert (delivery.delivery_id, delivery.attempts, delivery.last_error) == (
        f"msg_unresolved_{tag}",
        1,
        "503 upstream",
    )
    assert await store.record_delivery(f"msg_unresolved_{tag}", "x", nonce="n1") is True
    assert await store.record_delivery(f"msg_done_{tag}", "x") is False
    await store.mark_delivery_resolved(delivery.delivery_id)
    assert await store.unresolved_deliveries(due_before=clock.now) == []

    # The layout 2 history of 62 events is bounded like every layout 3 history.
    record = await store.get_call(long, history=True)
    assert record is not None
    assert len(record.history) == HISTORY_HEAD + HISTORY_TAIL
    assert record.history_dropped == 62 - HISTORY_HEAD - HISTORY_TAIL
    assert [e.kind for e in record.history[:3]] == ["claimed", "saved", "submit_failed"]
    assert [e.detail for e in record.history[2:4]] == ["429 #0", "429 #1"]
    assert record.history[-1].detail == "429 #59"

    # The session and call-id sets are the namespace's own.
    assert {r.key for r in await store.calls_for_session("sess_shared")} == {held}
    assert {r.key for r in await store.find_calls("call_shared")} == {held, done}
    assert {r.key for r in await store.calls_for_session(f"sess\0{tag}")} == {odd}
    others = {t for t in SPACES.values() if t != tag}
    listed = await store.list_calls(CallQuery(limit=100))
    assert len(listed) == 6
    assert not any(other in str(r.key) for r in listed for other in others)
    stats = await store.stats()
    assert stats.deliveries == 2
    assert stats.calls_by_state["submitted"] == 2


async def _upgraded_alone() -> dict[str, Any]:
    """What one store's upgrade of the fixture leaves (the dump), on a prefix of its own."""
    prefix = f"agentfn-test:{uuid.uuid4().hex}:"
    await _restore(prefix)
    store = RedisStore(REDIS_URL, key_prefix=prefix)
    try:
        await store.open()
        return await _dump(prefix)
    finally:
        await store.destroy()
        await store.close()


async def test_two_replicas_upgrading_at_once_give_the_same_data_as_one(
    restored: tuple[str, Restored],
) -> None:
    """Two stores opening the layout 2 data concurrently, and a third afterwards, leave
    exactly the keys and values one store's upgrade leaves; a pass run again on upgraded
    data (a replica that read the old marker just before) changes nothing."""
    prefix, make = restored
    expected = await _upgraded_alone()
    stores = [await make(namespace) for namespace in ("", "proj_x", "proj_y")]
    await asyncio.gather(*(store.open() for store in stores[:2]))
    await stores[2].open()
    assert await _dump(prefix) == expected

    late = await make("proj_x")
    client = late._redis()
    assert await late._migrate(client) == str(_redis_scripts.LAYOUT_VERSION)
    assert await _dump(prefix) == expected


@pytest.mark.parametrize("indexes_first", [True, False], ids=["in_order", "records_first"])
async def test_an_interrupted_upgrade_is_finished_by_the_next_open(
    restored: tuple[str, Restored], indexes_first: bool
) -> None:
    """A replica that stopped part way (its namespaces' indexes moved, or not yet, and half
    the calls and deliveries moved; the marker still 2) leaves data the next open upgrades
    into exactly what one whole upgrade gives."""
    prefix, make = restored
    expected = await _upgraded_alone()
    client = redis_asyncio.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        if indexes_first:
            spaces = {
                k[len(prefix) + 2 : len(prefix) + 42] for k in await client.keys(f"{prefix}n:*")
            }
            await client.eval(_redis_scripts.MIGRATE_INDEXES, 0, prefix, *sorted(spaces))
        for kind, script in (("c", "MIGRATE_CALLS"), ("d", "MIGRATE_DELIVERIES")):
            hashed = sorted(k[len(prefix) + 2 :] for k in await client.keys(f"{prefix}{kind}:*"))
            half = hashed[: len(hashed) // 2]
            source = getattr(_redis_scripts, script)
            assert await client.eval(source, 0, prefix, *half) == len(half)
            assert await client.eval(source, 0, prefix, *half) == 0
        assert await client.get(f"{prefix}layout") == "2"
    finally:
        await client.aclose()
    store = await make("proj_x")
    await store.open()
    assert await _dump(prefix) == expected
    assert len(await store.list_calls(CallQuery(limit=100))) == 6
    assert len(await (await make("")).list_calls(CallQuery(limit=100))) == 6


async def test_a_replica_of_the_earlier_release_still_running_fails_after_the_upgrade(
    restored: tuple[str, Restored],
) -> None:
    """The layout 2 release's own scripts (kept in the fixture), run as a replica of it that
    was not stopped would run them after the upgrade: recording a delivery, claiming a call
    and reading the sweep's due deliveries all fail (WRONGTYPE on the layout-2 index keys,
    which now hold a string saying why) instead of writing and reading keys no replica of
    this release looks at; a save of a call it held finds no record (the old release then
    raises "never claimed"). The upgraded data is unchanged by all of it."""
    prefix, make = restored
    store = await make("proj_x")
    await store.open()
    dumped = await _dump(prefix)
    old_indexes = [
        name
        for name, entry in FIXTURE["keys"].items()
        if name.startswith("n:") and entry["type"] == "zset"
    ]
    assert old_indexes
    assert {dumped[name] for name in old_indexes} == {("string", _redis_scripts.STOPPED)}
    space = store._space
    old = FIXTURE["scripts"]
    now = str(FIXTURE["clock_after"] + 1)
    client = redis_asyncio.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        with pytest.raises(redis_asyncio.ResponseError, match="WRONGTYPE"):
            await client.eval(
                old["record_delivery"], 1, f"{prefix}d:{h('msg_new')}",
                prefix, now, "msg_new", "sess_x", "proj_x", "",
            )  # fmt: skip
        member = "sess_x\0\0turn_9\0\0call_new"
        with pytest.raises(redis_asyncio.ResponseError, match="WRONGTYPE"):
            await client.eval(
                old["claim"], 1, f"{prefix}c:{h(member)}",
                prefix, now, member, "proj_x", "old-replica", str(float(now) + 30), now,
                "lookup", "sess_x", "turn_9", "call_new", "",
            )  # fmt: skip
        with pytest.raises(redis_asyncio.ResponseError, match="WRONGTYPE"):
            await client.eval(
                old["due_deliveries"], 1, f"{space}deliveries_due", prefix, now, "10", "", ""
            )
        doubt = "sess_x\0\0turn_2\0\0call_doubt_x"
        saved = await client.eval(
            old["save"], 1, f"{prefix}c:{h(doubt)}",
            prefix, now, doubt, "replica-c", "1", "succeeded", "", "success", "1",
        )  # fmt: skip
        assert saved is None
    finally:
        await client.aclose()
    after = await _dump(prefix)
    # The failed steps of the old release wrote only their own (layout 2) record hashes
    # before failing; nothing of layout 3 changed.
    assert {k: v for k, v in after.items() if k.startswith("n:")} == {
        k: v for k, v in dumped.items() if k.startswith("n:")
    }
    [record] = await store.expired_claims()
    assert (record.key.call_id, record.state) == ("call_doubt_x", CallState.CLAIMED)
