"""Flow-control limits on every store: slots of a limiter shared by every replica, the line
of waiters served in arrival order, the rate's bucket, a dead holder's or waiter's place
given back when its lease lapses, and the in-doubt flag never lost to a wait."""

from __future__ import annotations

import asyncio

import pytest

from agentfn_asgi.calls.records import CallKey, CallState, ClaimOutcome, ClaimStatus, Limit
from agentfn_asgi.store import MemoryStore, Store
from agentfn_asgi.store.redis.store import RedisStore
from agentfn_asgi.store.redis.store import _h as redis_h
from agentfn_asgi.store.sql.store import SQLStore, Statement
from tests.store.conftest import LEASE, StoreFactory, result
from tests.support.clock import FakeClock

pytestmark = pytest.mark.anyio

TWO = Limit(name="report", concurrency=2)
RATED = Limit(name="pay", rate=5.0, burst=1)
MARGIN = 2.0


def key(n: int) -> CallKey:
    return CallKey("sess_1", "turn_1", f"call_{n}")


async def claim(store: Store, n: int, owner: str = "a", limit: Limit | None = TWO) -> ClaimOutcome:
    return await store.claim_call(
        key(n), tool_name="report", owner=owner, lease_seconds=LEASE, margin=MARGIN, limit=limit
    )


async def admit(store: Store, n: int, owner: str = "a", attempt: int = 1) -> ClaimOutcome | None:
    return await store.admit_call(
        key(n), owner=owner, attempt=attempt, limit=TWO, lease_seconds=LEASE, margin=MARGIN
    )


async def test_a_limiter_admits_its_concurrency_and_the_rest_wait(store: Store) -> None:
    """Two slots: the first two claims hold one each; the third waits, ours, nothing ran."""
    assert (await claim(store, 1)).status is ClaimStatus.CLAIMED
    assert (await claim(store, 2, owner="b")).status is ClaimStatus.CLAIMED
    third = await claim(store, 3)
    assert third.status is ClaimStatus.WAITING
    assert (third.record.state, third.record.owner, third.record.attempt) == (
        CallState.WAITING,
        "a",
        1,
    )
    assert third.record.limiter == "report"
    holder = await store.get_call(key(1))
    assert holder is not None and holder.limiter == "report"
    waiting = await store.get_call(key(3), history=True)
    assert waiting is not None
    assert [(e.kind, e.detail) for e in waiting.history] == [
        ("claimed", ""),
        ("waiting", "concurrency"),
    ]
    # Polling while the slots are held keeps it waiting; another owner cannot poll it.
    assert (await admit(store, 3)).status is ClaimStatus.WAITING  # type: ignore[union-attr]
    other = await admit(store, 3, owner="b")
    assert other is not None and other.status is ClaimStatus.BUSY
    # A claim by another replica is told busy; our own retried claim is told it waits.
    assert (await claim(store, 3, owner="b")).status is ClaimStatus.BUSY
    assert (await claim(store, 3)).status is ClaimStatus.WAITING


async def test_leaving_claimed_frees_the_slot_for_the_first_waiter(
    store: Store, clock: FakeClock
) -> None:
    """Saving a result frees a slot; the waiter that arrived first gets it, the second still
    waits even if it polls first; the admitted call is claimed, attempt 1, not in doubt."""
    await claim(store, 1)
    await claim(store, 2)
    await claim(store, 3)
    clock.advance(0.5)
    await claim(store, 4, owner="b")
    await store.save_result(key(1), owner="a", attempt=1, result=result())
    assert (await admit(store, 4, owner="b")).status is ClaimStatus.WAITING  # type: ignore[union-attr]
    admitted = await admit(store, 3)
    assert admitted is not None and admitted.status is ClaimStatus.CLAIMED
    assert (admitted.record.state, admitted.record.attempt) == (CallState.CLAIMED, 1)
    assert admitted.record.limiter == "report"
    # A retried admission of a call already holding its slot answers the same.
    again = await admit(store, 3)
    assert again is not None and again.status is ClaimStatus.CLAIMED
    # The slot is held again: the fourth still waits; a quarantine frees one for it.
    assert (await admit(store, 4, owner="b")).status is ClaimStatus.WAITING  # type: ignore[union-attr]
    await store.quarantine(key(2), owner="a", attempt=1, reason="test")
    assert (await admit(store, 4, owner="b")).status is ClaimStatus.CLAIMED  # type: ignore[union-attr]
    record = await store.get_call(key(3), history=True)
    assert record is not None
    assert [e.kind for e in record.history] == ["claimed", "waiting", "admitted"]


