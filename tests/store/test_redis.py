"""Redis-specific behaviour of :class:`RedisStore` (the shared contract is test_contract.py).

Needs Redis on 127.0.0.1:6379; skipped when it is unreachable, failed instead under CI=true.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from agentfn_asgi.calls.records import (
    CallEvent,
    CallKey,
    CallQuery,
    CallState,
    ClaimStatus,
    Limit,
    SavedResult,
    parse_history,
)
from agentfn_asgi.calls.states import HISTORY_HEAD, HISTORY_TAIL
from agentfn_asgi.errors import (
    ConfigurationError,
    StoreError,
    StoreRefusedError,
    StoreUnavailableError,
)

from ..support.clock import FakeClock as Clock
from ..support.ports import free_port
from .conftest import require_service

pytestmark = [pytest.mark.anyio, pytest.mark.backends]

redis_asyncio = pytest.importorskip("redis.asyncio")
from agentfn_asgi.store.redis import store as redis_store  # noqa: E402 - after the driver check
from agentfn_asgi.store.redis.store import RedisStore  # noqa: E402

REDIS_URL = "redis://127.0.0.1:6379/0"
StoreMaker = Callable[..., Any]


@pytest.fixture
async def make_store() -> AsyncIterator[StoreMaker]:
    """Factory of opened RedisStores on one unique prefix; closes them and deletes the keys."""
    prefix = f"agentfn-test:{uuid.uuid4().hex}:"
    made: list[RedisStore] = []

    async def make(url: str = REDIS_URL, **options: Any) -> RedisStore:
        options.setdefault("key_prefix", prefix)
        store = RedisStore(url, **options)
        made.append(store)
        try:
            await store.open()
        except StoreUnavailableError as exc:
            require_service("redis", str(exc))
        return store

    try:
        yield make
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


async def _keys(pattern: str) -> list[str]:
    client = redis_asyncio.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        return [key async for key in client.scan_iter(match=pattern, count=1000)]
    finally:
        await client.aclose()


def _result(text: str = "ok") -> SavedResult:
    return SavedResult(success=True, event_json=f'{{"output":"{text}"}}', idempotency_key="ik")


async def test_keys_stay_under_the_prefix_and_destroy_removes_only_them(
    make_store: StoreMaker,
) -> None:
    """Two prefixes never see each other's data; destroy() empties one prefix only."""
    other_prefix = f"agentfn-test:{uuid.uuid4().hex}:"
    mine = await make_store(clock=Clock())
    other = await make_store(clock=Clock(), key_prefix=other_prefix)
    key = CallKey("sess", "turn", "call")
    for store in (mine, other):
        assert await store.record_delivery("msg_1", "sess") is True
        assert (await store.claim_call(key, tool_name="t", owner="a", lease_seconds=30)).status is (
            ClaimStatus.CLAIMED
        )
    mine_keys = await _keys(f"{mine._prefix}*")
    assert mine_keys
    assert all(k.startswith(mine._prefix) for k in mine_keys)
    await other.destroy()
    assert await _keys(f"{other_prefix}*") == []
    assert await mine.get_call(key) is not None


async def _snapshot(prefix: str) -> dict[str, bytes]:
    """Every key under ``prefix`` and its DUMP (type, value and encoding; no TTL)."""
    client = redis_asyncio.Redis.from_url(REDIS_URL)
    try:
        keys = [key async for key in client.scan_iter(match=f"{prefix}*", count=1000)]
        return {key.decode(): await client.dump(key) for key in keys}
    finally:
        await client.aclose()


