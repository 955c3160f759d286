"""The store contract, part two: several instances sharing one backend, like replicas.

Every backend must pass every test here; ``store_factory`` makes each new instance on the
same file, key prefix or schema (``memory`` shares its single instance).
"""

from __future__ import annotations

import asyncio

import pytest

from agentfn_asgi.calls.records import CallState, ClaimOutcome, ClaimStatus, SavedResult
from agentfn_asgi.store import Store
from tests.store.conftest import KEY, LEASE, StoreFactory, claim, result
from tests.support.clock import FakeClock

pytestmark = pytest.mark.anyio


async def _race_claims(stores: list[Store], count: int) -> list[ClaimOutcome]:
    """``count`` simultaneous claims of KEY by distinct owners, alternating over ``stores``."""
    return await asyncio.gather(
        *(
            stores[i % len(stores)].claim_call(
                KEY, tool_name="t", owner=f"o{i}", lease_seconds=LEASE
            )
            for i in range(count)
        )
    )


async def test_instances_share_one_backend(store_factory: StoreFactory) -> None:
    """A second instance sees the first one's deliveries and claims, like another replica."""
    first, second = await store_factory(), await store_factory()
    assert await first.record_delivery("msg_1", "s") is True
    assert await second.record_delivery("msg_1", "s") is False
    claimed = await first.claim_call(KEY, tool_name="t", owner="a", lease_seconds=LEASE)
    assert claimed.status is ClaimStatus.CLAIMED
    busy = await second.claim_call(KEY, tool_name="t", owner="b", lease_seconds=LEASE)
    assert busy.status is ClaimStatus.BUSY
    assert busy.record.owner == "a"


async def test_data_survives_close_and_a_new_instance(store_factory: StoreFactory) -> None:
    """Deliveries, claims and saved results are still there after close, for a new instance."""
    first = await store_factory(opened=False)
    await first.record_delivery("msg_1", "sess_1")  # first use opens implicitly
    await first.claim_call(KEY, tool_name="t", owner="a", lease_seconds=LEASE)
    saved = SavedResult(success=True, event_json='{"x":"☃"}', idempotency_key="k")
    await first.save_result(KEY, owner="a", attempt=1, result=saved)
    await first.close()

    second = await store_factory()
    assert await second.record_delivery("msg_1", "sess_1") is False
    record = await second.get_call(KEY)
    assert record is not None
    assert record.state is CallState.SUCCEEDED
    assert record.result == saved


async def test_concurrent_claims_have_one_winner(store_factory: StoreFactory) -> None:
    """50 simultaneous claims of one call, over two store instances: exactly one CLAIMED."""
    stores = [await store_factory(), await store_factory()]
    outcomes = await _race_claims(stores, 50)
    statuses = [o.status for o in outcomes]
    assert statuses.count(ClaimStatus.CLAIMED) == 1
    assert statuses.count(ClaimStatus.BUSY) == 49
    winner = next(o.record.owner for o in outcomes if o.status is ClaimStatus.CLAIMED)
    record = await stores[1].get_call(KEY)
    assert record is not None
    assert record.owner == winner


async def test_concurrent_takeovers_have_one_winner(
    store_factory: StoreFactory, clock: FakeClock
) -> None:
    """50 simultaneous claims of one expired call: exactly one takes it over (IN_DOUBT)."""
    stores = [await store_factory(), await store_factory()]
    await claim(stores[0], "first")
    clock.advance(LEASE + 1)
    outcomes = await _race_claims(stores, 50)
    statuses = [o.status for o in outcomes]
    assert statuses.count(ClaimStatus.IN_DOUBT) == 1
    assert statuses.count(ClaimStatus.BUSY) == 49
    record = await stores[1].get_call(KEY)
    assert record is not None
    assert record.attempt == 2


async def test_concurrent_saves_have_one_winner(store_factory: StoreFactory) -> None:
    """20 simultaneous saves by the holder, through two instances: every caller gets the
    same, first, result back; saves by anyone else change nothing."""
    stores = [await store_factory(), await store_factory()]
    await claim(stores[0], "a")
    records = await asyncio.gather(
        *(
            stores[i % 2].save_result(
                KEY,
                owner="a" if i % 3 else f"o{i}",
                attempt=1,
                result=result(f"r{i}", key=f"k{i}"),
            )
            for i in range(20)
        )
    )
    saved = {r.result for r in records if r.result is not None}
    assert len(saved) == 1
    assert await stores[1].get_call(KEY) == next(r for r in records if r.result is not None)


async def test_concurrent_record_delivery_has_one_winner(store_factory: StoreFactory) -> None:
    """200 simultaneous records of one delivery id, over two instances: exactly one True."""
    stores = [await store_factory(), await store_factory()]
    answers = await asyncio.gather(
        *(stores[i % 2].record_delivery("msg_same", "sess_1") for i in range(200))
    )
    assert answers.count(True) == 1
    assert len(await stores[0].unresolved_deliveries(due_before=float("inf"))) == 1