async def test_a_dead_holders_slot_is_free_once_its_lease_lapses_past_the_margin(
    store: Store, clock: FakeClock
) -> None:
    """The holder of a slot dies (no renewal): within lease + margin its slot is still
    held; after it, a waiter is admitted. The dead call, taken over later, is in doubt and
    taken over only with a slot (else it is left for the sweep: busy)."""
    await claim(store, 1)
    await claim(store, 2)
    await claim(store, 3, owner="b")
    clock.advance(LEASE + MARGIN - 0.5)
    assert (await admit(store, 3, owner="b")).status is ClaimStatus.WAITING  # type: ignore[union-attr]
    await store.renew_lease(key(2), owner="a", attempt=1, lease_seconds=LEASE)
    clock.advance(1.0)
    assert (await admit(store, 3, owner="b")).status is ClaimStatus.CLAIMED  # type: ignore[union-attr]
    # Call 1 is in doubt, but both slots are held: its take-over waits for the sweep.
    assert (await claim(store, 1, owner="c")).status is ClaimStatus.BUSY
    record = await store.get_call(key(1))
    assert record is not None and (record.state, record.owner) == (CallState.CLAIMED, "a")
    await store.save_result(key(2), owner="a", attempt=1, result=result())
    taken = await claim(store, 1, owner="c")
    assert taken.status is ClaimStatus.IN_DOUBT
    assert (taken.record.attempt, taken.record.limiter) == (2, "report")


async def test_a_dead_waiter_stops_holding_up_the_line_and_is_adopted(
    store: Store, clock: FakeClock
) -> None:
    """A waiter that stops polling loses its place once its lease lapses past the margin:
    a later waiter is served first; its call is adopted by the next claimant (the next
    attempt, not in doubt) and waits or runs as the limiter says."""
    await claim(store, 1)
    await claim(store, 2)
    await claim(store, 3)  # a's waiter, which dies
    clock.advance(1.0)
    await claim(store, 4, owner="b")
    await store.save_result(key(1), owner="a", attempt=1, result=result())
    assert (await admit(store, 4, owner="b")).status is ClaimStatus.WAITING  # type: ignore[union-attr]
    clock.advance(LEASE + MARGIN)
    await store.renew_lease(key(2), owner="a", attempt=1, lease_seconds=LEASE)
    assert (await admit(store, 4, owner="b")).status is ClaimStatus.CLAIMED  # type: ignore[union-attr]
    assert [r.key for r in await store.expired_claims(margin=MARGIN)] == [key(3)]
    adopted = await claim(store, 3, owner="c")
    assert adopted.status is ClaimStatus.WAITING
    assert (adopted.record.owner, adopted.record.attempt) == ("c", 2)
    stale = await admit(store, 3, owner="a", attempt=1)
    assert stale is not None and stale.status is ClaimStatus.BUSY
    await store.save_result(key(2), owner="a", attempt=1, result=result())
    late = await admit(store, 3, owner="c", attempt=2)
    assert late is not None and late.status is ClaimStatus.CLAIMED
    record = await store.get_call(key(3), history=True)
    assert record is not None
    assert [e.kind for e in record.history] == [
        "claimed",
        "waiting",
        "adopted",
        "waiting",
        "admitted",
    ]