async def test_every_key_of_a_namespace_lives_under_its_prefix(make_store: StoreMaker) -> None:
    """Records, histories, sets and indexes (``i:``) of a namespace all live under
    ``{p}n:{h(namespace)}:``; only the layout marker is outside."""
    clock = Clock()
    one = await make_store(clock=clock, namespace="proj_1")
    two = await make_store(clock=clock, namespace="proj_2")
    await one.record_delivery("msg_1", "s1")
    await one.claim_call(CallKey("s1", "t", "c"), tool_name="t", owner="a", lease_seconds=30)
    await two.claim_call(CallKey("s2", "t", "c"), tool_name="t", owner="b", lease_seconds=30)
    prefix = one._prefix
    one_space, two_space = one._space, two._space
    assert one_space != two_space
    keys = set(await _keys(f"{prefix}*"))
    assert keys - {f"{prefix}layout"} == {k for k in keys if k.startswith((one_space, two_space))}

    def kinds(space: str) -> set[str]:
        found = {k.removeprefix(space) for k in keys if k.startswith(space)}
        return {k if k.startswith("i:") else k[:2] for k in found}

    assert kinds(one_space) == {
        "d:",
        "c:",
        "h:",
        "s:",
        "k:",
        "i:deliveries",
        "i:unresolved",
        "i:deliveries_due",
        "i:calls",
        "i:state:claimed",
        "i:lease",
    }
    assert kinds(two_space) == {"c:", "h:", "s:", "k:", "i:calls", "i:state:claimed", "i:lease"}


async def test_nothing_done_in_one_namespace_touches_another_s_keys(
    make_store: StoreMaker,
) -> None:
    """Every operation of a store of namespace B, on the very ids namespace A has (a claim,
    a saved result, a quarantined call, deliveries), leaves every key of A byte for byte as
    it was, and writes only under B's prefix: the scripts can reach no other namespace."""
    clock = Clock()
    a = await make_store(clock=clock, namespace="proj_a")
    b = await make_store(clock=clock, namespace="proj_b")
    claimed, saved, held = (CallKey("s", "t", f"c{n}") for n in range(3))
    await a.record_delivery("d1", "s", nonce="n")
    await a.record_delivery("d2", "s")
    await a.mark_delivery_resolved("d2")
    for key in (claimed, saved, held):
        await a.claim_call(key, tool_name="t", owner="o", lease_seconds=30)
    await a.save_result(saved, owner="o", attempt=1, result=_result())
    await a.quarantine(held, owner="o", attempt=1, reason="unknown")
    before = await _snapshot(a._space)
    assert len(before) > 15

    clock.advance(60)  # A's claim is in doubt: B must not take it over, settle or release it
    assert await b.record_delivery("d1", "s", nonce="n") is True
    await b.mark_delivery_resolved("d2")
    await b.delivery_failed("d1", error="x", retry_at=clock.now)
    await b.delivery_failed("d2", error="x", retry_at=clock.now)
    await b.mark_delivery_resolved("d1")
    assert await b.renew_lease(claimed, owner="o", attempt=1, lease_seconds=30) is False
    with pytest.raises(StoreError, match="never claimed"):
        await b.save_result(saved, owner="o", attempt=1, result=_result())
    await b.mark_submitted(saved)
    await b.submission_failed(saved, detail="503", retry_at=clock.now)
    await b.mark_stale(claimed)
    await b.mark_stale(saved)
    await b.quarantine(claimed, owner="o", attempt=1, reason="no")
    assert await b.settle(held, result=_result()) is None
    assert await b.settle(claimed, result=_result()) is None
    assert await b.release(held, owner="op", lease_seconds=30) is None
    assert await b.release(claimed, owner="op", lease_seconds=30) is None
    for key in (claimed, saved, held):
        assert await b.get_call(key, history=True) is None
    assert await b.calls_for_session("s") == []
    assert await b.find_calls("c0") == []
    assert await b.expired_claims() == []
    assert await b.unsubmitted_results(due_before=clock.now + 1000) == []
    assert await b.list_calls(CallQuery()) == []
    assert [(d.delivery_id, d.resolved) for d in await b.list_deliveries()] == [("d1", True)]
    assert await b.unresolved_deliveries(due_before=clock.now + 1000) == []
    await b.prune(deliveries_before=clock.now + 1000, calls_before=clock.now + 1000)
    assert (await b.stats()).calls_by_state == {state.value: 0 for state in CallState}
    # B's own records of the same keys are new and independent.
    outcome = await b.claim_call(claimed, tool_name="t", owner="b", lease_seconds=30)
    assert (outcome.status, outcome.record.attempt) == (ClaimStatus.CLAIMED, 1)
    await b.save_result(claimed, owner="b", attempt=1, result=_result("b"))
    await b.mark_submitted(claimed)

    assert await _snapshot(a._space) == before
    outside = set(await _keys(f"{a._prefix}*")) - set(before) - {f"{a._prefix}layout"}
    assert outside
    assert all(k.startswith(b._space) for k in outside)
    assert (await a.get_call(claimed)) is not None
    assert [r.key for r in await a.expired_claims()] == [claimed]


