"""Redis-specific behaviour of :class:`RedisStore` (the shared contract is test_contract.py).

Needs Redis on 127.0.0.1:6379; skipped when it is unreachable, failed instead under CI=true.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from agentfn_asgi.errors import ConfigurationError, StoreUnavailableError
from agentfn_asgi.records import CallKey, CallState, ClaimStatus, SavedResult

from .conftest import FakeClock as Clock
from .conftest import require_service

pytestmark = [pytest.mark.anyio, pytest.mark.backends]

redis_asyncio = pytest.importorskip("redis.asyncio")
from agentfn_asgi.store.redis import RedisStore  # noqa: E402 - after the driver check

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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_dedup_window_is_the_key_expiry(make_store: StoreMaker) -> None:
    """A delivery id is refused inside the dedup window and accepted again once it expired."""
    store = await make_store(clock=Clock(), dedup_window=0.3)
    assert await store.record_delivery("msg_1", "sess_1") is True
    assert await store.record_delivery("msg_1", "sess_1") is False
    await asyncio.sleep(0.5)
    assert await store.record_delivery("msg_1", "sess_1") is True


async def test_prune_drops_index_entries_of_expired_keys(make_store: StoreMaker) -> None:
    """After Redis expired the keys, prune removes their index entries and stats agree."""
    clock = Clock()
    store = await make_store(clock=clock, dedup_window=0.2, call_retention=0.2)
    key = CallKey("sess", "turn", "call")
    await store.record_delivery("msg_1", "sess")
    await store.claim_call(key, tool_name="t", owner="a", lease_seconds=30)
    await store.save_result(key, owner="a", attempt=1, result=_result())
    await store.mark_submitted(key)
    await asyncio.sleep(0.4)
    # Expired keys are already invisible to the readers...
    assert await store.get_call(key) is None
    assert await store.calls_for_session("sess") == []
    assert await store.unresolved_deliveries(due_before=clock.now) == []
    # ...and prune (with cut-offs older than everything) removes what the indexes still hold.
    assert await store.prune(deliveries_before=0.0, calls_before=0.0) == 0
    stats = await store.stats()
    assert stats.deliveries == 0
    assert stats.calls_by_state[CallState.SUBMITTED] == 0
    assert await _keys(f"{store._prefix}*") == []


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


async def test_terminal_calls_expire_after_call_retention(make_store: StoreMaker) -> None:
    """A submitted call's hash expires after call_retention; non-terminal calls never do."""
    store = await make_store(clock=Clock(), call_retention=0.2)
    done, pending = CallKey("s", "t", "done"), CallKey("s", "t", "pending")
    for key in (done, pending):
        await store.claim_call(key, tool_name="t", owner="o", lease_seconds=10)
        await store.save_result(key, owner="o", attempt=1, result=_result())
    await store.mark_submitted(done)
    await asyncio.sleep(0.4)
    assert await store.get_call(done) is None
    assert [r.key for r in await store.calls_for_session("s")] == [pending]
    assert [r.key for r in await store.unsubmitted_results(due_before=2e9)] == [pending]


async def test_unreachable_redis_raises_unavailable_quickly() -> None:
    """A closed port gives StoreUnavailableError within about a second, for open and for use."""
    store = RedisStore(f"redis://127.0.0.1:{_free_port()}/0", key_prefix="x:", socket_timeout=1.0)
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


async def test_prune_keeps_a_call_recreated_after_its_terminal_record_expired(
    make_store: StoreMaker,
) -> None:
    """An old index entry of an expired terminal call never deletes a new call with that key."""
    clock = Clock()
    store = await make_store(clock=clock, call_retention=0.2)
    key = CallKey("s", "t", "c")
    await store.claim_call(key, tool_name="t", owner="o", lease_seconds=10)
    await store.mark_stale(key)
    await asyncio.sleep(0.4)
    again = await store.claim_call(key, tool_name="t", owner="o", lease_seconds=10)
    assert again.status is ClaimStatus.CLAIMED
    assert await store.prune(deliveries_before=0.0, calls_before=clock.now + 3600) == 0
    record = await store.get_call(key)
    assert record is not None
    assert record.state is CallState.CLAIMED
    assert [r.key for r in await store.calls_for_session("s")] == [key]
    assert (await store.stats()).calls_by_state[CallState.STALE] == 0