async def test_a_rate_spends_one_token_per_admission_and_refills(
    store: Store, clock: FakeClock
) -> None:
    """5/s with a burst of 1: one call now, the next 0.2 s later, in arrival order."""
    first = await claim(store, 1, limit=RATED)
    assert first.status is ClaimStatus.CLAIMED
    second = await claim(store, 2, limit=RATED)
    assert second.status is ClaimStatus.WAITING
    detail = await store.get_call(key(2), history=True)
    assert detail is not None and detail.history[-1].detail == "rate"
    clock.advance(0.1)
    third = await claim(store, 3, owner="b", limit=RATED)
    assert third.status is ClaimStatus.WAITING
    clock.advance(0.11)  # (a little over: the clock's floats are near 1.7e9)
    assert (await poll(store, 3, "b", RATED)).status is ClaimStatus.WAITING  # 2 is first
    assert (await poll(store, 2, "a", RATED)).status is ClaimStatus.CLAIMED
    assert (await poll(store, 3, "b", RATED)).status is ClaimStatus.WAITING  # no token left
    clock.advance(0.19)
    assert (await poll(store, 3, "b", RATED)).status is ClaimStatus.WAITING
    clock.advance(0.02)
    assert (await poll(store, 3, "b", RATED)).status is ClaimStatus.CLAIMED


async def poll(store: Store, n: int, owner: str, limit: Limit) -> ClaimOutcome:
    outcome = await store.admit_call(
        key(n), owner=owner, attempt=1, limit=limit, lease_seconds=LEASE, margin=MARGIN
    )
    assert outcome is not None
    return outcome


async def test_limiters_are_separate_and_a_call_without_limit_ignores_them(
    store: Store,
) -> None:
    """Another limiter (another key of concurrency_key=) has its own slots; a claim with no
    limit is never made to wait."""
    await claim(store, 1)
    await claim(store, 2)
    other = Limit(name="report\x1fcustomer-2", concurrency=2)
    assert (await claim(store, 3, limit=other)).status is ClaimStatus.CLAIMED
    assert (await claim(store, 4, limit=None)).status is ClaimStatus.CLAIMED


async def test_the_holder_of_a_waiting_call_saves_a_failure_when_it_gives_up(
    store: Store,
) -> None:
    """Past max_wait, the waiter saves a failure (fenced like any save); it is then owed
    to the API as any result."""
    await claim(store, 1)
    await claim(store, 2)
    await claim(store, 3)
    refused = await store.save_result(key(3), owner="b", attempt=1, result=result("no"))
    assert refused.state is CallState.WAITING
    saved = await store.save_result(key(3), owner="a", attempt=1, result=result("busy"))
    assert saved.state is CallState.SUCCEEDED


async def test_a_claimed_call_without_a_slot_asks_for_one(store: Store) -> None:
    """A call claimed without a limit (approved, released) asks with admit_call: it takes a
    slot or waits."""
    await claim(store, 1)
    await claim(store, 2)
    await claim(store, 3, limit=None)
    assert (await admit(store, 3)).status is ClaimStatus.WAITING  # type: ignore[union-attr]
    assert (
        await store.admit_call(key(9), owner="a", attempt=1, limit=TWO, lease_seconds=LEASE) is None
    )


async def test_concurrent_claims_never_overfill_a_limiter(
    store_factory: StoreFactory,
) -> None:
    """Twenty claims from five replicas at once: exactly two hold a slot."""
    stores = [await store_factory() for _ in range(5)]
    outcomes = await asyncio.gather(
        *(claim(stores[n % 5], n, owner=f"r{n % 5}") for n in range(20))
    )
    statuses = [o.status for o in outcomes]
    assert statuses.count(ClaimStatus.CLAIMED) == 2
    assert statuses.count(ClaimStatus.WAITING) == 18
    # And the same when they all poll at once after both holders finish.
    holders = [o.record for o in outcomes if o.status is ClaimStatus.CLAIMED]
    for record in holders:
        n = int(record.key.call_id.split("_")[1])
        await stores[n % 5].save_result(record.key, owner=f"r{n % 5}", attempt=1, result=result())
    polled = await asyncio.gather(
        *(
            stores[n % 5].admit_call(
                key(n), owner=f"r{n % 5}", attempt=1, limit=TWO, lease_seconds=LEASE
            )
            for n in range(20)
            if outcomes[n].status is ClaimStatus.WAITING
        )
    )
    assert [o.status for o in polled if o is not None].count(ClaimStatus.CLAIMED) == 2