async def test_a_limiter_lives_under_its_namespace_and_its_sets_follow_the_calls(
    make_store: StoreMaker,
) -> None:
    """A limiter (any name: a concurrency_key's value may hold any character) keeps its
    holders, its waiters and its bucket at ``{n}l:{h(name)}:``; a claim without a limit
    writes none of it. A holder that saved leaves the holders at once (a script that knows
    nothing of limiters: the reindex does it), so the sets last no longer than the calls."""
    clock = Clock()
    store: RedisStore = await make_store(clock=clock, namespace="proj")
    name = "report\x1fcustomer *?[1]"
    limit = Limit(name=name, concurrency=1, rate=100.0, burst=5)
    one, two, free = (CallKey("s", "t", f"c{n}") for n in range(3))

    async def claim(key: CallKey, limit: Limit | None) -> ClaimStatus:
        outcome = await store.claim_call(
            key, tool_name="t", owner="a", lease_seconds=30, limit=limit
        )
        return outcome.status

    assert await claim(free, None) is ClaimStatus.CLAIMED
    assert await _keys(f"{store._space}l:*") == []
    assert await claim(one, limit) is ClaimStatus.CLAIMED
    assert await claim(two, limit) is ClaimStatus.WAITING
    base = f"{store._space}l:{redis_store._h(name)}:"
    assert set(await _keys(f"{store._space}l:*")) == {
        base + "holders",
        base + "waiters",
        base + "bucket",
    }
    client = redis_asyncio.Redis.from_url(REDIS_URL, decode_responses=True)
    try:

        async def members(name: str) -> list[str]:
            return list(await client.zrange(base + name, 0, -1))

        assert await members("holders") == [redis_store._member(one)]
        assert await members("waiters") == [redis_store._member(two)]
        assert await client.hget(base + "bucket", "tokens") == "4"
        await store.save_result(one, owner="a", attempt=1, result=_result())
        assert await members("holders") == []
        admitted = await store.admit_call(two, owner="a", attempt=1, limit=limit, lease_seconds=30)
        assert admitted is not None and admitted.status is ClaimStatus.CLAIMED
        assert await members("holders") == [redis_store._member(two)]
        assert await members("waiters") == []
    finally:
        await client.aclose()


async def test_nothing_expires_by_ttl(make_store: StoreMaker) -> None:
    """Retention is prune(), never a TTL: no key of any step carries an expiry."""
    clock = Clock()
    store = await make_store(clock=clock)
    key = CallKey("s", "t", "c")
    await store.record_delivery("d", "s", nonce="n")
    await store.delivery_failed("d", error="boom", retry_at=clock.now + 5)
    await store.claim_call(key, tool_name="t", owner="a", lease_seconds=30)
    await store.save_result(key, owner="a", attempt=1, result=_result())
    await store.submission_failed(key, detail="503", retry_at=clock.now + 5)
    await store.mark_submitted(key)
    client = redis_asyncio.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        keys = await _keys(f"{store._prefix}*")
        assert len(keys) > 10
        assert [await client.ttl(k) for k in keys] == [-1] * len(keys)
    finally:
        await client.aclose()


async def test_prune_leaves_no_trace(make_store: StoreMaker) -> None:
    """Pruning every finished call and every delivery removes its hash, its history, its
    session and call-id set entries and every index entry: only the layout marker stays."""
    clock = Clock()
    store = await make_store(clock=clock)
    keys = [CallKey("s", "t", f"c{i}") for i in range(3)]
    for n, key in enumerate(keys):
        await store.record_delivery(f"d{n}", "s")
        await store.claim_call(key, tool_name="t", owner="a", lease_seconds=30)
        await store.save_result(key, owner="a", attempt=1, result=_result())
    await store.mark_submitted(keys[0])
    await store.mark_stale(keys[1])
    await store.mark_stale(keys[2])
    clock.advance(10)
    assert await store.prune(deliveries_before=clock.now, calls_before=clock.now) == 6
    assert await _keys(f"{store._prefix}*") == [f"{store._prefix}layout"]


