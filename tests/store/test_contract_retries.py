"""Scheduled retries (flow control, issue 24) on every store: only the holder schedules,
nobody claims the call before its time, exactly one claimant gets the next attempt at it,
and the sweep finds it due."""

from __future__ import annotations

import asyncio

import pytest

from agentfn_asgi.calls.records import CallKey, CallState, ClaimStatus
from agentfn_asgi.store import Store
from tests.store.conftest import KEY, LEASE, StoreFactory, claim, result
from tests.support.clock import FakeClock

pytestmark = pytest.mark.anyio


async def test_only_the_holder_schedules_a_retry(store: Store, clock: FakeClock) -> None:
    """Another owner or a superseded attempt changes nothing (fencing)."""
    await claim(store, "a")
    at = clock() + 5
    assert not await store.schedule_retry(KEY, owner="b", attempt=1, at=at, reason="429")
    assert not await store.schedule_retry(KEY, owner="a", attempt=2, at=at, reason="429")
    assert await store.schedule_retry(KEY, owner="a", attempt=1, at=at, reason="429")
    record = await store.get_call(KEY, history=True)
    assert record is not None
    assert (record.state, record.attempt, record.next_attempt_at) == (
        CallState.RETRY_SCHEDULED,
        1,
        at,
    )
    assert [(e.kind, e.detail) for e in record.history][-1] == ("retry_scheduled", "429")
    # Scheduled is not claimed: a second schedule, a save or a quarantine does nothing. The
    # holder's own schedule sent again (its answer lost) is recognised as done.
    assert not await store.schedule_retry(KEY, owner="a", attempt=1, at=at + 1, reason="again")
    assert await store.schedule_retry(KEY, owner="a", attempt=1, at=at, reason="429")
    again = await store.get_call(KEY, history=True)
    assert again is not None and again.history == record.history
    saved = await store.save_result(KEY, owner="a", attempt=1, result=result())
    assert saved.state is CallState.RETRY_SCHEDULED


async def test_a_retry_is_claimed_at_its_time_never_sooner(store: Store, clock: FakeClock) -> None:
    """Before its time every claim is told busy (even past the lease); at its time the first
    claimant gets the next attempt, not in doubt; the sweep lists it only once it is due."""
    await claim(store, "a")
    assert await store.schedule_retry(KEY, owner="a", attempt=1, at=clock() + LEASE * 3, reason="")
    clock.advance(LEASE * 2)
    assert await claim(store, "b") is ClaimStatus.BUSY
    assert await store.due_retries() == []
    assert await store.expired_claims() == []
    clock.advance(LEASE)
    assert [r.key for r in await store.due_retries()] == [KEY]
    outcome = await store.claim_call(KEY, tool_name="lookup", owner="b", lease_seconds=LEASE)
    assert outcome.status is ClaimStatus.RETRY
    assert (outcome.record.state, outcome.record.attempt, outcome.record.owner) == (
        CallState.CLAIMED,
        2,
        "b",
    )
    assert await claim(store, "c") is ClaimStatus.BUSY
    assert await store.due_retries() == []
    record = await store.get_call(KEY, history=True)
    assert record is not None
    assert [e.kind for e in record.history][-1] == "retried"
    # The new attempt is fenced as any other: b saves, a cannot.
    assert (await store.save_result(KEY, owner="a", attempt=1, result=result())).attempt == 2
    saved = await store.save_result(KEY, owner="b", attempt=2, result=result())
    assert saved.state is CallState.SUCCEEDED


async def test_concurrent_claims_of_a_due_retry_have_one_winner(
    store_factory: StoreFactory, clock: FakeClock
) -> None:
    """Two replicas claiming a due retry at once: one runs it (never twice)."""
    first, second = await store_factory(), await store_factory()
    key = CallKey("sess_r", "turn_r", "call_r")
    await claim(first, "a", key)
    assert await first.schedule_retry(key, owner="a", attempt=1, at=clock(), reason="")
    outcomes = await asyncio.gather(
        *(
            s.claim_call(key, tool_name="lookup", owner=o, lease_seconds=LEASE)
            for s, o in ((first, "x"), (second, "y"))
        )
    )
    assert sorted(o.status for o in outcomes) == [ClaimStatus.BUSY, ClaimStatus.RETRY]


async def test_a_scheduled_retry_can_be_cancelled_and_counts_in_stats(
    store: Store, clock: FakeClock
) -> None:
    """The session no longer waits: a scheduled retry is cancelled like any pending call."""
    await claim(store, "a")
    assert await store.schedule_retry(KEY, owner="a", attempt=1, at=clock() + 5, reason="")
    stats = await store.stats()
    assert stats.calls_by_state[CallState.RETRY_SCHEDULED.value] == 1
    assert await store.cancel(KEY, owner="a", reason="turn cancelled", known_before=clock.now)
    record = await store.get_call(KEY)
    assert record is not None and record.state is CallState.CANCELLED
    clock.advance(10)
    assert await store.due_retries() == []