async def test_a_waiters_poll_does_not_hide_it_from_a_cancellation(
    store: Store, clock: FakeClock
) -> None:
    """A turn cancelled while its call waits: the dispatcher read the session, the waiter
    polled, then the dispatcher cancels what was claimed before its read: it is cancelled,
    leaves the line (the next waiter is admitted) and never runs."""
    await claim(store, 1)
    await claim(store, 2)
    await claim(store, 3)
    read_at = clock()
    clock.advance(0.5)
    assert (await admit(store, 3)).status is ClaimStatus.WAITING  # type: ignore[union-attr]
    await claim(store, 4)
    assert (await admit(store, 4)).status is ClaimStatus.WAITING  # type: ignore[union-attr]
    assert await store.cancel(key(3), owner="o", reason="turn cancelled", known_before=read_at)
    # Claimed after the read: the read may predate it, so it stays.
    assert not await store.cancel(key(4), owner="o", reason="x", known_before=read_at)
    record = await store.get_call(key(3))
    assert record is not None and record.state is CallState.CANCELLED
    assert record.reason == "turn cancelled"
    after = await admit(store, 3)
    assert after is not None and after.status is ClaimStatus.DONE


async def _limiters_with_state(store: Store) -> set[str]:
    """The limiters a store keeps flow-control state for, by name (Redis: by the hash its
    keys carry): buckets; the memory store's index and Redis' holders and waiters sets. A
    SQL store's holders and waiters are its calls' rows, pruned with them."""
    if isinstance(store, MemoryStore):
        data = store._data
        return {name for _, name in (*data.buckets, *data.limited)}
    if isinstance(store, RedisStore):
        space = store._space
        client = store._redis()
        keys = [key async for key in client.scan_iter(match=f"{space}l:*")]
        indexed = await client.zrange(f"{space}i:buckets", 0, -1)
        return {key.removeprefix(f"{space}l:").split(":")[0] for key in keys} | {
            redis_h(name) for name in indexed
        }
    assert isinstance(store, SQLStore)
    rows = await store._rows("test", Statement("SELECT limiter FROM {p}buckets", {}))
    return {str(row[0]) for row in rows}


async def test_prune_removes_the_flow_control_state_of_idle_limiters(
    store: Store, clock: FakeClock
) -> None:
    """Before: a bucket per rated limiter (one per ``concurrency_key`` value, which the
    model chooses) and, on Redis, holders and waiters sets per limiter, were kept for ever.
    Now: ``prune`` removes the state of limiters idle since ``calls_before`` with their
    calls, keeps a limiter in use (its slot held, its bucket spent) as it was, and still
    counts only the deliveries and calls it removed."""
    customers = [Limit(name=f"report\x1fcustomer {n}", concurrency=1, rate=0.001) for n in (0, 1)]
    for n, limit in enumerate(customers):
        assert (await claim(store, n, limit=limit)).status is ClaimStatus.CLAIMED
    # A second call of the first customer waits (its slot is held, its bucket empty).
    assert (await claim(store, 2, limit=customers[0])).status is ClaimStatus.WAITING
    for n in (0, 1, 2):  # each saves (the waiter its max_wait failure) and is submitted
        await store.save_result(key(n), owner="a", attempt=1, result=result())
        await store.mark_submitted(key(n))
    assert len(await _limiters_with_state(store)) == 2
    clock.advance(100.0)
    live = Limit(name="report\x1fcustomer live", concurrency=1, rate=0.001)
    assert (await claim(store, 3, limit=live)).status is ClaimStatus.CLAIMED

    removed = await store.prune(deliveries_before=clock() - 50.0, calls_before=clock() - 50.0)
    assert removed == 3
    ident = redis_h if isinstance(store, RedisStore) else str
    assert await _limiters_with_state(store) == {ident(live.name)}
    # The live limiter is as it was: its slot held and its bucket spent.
    assert (await claim(store, 4, limit=live)).status is ClaimStatus.WAITING