async def test_history_is_a_list_of_call_events(make_store: StoreMaker) -> None:
    """A call's history is a Redis list of CallEvent JSON objects, one per step."""
    store = await make_store(clock=Clock())
    key = CallKey("s", "t", "c")
    await store.claim_call(key, tool_name="t", owner="o ☃", lease_seconds=30)
    await store.quarantine(key, owner="o ☃", attempt=1, reason='said "maybe" / ☃')
    [history_key] = await _keys(f"{store._space}h:*")
    client = redis_asyncio.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        raw = await client.lrange(history_key, 0, -1)
    finally:
        await client.aclose()
    events = [CallEvent.from_mapping(json.loads(item)) for item in raw]
    assert parse_history("\n".join(raw)) == tuple(events)
    assert [(e.kind, e.attempt, e.owner, e.detail) for e in events] == [
        ("claimed", 1, "o ☃", ""),
        ("quarantined", 1, "o ☃", 'said "maybe" / ☃'),
    ]


async def test_a_reason_lands_in_the_hash_field_0_1_0_reads(make_store: StoreMaker) -> None:
    """A quarantined or cancelled call's reason is the hash field ``quarantine_reason``, as
    0.1.0 wrote and reads it (a replica of it may share the store)."""
    store = await make_store(clock=Clock())
    key = CallKey("s", "t", "c")
    await store.claim_call(key, tool_name="t", owner="a", lease_seconds=30)
    await store.quarantine(key, owner="a", attempt=1, reason="reconcile said unknown")
    [call_key] = await _keys(f"{store._space}c:*")
    client = redis_asyncio.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        fields = await client.hgetall(call_key)
    finally:
        await client.aclose()
    assert fields["quarantine_reason"] == "reconcile said unknown" and "reason" not in fields
    record = await store.get_call(key)
    assert record is not None and record.reason == "reconcile said unknown"


async def test_a_long_history_keeps_its_first_and_last_events(make_store: StoreMaker) -> None:
    """2,000 refused submissions of one call: the history list stays at 50 entries (the
    first 10 events and the last 40) and the hash counts the 1,952 dropped; every read
    (get_call, find_calls) returns exactly those, in order. Regression: the list grew by
    one entry per refusal, without bound."""
    clock = Clock()
    store = await make_store(clock=clock)
    key = CallKey("s", "t", "c")
    await store.claim_call(key, tool_name="t", owner="o", lease_seconds=30)
    await store.save_result(key, owner="o", attempt=1, result=_result())
    for n in range(2000):
        clock.advance(1)
        await store.submission_failed(key, detail=f"429 #{n}", retry_at=clock.now + 1)
    expected = ["claimed", "saved"] + [f"429 #{n}" for n in range(8)]
    expected += [f"429 #{n}" for n in range(1960, 2000)]
    record = await store.get_call(key, history=True)
    assert record is not None
    assert [e.detail if e.kind == "submit_failed" else e.kind for e in record.history] == expected
    assert record.history_dropped == 2002 - HISTORY_HEAD - HISTORY_TAIL
    assert record.failures == 2000
    [found] = await store.find_calls("c")
    assert (found.history, found.history_dropped) == (record.history, record.history_dropped)
    plain = await store.get_call(key)  # without its history: none of it, like every store
    assert plain is not None and (plain.history, plain.history_dropped) == ((), 0)
    client = redis_asyncio.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        [history_key] = await _keys(f"{store._space}h:*")
        assert await client.llen(history_key) == HISTORY_HEAD + HISTORY_TAIL
    finally:
        await client.aclose()


