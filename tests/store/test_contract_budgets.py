"""Call budgets on every store (``count_call``): a session's calls of a tool counted once
each, up to the budget, atomically across replicas; a retried step, a retry, a takeover or
a re-run never counts a call again; pruned calls stop counting."""

from __future__ import annotations

import asyncio

import pytest

from agentfn_asgi.calls.records import CallKey, CallState, ClaimStatus
from agentfn_asgi.store import Store
from tests.store.conftest import LEASE, StoreFactory, result
from tests.support.clock import FakeClock

pytestmark = pytest.mark.anyio


def key(n: int, session: str = "sess_1") -> CallKey:
    return CallKey(session, "turn_1", f"call_{n}")


async def claimed(store: Store, call: CallKey, tool: str = "lookup", owner: str = "a") -> None:
    outcome = await store.claim_call(call, tool_name=tool, owner=owner, lease_seconds=LEASE)
    assert outcome.status is ClaimStatus.CLAIMED


async def count(store: Store, call: CallKey, owner: str = "a", attempt: int = 1) -> int | None:
    record = await store.count_call(call, owner=owner, attempt=attempt, budget=3)
    assert record is not None
    return record.counted


async def test_a_sessions_calls_of_a_tool_are_counted_up_to_the_budget(store: Store) -> None:
    """Three calls counted, in their order, with an event saying their place; the fourth
    is refused and left as it was; another tool's and another session's have their own."""
    for n in range(1, 5):
        await claimed(store, key(n))
    assert [await count(store, key(n)) for n in range(1, 5)] == [1, 2, 3, None]
    second = await store.get_call(key(2), history=True)
    assert second is not None and second.state is CallState.CLAIMED
    assert [(e.kind, e.detail) for e in second.history] == [("claimed", ""), ("counted", "2 of 3")]
    fourth = await store.get_call(key(4), history=True)
    assert fourth is not None and [e.kind for e in fourth.history] == ["claimed"]
    await claimed(store, key(5), tool="refund")
    await claimed(store, key(6, session="sess_2"))
    assert await count(store, key(5)) == 1
    assert await count(store, key(6, session="sess_2")) == 1


async def test_a_counted_call_is_never_counted_again(store: Store, clock: FakeClock) -> None:
    """A retried step, and the takeover of a counted call, find it counted: same place, no
    event, and the budget's other calls still fit."""
    await claimed(store, key(1))
    assert await count(store, key(1)) == 1
    assert await count(store, key(1)) == 1  # its answer lost, sent again
    clock.advance(LEASE + 1)
    taken = await store.claim_call(key(1), tool_name="lookup", owner="b", lease_seconds=LEASE)
    assert taken.status is ClaimStatus.IN_DOUBT and taken.record.counted == 1
    assert await count(store, key(1), owner="b", attempt=2) == 1
    record = await store.get_call(key(1), history=True)
    assert record is not None
    assert [e.kind for e in record.history].count("counted") == 1
    for n in (2, 3):
        await claimed(store, key(n))
        assert await count(store, key(n)) == n


async def test_only_the_holder_counts_its_call(store: Store) -> None:
    """Another owner, a superseded attempt, a call not claimed (saved): nothing counted;
    an unknown call answers None."""
    await claimed(store, key(1))
    assert await count(store, key(1), owner="b") is None
    assert await count(store, key(1), attempt=2) is None
    await store.save_result(key(1), owner="a", attempt=1, result=result())
    assert await count(store, key(1)) is None
    assert await store.count_call(key(9), owner="a", attempt=1, budget=3) is None


async def test_replicas_counting_at_once_count_exactly_the_budget(
    store_factory: StoreFactory,
) -> None:
    """Eight calls of one session counted at once through three store instances (three
    replicas): exactly three counted, places 1, 2 and 3."""
    stores = [await store_factory() for _ in range(3)]
    for n in range(8):
        await claimed(stores[n % 3], key(n), owner=f"r{n % 3}")
    found = await asyncio.gather(
        *(
            stores[n % 3].count_call(key(n), owner=f"r{n % 3}", attempt=1, budget=3)
            for n in range(8)
        )
    )
    places = sorted(r.counted for r in found if r is not None and r.counted is not None)
    assert places == [1, 2, 3]


async def test_counted_calls_keep_counting_until_pruned(store: Store, clock: FakeClock) -> None:
    """A counted call that finished still counts; once pruned, its place is free again."""
    for n in range(1, 4):
        await claimed(store, key(n))
        await count(store, key(n))
        await store.save_result(key(n), owner="a", attempt=1, result=result())
        await store.mark_submitted(key(n))
    await claimed(store, key(4))
    assert await count(store, key(4)) is None
    clock.advance(10)
    await store.prune(deliveries_before=clock.now, calls_before=clock.now)
    assert await count(store, key(4)) == 1