async def test_cursors_order_ties_by_bytes_not_locale(make_store: StoreMaker) -> None:
    """Ties (one timestamp) are ordered like Python orders the ids (code points = UTF-8
    bytes), in every cursor: never by the Redis server's locale ("B" < "a" < "é")."""
    clock = Clock()
    store = await make_store(clock=clock)
    ids = ["a", "B", "é", "a\x00", "Z", "ab"]
    for delivery_id in ids:
        await store.record_delivery(delivery_id, "s")
    paged: list[str] = []
    after: tuple[float, str] | None = None
    while found := await store.unresolved_deliveries(due_before=clock.now, limit=1, after=after):
        paged.append(found[0].delivery_id)
        after = (found[0].next_attempt_at, found[0].delivery_id)
    assert paged == sorted(ids)
    keys = [CallKey("s", turn, "c") for turn in ids] + [CallKey("s\x00", "", "")]
    for key in keys:
        await store.claim_call(key, tool_name="t", owner="o", lease_seconds=30)
    listed: list[CallKey] = []
    before: tuple[float, str, str, str] | None = None
    while page := await store.list_calls(CallQuery(limit=2, before=before)):
        listed += [r.key for r in page]
        last = page[-1]
        before = (last.created_at, last.key.session_id, last.key.turn_id, last.key.call_id)
    assert listed == sorted(keys, key=lambda k: (k.session_id, k.turn_id, k.call_id))[::-1]


async def test_list_calls_walks_past_its_budget(
    make_store: StoreMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filter that matches little still finds every match: the listing continues where a
    script stopped after looking at its budget of index entries."""
    monkeypatch.setattr(redis_store, "_LIST_BUDGET", 2)
    clock = Clock()
    store = await make_store(clock=clock)
    for n in range(9):
        tool = "refund" if n in (0, 4, 5) else "lookup"
        await store.claim_call(
            CallKey("s", "t", f"c{n}"), tool_name=tool, owner="o", lease_seconds=30
        )
        clock.advance(n % 2)
    found = await store.list_calls(CallQuery(tool_name="refund"))
    assert [r.key.call_id for r in found] == ["c5", "c4", "c0"]
    assert [
        r.key.call_id for r in await store.list_calls(CallQuery(tool_name="refund", limit=2))
    ] == [
        "c5",
        "c4",
    ]


async def test_a_layout_unreadable_to_this_release_is_refused(make_store: StoreMaker) -> None:
    """A prefix a later release made unreadable to this one (a contract step) is refused
    with a StoreError naming both versions, at open and at a first step, and left as it is;
    a new prefix is marked with layout 1."""
    store = await make_store()
    client = redis_asyncio.Redis.from_url(REDIS_URL, decode_responses=True)
    marker = f"{store._prefix}layout"
    try:
        assert await client.hgetall(marker) == {"version": "1", "readable_from": "1"}
        await client.hset(marker, mapping={"version": 3, "readable_from": 2})
        later = RedisStore(REDIS_URL, key_prefix=store._prefix)
        try:
            with pytest.raises(StoreError, match="version 3, readable from version 2"):
                await later.open()
            with pytest.raises(StoreError, match="version 3, readable from version 2"):
                await later.record_delivery("d", "s")
        finally:
            await later.close()
        assert await client.hgetall(marker) == {"version": "3", "readable_from": "2"}
    finally:
        await client.aclose()


def test_location_hides_the_password() -> None:
    """location names the server, prefix and namespace, never the password."""
    store = RedisStore(
        "redis://user:s3cret@cache:6379/0?password=other", key_prefix="app:", namespace="p1"
    )
    assert store.location == (
        "redis://user:***@cache:6379/0?password=*** (key prefix app:, namespace p1)"
    )
    assert "s3cret" not in repr(store)
    assert RedisStore("redis://:pw@h/1").location == "redis://:***@h/1 (key prefix agentfn:)"


async def test_unreachable_redis_raises_unavailable_quickly() -> None:
    """A closed port gives StoreUnavailableError within about a second, for open and for use."""
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", key_prefix="x:", socket_timeout=1.0)
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError, match="unavailable"):
        await store.open()
    with pytest.raises(StoreUnavailableError):
        await store.record_delivery("m", "s")
    assert time.monotonic() - started < 3.0
    await store.close()


def test_bad_url_is_a_configuration_error() -> None:
    """A URL the driver cannot parse is reported as ConfigurationError on first use."""
    store = RedisStore("http://127.0.0.1:6379")
    with pytest.raises(ConfigurationError):
        store._redis()


async def test_speaks_resp2_whatever_the_drivers_default(make_store: StoreMaker) -> None:
    """The scripts' replies are read as RESP2 converts them (redis-py 8.2 defaults to RESP3,
    where a script's ``false`` arrives as a boolean instead of nil)."""
    store = await make_store(clock=Clock())
    await store.record_delivery("m", "s")
    info = await store._redis().client_info()
    assert str(info["resp"]) == "2"


async def test_recovers_after_its_connections_are_killed(make_store: StoreMaker) -> None:
    """CLIENT KILL of every connection of the store: the next call reconnects and succeeds."""
    name = f"agentfn-test-{uuid.uuid4().hex[:12]}"
    store = await make_store(f"{REDIS_URL}?client_name={name}", clock=Clock())
    await asyncio.gather(*(store.record_delivery(f"m{i}", "s") for i in range(10)))
    admin = redis_asyncio.Redis.from_url(REDIS_URL, decode_responses=True)
    try:
        # Kill by name, not TYPE normal: other test processes may share this Redis.
        ids = [c["id"] for c in await admin.client_list() if c.get("name") == name]
        assert ids
        for client_id in ids:
            await admin.execute_command("CLIENT", "KILL", "ID", client_id)
    finally:
        await admin.aclose()
    assert await store.record_delivery("after-kill", "s") is True
    await store.ping()


async def test_a_step_whose_layout_check_outlives_close_is_refused(
    make_store: StoreMaker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first step checks the key layout; the store closes while it does: the step is
    refused as after close(), not run on a pool that was just disconnected (which would
    reconnect, and leave that connection open)."""
    store = await make_store()
    await store.destroy()  # the next step checks the layout first
    checking, go_on = asyncio.Event(), asyncio.Event()
    check = store._check_layout

    async def slow_check(client: Any) -> None:  # an interleaving we cannot time: held here
        await check(client)
        checking.set()  # answered; the step goes on only after close()
        await go_on.wait()

    monkeypatch.setattr(store, "_check_layout", slow_check)
    step = asyncio.create_task(store.record_delivery("wh_1", "sess_1"))
    await checking.wait()
    await store.close()
    go_on.set()
    with pytest.raises(StoreUnavailableError, match="closed"):
        await step


async def test_a_redis_that_keeps_data_in_memory_only_is_warned_about(
    make_store: StoreMaker, caplog: pytest.LogCaptureFixture
) -> None:
    """``appendonly no``: a restart of Redis loses what was acknowledged, so open() says so
    once; where CONFIG is denied (managed Redis), open() goes on without a word."""
    admin = redis_asyncio.Redis.from_url(REDIS_URL, decode_responses=True)
    user = f"agentfn-test-{uuid.uuid4().hex[:8]}"
    try:
        in_memory = (await admin.config_get("appendonly"))["appendonly"] == "no"
        await admin.acl_setuser(
            user, enabled=True, passwords=["+pw"], keys=["*"], channels=["*"],
            commands=["+@all", "-config"],
        )  # fmt: skip
        with caplog.at_level(logging.WARNING, logger="agentfn_asgi.store.redis"):
            await make_store()
            warned = [r.getMessage() for r in caplog.records]
            caplog.clear()
            await make_store(f"redis://{user}:pw@127.0.0.1:6379/0")
            denied = [r.getMessage() for r in caplog.records]
    finally:
        await admin.acl_deluser(user)
        await admin.aclose()
    assert len(warned) == (1 if in_memory else 0), warned
    assert all("appendonly no" in w and "pw@" not in w for w in warned)
    assert denied == []


async def test_a_text_that_is_not_valid_unicode_is_a_store_error(make_store: StoreMaker) -> None:
    """A lone surrogate (a command-line argument of undecodable bytes) is refused with the
    package's StoreRefusedError, as the SQL stores refuse it, not redis-py's
    UnicodeEncodeError; the store goes on."""
    store = await make_store()
    with pytest.raises(StoreRefusedError, match="refused a value"):
        await store.record_delivery("d\ud800", "sess_1")
    assert await store.record_delivery("d1", "sess_1") is True
