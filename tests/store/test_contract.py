"""The store contract: every backend must pass every test here (see base.py's docstrings).

Time is the fake clock from conftest, so leases expire by ``clock.advance`` without sleeping.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable

import pytest

from agentfn_asgi.calls.records import (
    CallKey,
    CallState,
    ClaimOutcome,
    ClaimStatus,
    DeliveryRecord,
    Limit,
    SavedResult,
)
from agentfn_asgi.errors import StoreError, StoreUnavailableError
from agentfn_asgi.store import Store
from tests.store.conftest import KEY, LEASE, StoreFactory, claim, require_service, result
from tests.support.clock import FakeClock

pytestmark = pytest.mark.anyio

# -- lifecycle -----------------------------------------------------------------------------


async def test_store_satisfies_protocol_and_lifecycle_is_idempotent(store: Store) -> None:
    """Every backend is a runtime Store; open() and close() may be repeated."""
    assert isinstance(store, Store)
    await store.open()
    await store.ping()
    await store.close()
    await store.close()
    await store.open()
    await store.ping()


async def test_first_use_opens_implicitly(store_factory: StoreFactory) -> None:
    """A store that was never opened opens itself on first use."""
    store = await store_factory(opened=False)
    assert await store.record_delivery("d1", "sess_1") is True
    assert await store.get_call(KEY) is None


async def test_a_cancellation_during_an_operation_is_never_lost(store: Store) -> None:
    """A task cancelled while a store operation is in flight ends cancelled, wherever in the
    operation the cancellation lands.

    Found by the soak (issue 27; SOAK_STORE=redis SOAK_SEED=2): redis-py sends each command
    under ``asyncio.wait_for``, which on Python 3.11 loses a cancellation that arrives just as
    the send completes (CPython gh-86296, fixed in 3.12). A lease heartbeat cancelled at that
    moment kept renewing forever, and its call, whose handler had finished, was never saved,
    submitted or taken over.
    """
    assert await claim(store, "a") is ClaimStatus.CLAIMED
    stopped = False

    async def renewing() -> None:
        while not stopped:  # so that a lost cancellation cannot outlive the test
            await store.renew_lease(KEY, owner="a", attempt=1, lease_seconds=LEASE)
            await asyncio.sleep(0)  # the memory store never yields on its own

    try:
        # Cancel after 0, 1, 2, ... turns of the event loop: every point of the operation.
        for turns in range(40):
            task = asyncio.create_task(renewing())
            for _ in range(turns):
                await asyncio.sleep(0)
            task.cancel()
            done, _ = await asyncio.wait([task], timeout=5)  # a guard, not a measure
            assert task in done and task.cancelled(), f"cancellation lost after {turns} turns"
    finally:
        stopped = True


async def test_closed_store_raises_unavailable(store: Store) -> None:
    """Operations after close() fail with StoreUnavailableError, never a driver error; close()
    may be repeated and open() makes the store usable again."""
    await store.close()
    await store.close()
    with pytest.raises(StoreUnavailableError):
        await store.record_delivery("d1", "sess_1")
    with pytest.raises(StoreUnavailableError):
        await store.get_call(KEY)
    with pytest.raises(StoreUnavailableError):
        await store.ping()
    await store.open()
    await store.ping()
    assert await store.record_delivery("d1", "sess_1") is True


# -- deliveries ----------------------------------------------------------------------------


async def test_record_delivery_dedups_by_id(store: Store) -> None:
    """The first record of a delivery id is new, every later one is a duplicate."""
    assert await store.record_delivery("msg_1", "sess_1") is True
    assert await store.record_delivery("msg_1", "sess_1") is False
    assert await store.record_delivery("msg_1", "sess_other") is False
    assert await store.record_delivery("msg_2", "sess_1") is True


async def test_unresolved_deliveries_and_mark_resolved(store: Store, clock: FakeClock) -> None:
    """Recovery sees unresolved deliveries up to older_than, oldest first, until resolved."""
    t0 = clock.now
    await store.record_delivery("msg_1", "sess_1")
    clock.advance(10)
    await store.record_delivery("msg_2", "sess_2")
    clock.advance(10)
    await store.record_delivery("msg_3", "sess_3")

    assert await store.unresolved_deliveries(due_before=t0 + 5) == [
        DeliveryRecord("msg_1", "sess_1", t0, False, next_attempt_at=t0)
    ]
    found = await store.unresolved_deliveries(due_before=clock.now)
    assert [d.delivery_id for d in found] == ["msg_1", "msg_2", "msg_3"]
    assert [d.received_at for d in found] == [t0, t0 + 10, t0 + 20]
    limited = await store.unresolved_deliveries(due_before=clock.now, limit=2)
    assert [d.delivery_id for d in limited] == ["msg_1", "msg_2"]

    await store.mark_delivery_resolved("msg_1")
    await store.mark_delivery_resolved("msg_1")
    await store.mark_delivery_resolved("never_seen")
    found = await store.unresolved_deliveries(due_before=clock.now)
    assert [d.delivery_id for d in found] == ["msg_2", "msg_3"]
    assert await store.record_delivery("msg_1", "sess_1") is False


@pytest.mark.parametrize("limited", [False, True], ids=["plain", "limited"])
async def test_a_claim_can_resolve_its_delivery_in_the_same_step(
    store: Store, clock: FakeClock, limited: bool
) -> None:
    """``resolves_delivery`` resolves the claim's delivery with the claim, whatever the claim
    decides (taken, or held by another); without it, or without a delivery id, the delivery
    stays for the sweep. Only the named delivery changes."""
    limit = Limit(name="lookup", concurrency=1) if limited else None
    for delivery in ("d_plain", "d_taken", "d_busy", "d_other", "d_none"):
        await store.record_delivery(delivery, "sess_1")

    async def unresolved() -> list[str]:
        return [d.delivery_id for d in await store.unresolved_deliveries(due_before=clock.now)]

    def claim_for(
        call: str, owner: str, delivery: str | None, *, resolves: bool = True
    ) -> Awaitable[ClaimOutcome]:
        key = CallKey("sess_1", "turn_1", call)
        return store.claim_call(
            key,
            tool_name="lookup",
            owner=owner,
            lease_seconds=LEASE,
            delivery_id=delivery,
            limit=limit,
            resolves_delivery=resolves,
        )

    await claim_for("call_1", "a", "d_plain", resolves=False)
    taken = await claim_for("call_2", "a", "d_taken")
    busy = await claim_for("call_1", "b", "d_busy")
    unnamed = await claim_for("call_3", "a", None)
    expected_taken = ClaimStatus.WAITING if limited else ClaimStatus.CLAIMED
    assert (taken.status, busy.status) == (expected_taken, ClaimStatus.BUSY)
    assert taken.record.delivery_id == "d_taken"
    assert unnamed.record.delivery_id is None
    assert await unresolved() == ["d_none", "d_other", "d_plain"]
    # The resolution is idempotent: a retried claim of the same delivery changes nothing.
    again = await claim_for("call_2", "a", "d_taken")
    assert again.status is expected_taken
    assert await unresolved() == ["d_none", "d_other", "d_plain"]


# -- claims --------------------------------------------------------------------------------


async def test_claim_new_call_is_claimed_attempt_1(store: Store, clock: FakeClock) -> None:
    """An absent call is inserted as claimed by the caller, attempt 1, with a lease."""
    outcome = await store.claim_call(
        KEY, tool_name="lookup", owner="a", lease_seconds=LEASE, delivery_id="msg_1"
    )
    assert outcome.status is ClaimStatus.CLAIMED
    record = outcome.record
    assert record.key == KEY
    assert record.tool_name == "lookup"
    assert record.state is CallState.CLAIMED
    assert record.attempt == 1
    assert record.owner == "a"
    assert record.lease_expires_at == pytest.approx(clock.now + LEASE)
    assert record.created_at == pytest.approx(clock.now)
    assert record.delivery_id == "msg_1"
    assert record.result is None
    assert await store.get_call(KEY) == record


async def test_claim_with_live_lease_is_busy(store: Store, clock: FakeClock) -> None:
    """A live lease keeps every other claimant out; the owner's own repeat (a claim retried
    after its answer was lost) finds the call already its own, unchanged."""
    assert await claim(store, "a") is ClaimStatus.CLAIMED
    clock.advance(LEASE - 1)
    assert await claim(store, "b") is ClaimStatus.BUSY
    assert await claim(store, "a") is ClaimStatus.CLAIMED
    record = await store.get_call(KEY)
    assert record is not None
    assert (record.owner, record.attempt) == ("a", 1)
    assert record.lease_expires_at == pytest.approx(clock.now - LEASE + 1 + LEASE)


async def test_an_owners_repeated_takeover_is_its_own(store: Store, clock: FakeClock) -> None:
    """After a takeover, the new owner's retried claim returns the same attempt (2), not a
    third one and not BUSY."""
    await claim(store, "a")
    clock.advance(LEASE + 1)
    assert await claim(store, "b") is ClaimStatus.IN_DOUBT
    again = await store.claim_call(KEY, tool_name="lookup", owner="b", lease_seconds=LEASE)
    assert (again.status, again.record.attempt, again.record.owner) == (
        ClaimStatus.IN_DOUBT,
        2,
        "b",
    )


async def test_takeover_waits_out_the_margin(store: Store, clock: FakeClock) -> None:
    """With a margin, an expired lease is taken over only once it has been expired longer
    than the margin (the holder fences itself that long before expiry)."""
    await claim(store, "a")
    clock.advance(LEASE + 3)

    async def by_b() -> ClaimStatus:
        outcome = await store.claim_call(
            KEY, tool_name="lookup", owner="b", lease_seconds=LEASE, margin=5.0
        )
        return outcome.status

    assert await by_b() is ClaimStatus.BUSY
    assert await store.expired_claims(margin=5.0) == []
    assert [r.key for r in await store.expired_claims()] == [KEY]
    clock.advance(3)
    assert [r.key for r in await store.expired_claims(margin=5.0)] == [KEY]
    assert await by_b() is ClaimStatus.IN_DOUBT


async def test_claim_after_lease_expired_is_in_doubt(store: Store, clock: FakeClock) -> None:
    """An expired claim with no result is taken over: new owner, attempt + 1, new lease."""
    first = await store.claim_call(
        KEY, tool_name="lookup", owner="a", lease_seconds=LEASE, delivery_id="msg_1"
    )
    clock.advance(LEASE + 1)
    outcome = await store.claim_call(
        KEY, tool_name="lookup", owner="b", lease_seconds=LEASE, delivery_id="msg_2"
    )
    assert outcome.status is ClaimStatus.IN_DOUBT
    assert outcome.record.state is CallState.CLAIMED
    assert outcome.record.owner == "b"
    assert outcome.record.attempt == 2
    assert outcome.record.lease_expires_at == pytest.approx(clock.now + LEASE)
    assert outcome.record.created_at == pytest.approx(first.record.created_at)
    assert await claim(store, "c") is ClaimStatus.BUSY

    clock.advance(LEASE + 1)
    again = await store.claim_call(KEY, tool_name="lookup", owner="c", lease_seconds=LEASE)
    assert (again.status, again.record.attempt, again.record.owner) == (
        ClaimStatus.IN_DOUBT,
        3,
        "c",
    )


@pytest.mark.parametrize("success", [True, False])
async def test_claim_after_save_is_saved(store: Store, clock: FakeClock, success: bool) -> None:
    """A saved (not yet submitted) result is never re-run: claims answer SAVED with it."""
    await claim(store, "a")
    saved = result("answer", success=success)
    await store.save_result(KEY, owner="a", attempt=1, result=saved)
    clock.advance(LEASE * 10)
    outcome = await store.claim_call(KEY, tool_name="lookup", owner="b", lease_seconds=LEASE)
    assert outcome.status is ClaimStatus.SAVED
    assert outcome.record.state is (CallState.SUCCEEDED if success else CallState.FAILED)
    assert outcome.record.result == saved
    assert outcome.record.attempt == 1


async def test_leases_are_judged_by_the_injected_clock(store: Store, clock: FakeClock) -> None:
    """Lease expiry follows the store's clock, never the server's (Redis TIME, now()): a
    clock far in the past still sees a lease live, then expired."""
    clock.now = 1000.0
    await claim(store, "a")
    clock.advance(LEASE - 1)
    assert await claim(store, "b") is ClaimStatus.BUSY
    clock.advance(2)
    taken = await store.claim_call(KEY, tool_name="t", owner="b", lease_seconds=LEASE)
    assert (taken.status, taken.record.attempt) == (ClaimStatus.IN_DOUBT, 2)


async def test_times_round_trip_exactly(store: Store, clock: FakeClock) -> None:
    """Times are stored from the injected clock without losing a digit (Lua prints 14)."""
    clock.now = 1_712_345_678.987654321
    outcome = await store.claim_call(KEY, tool_name="t", owner="o", lease_seconds=0.000123)
    assert outcome.record.created_at == clock.now
    assert outcome.record.lease_expires_at == clock.now + 0.000123
    await store.record_delivery("m", "s")
    [delivery] = await store.unresolved_deliveries(due_before=clock.now)
    assert delivery.received_at == clock.now


# -- results -------------------------------------------------------------------------------


async def test_save_result_moves_claimed_to_succeeded_or_failed(store: Store) -> None:
    """save_result stores the exact result and returns the new record."""
    await claim(store, "a")
    record = await store.save_result(KEY, owner="a", attempt=1, result=result("yes"))
    assert record.state is CallState.SUCCEEDED
    assert record.result == result("yes")
    assert await store.get_call(KEY) == record

    other = CallKey("sess_1", "turn_1", "call_2")
    await claim(store, "a", other)
    failed = await store.save_result(
        other, owner="a", attempt=1, result=result("no", success=False)
    )
    assert failed.state is CallState.FAILED
    assert failed.result is not None
    assert failed.result.error_type == "handler_error"


async def test_save_result_first_writer_wins(store: Store, clock: FakeClock) -> None:
    """Once a result is saved, later saves (any owner) get the stored record unchanged."""
    await claim(store, "a")
    clock.advance(LEASE + 1)
    assert await claim(store, "b") is ClaimStatus.IN_DOUBT
    winner = await store.save_result(KEY, owner="b", attempt=2, result=result("from b", key="kb"))
    loser = await store.save_result(KEY, owner="a", attempt=1, result=result("from a", key="ka"))
    assert loser == winner
    assert loser.result == result("from b", key="kb")
    again = await store.save_result(KEY, owner="b", attempt=2, result=result("twice", key="kb2"))
    assert again.result == result("from b", key="kb")


async def test_a_superseded_attempt_cannot_save(store: Store, clock: FakeClock) -> None:
    """Fencing: after a takeover, the old holder's save (attempt 1) is refused even before
    the new holder saved: the record comes back unchanged, still claimed by attempt 2; so
    is a save under the right owner with another attempt number."""
    await claim(store, "a")
    clock.advance(LEASE + 1)
    assert await claim(store, "b") is ClaimStatus.IN_DOUBT
    late = await store.save_result(KEY, owner="a", attempt=1, result=result("late", key="ka"))
    assert (late.state, late.owner, late.attempt, late.result) == (
        CallState.CLAIMED,
        "b",
        2,
        None,
    )
    wrong = await store.save_result(KEY, owner="b", attempt=1, result=result("x", key="kx"))
    assert wrong.result is None
    saved = await store.save_result(KEY, owner="b", attempt=2, result=result("b", key="kb"))
    assert saved.result == result("b", key="kb")


async def test_save_after_own_lease_expired_succeeds(store: Store, clock: FakeClock) -> None:
    """A slow owner whose lease lapsed may still save if nobody saved since."""
    await claim(store, "a")
    clock.advance(LEASE * 3)
    record = await store.save_result(KEY, owner="a", attempt=1, result=result("late"))
    assert record.state is CallState.SUCCEEDED
    assert record.result == result("late")


async def test_save_result_for_unknown_call_raises(store: Store) -> None:
    """A result for a call that was never claimed is a StoreError, not a silent insert."""
    with pytest.raises(StoreError):
        await store.save_result(KEY, owner="a", attempt=1, result=result())


async def test_mark_submitted_is_terminal(store: Store) -> None:
    """submitted answers DONE; marking a call without a result does nothing."""
    await claim(store, "a")
    await store.mark_submitted(KEY)
    record = await store.get_call(KEY)
    assert record is not None
    assert record.state is CallState.CLAIMED

    await store.save_result(KEY, owner="a", attempt=1, result=result())
    await store.mark_submitted(KEY)
    await store.mark_submitted(KEY)
    record = await store.get_call(KEY)
    assert record is not None
    assert record.state is CallState.SUBMITTED
    assert record.result == result()
    assert await claim(store, "b") is ClaimStatus.DONE
    await store.mark_submitted(CallKey("x", "y", "z"))  # unknown: ignored


async def test_mark_stale_is_terminal(store: Store, clock: FakeClock) -> None:
    """stale answers DONE from saved, and never overrides submitted; a claimed call is
    cancelled instead (mark_stale leaves it)."""
    await claim(store, "a")
    await store.mark_stale(KEY)
    assert (await store.get_call(KEY)).state is CallState.CLAIMED  # type: ignore[union-attr]
    assert await store.cancel(KEY, owner="x", reason="turn cancelled", known_before=clock.now)
    clock.advance(LEASE + 1)
    assert await claim(store, "b") is ClaimStatus.DONE

    saved_key = CallKey("sess_1", "turn_1", "call_saved")
    await claim(store, "a", saved_key)
    await store.save_result(saved_key, owner="a", attempt=1, result=result())
    await store.mark_stale(saved_key)
    assert await claim(store, "b", saved_key) is ClaimStatus.DONE

    done_key = CallKey("sess_1", "turn_1", "call_done")
    await claim(store, "a", done_key)
    await store.save_result(done_key, owner="a", attempt=1, result=result())
    await store.mark_submitted(done_key)
    await store.mark_stale(done_key)
    record = await store.get_call(done_key)
    assert record is not None
    assert record.state is CallState.SUBMITTED
    await store.mark_stale(CallKey("x", "y", "z"))  # unknown: ignored


async def test_quarantine_is_terminal_and_owner_only(store: Store, clock: FakeClock) -> None:
    """Only the current owner quarantines a claimed call; a saved result is never replaced."""
    await claim(store, "a")
    clock.advance(LEASE + 1)
    await claim(store, "b")
    await store.quarantine(KEY, owner="a", attempt=1, reason="stale owner")
    await store.quarantine(KEY, owner="b", attempt=1, reason="superseded attempt")
    record = await store.get_call(KEY)
    assert record is not None
    assert record.state is CallState.CLAIMED
    assert record.reason is None

    await store.quarantine(KEY, owner="b", attempt=2, reason="reconcile could not decide")
    record = await store.get_call(KEY)
    assert record is not None
    assert record.state is CallState.QUARANTINED
    clock.advance(LEASE + 1)
    assert await claim(store, "c") is ClaimStatus.DONE

    saved_key = CallKey("sess_1", "turn_1", "call_saved")
    await claim(store, "a", saved_key)
    await store.save_result(saved_key, owner="a", attempt=1, result=result())
    await store.quarantine(saved_key, owner="a", attempt=1, reason="too late")
    record = await store.get_call(saved_key)
    assert record is not None
    assert record.state is CallState.SUCCEEDED
    assert record.reason is None


async def test_reason_is_read_back(store: Store, clock: FakeClock) -> None:
    """The reason given to quarantine() comes back on the record, wherever it is read."""
    reason = "reconcile could not decide: payment ☃ unknown"
    await claim(store, "a")
    await store.quarantine(KEY, owner="a", attempt=1, reason=reason)
    record = await store.get_call(KEY)
    assert record is not None
    assert (record.state, record.reason, record.result) == (
        CallState.QUARANTINED,
        reason,
        None,
    )
    assert await store.calls_for_session(KEY.session_id) == [record]
    clock.advance(LEASE + 1)
    outcome = await store.claim_call(KEY, tool_name="lookup", owner="b", lease_seconds=LEASE)
    assert outcome.status is ClaimStatus.DONE
    assert outcome.record == record


async def test_renew_lease(store: Store, clock: FakeClock) -> None:
    """The holder (owner and attempt) extends its lease; anyone else, another attempt, or a
    call no longer claimed, gets False."""
    await claim(store, "a")
    clock.advance(LEASE - 1)
    assert await store.renew_lease(KEY, owner="a", attempt=1, lease_seconds=LEASE) is True
    record = await store.get_call(KEY)
    assert record is not None
    assert record.lease_expires_at == pytest.approx(clock.now + LEASE)
    clock.advance(LEASE - 1)  # past the original lease, inside the renewed one
    assert await claim(store, "b") is ClaimStatus.BUSY
    assert await store.renew_lease(KEY, owner="b", attempt=1, lease_seconds=LEASE) is False
    assert await store.renew_lease(KEY, owner="a", attempt=2, lease_seconds=LEASE) is False
    unknown = CallKey("x", "y", "z")
    assert await store.renew_lease(unknown, owner="a", attempt=1, lease_seconds=1) is False

    clock.advance(LEASE + 1)
    assert await claim(store, "b") is ClaimStatus.IN_DOUBT
    assert await store.renew_lease(KEY, owner="a", attempt=1, lease_seconds=LEASE) is False
    assert await store.renew_lease(KEY, owner="b", attempt=2, lease_seconds=LEASE) is True
    await store.save_result(KEY, owner="b", attempt=2, result=result())
    assert await store.renew_lease(KEY, owner="b", attempt=2, lease_seconds=LEASE) is False


# -- queries -------------------------------------------------------------------------------


async def test_get_call_and_calls_for_session(store: Store, clock: FakeClock) -> None:
    """get_call finds one call; calls_for_session every call of that session only."""
    assert await store.get_call(KEY) is None
    keys = [
        CallKey("sess_1", "turn_1", "call_1"),
        CallKey("sess_1", "turn_1", "call_2"),
        CallKey("sess_1", "turn_2", "call_3"),
    ]
    for key in keys:
        await claim(store, "a", key)
        clock.advance(1)
    await claim(store, "a", CallKey("sess_2", "turn_1", "call_1"))
    await store.save_result(keys[1], owner="a", attempt=1, result=result())

    records = await store.calls_for_session("sess_1")
    assert [r.key for r in records] == keys
    assert [r.state for r in records] == [
        CallState.CLAIMED,
        CallState.SUCCEEDED,
        CallState.CLAIMED,
    ]
    assert await store.calls_for_session("sess_none") == []


async def test_unsubmitted_results(store: Store, clock: FakeClock) -> None:
    """Recovery sees saved-but-unsubmitted results (succeeded and failed) only."""
    keys = [CallKey("s", "t", f"c{i}") for i in range(5)]
    for key in keys:
        await claim(store, "a", key)
    await store.save_result(keys[0], owner="a", attempt=1, result=result())
    clock.advance(1)
    await store.save_result(keys[1], owner="a", attempt=1, result=result(success=False))
    clock.advance(1)
    await store.save_result(keys[2], owner="a", attempt=1, result=result())
    await store.mark_submitted(keys[2])
    await store.cancel(keys[3], owner="a", reason="turn cancelled", known_before=clock.now)

    found = await store.unsubmitted_results(due_before=2e9)
    assert {r.key for r in found} == {keys[0], keys[1]}
    assert all(r.result is not None for r in found)
    assert len(await store.unsubmitted_results(due_before=clock.now, limit=1)) == 1


async def test_expired_claims(store: Store, clock: FakeClock) -> None:
    """Recovery sees claims whose lease expired, not live ones nor saved ones."""
    old = CallKey("s", "t", "old")
    saved = CallKey("s", "t", "saved")
    await claim(store, "a", old)
    await claim(store, "a", saved)
    await store.save_result(saved, owner="a", attempt=1, result=result())
    clock.advance(LEASE + 1)
    fresh = CallKey("s", "t", "fresh")
    await claim(store, "a", fresh)

    found = await store.expired_claims()
    assert [r.key for r in found] == [old]
    assert found[0].state is CallState.CLAIMED
    clock.advance(LEASE + 1)
    assert {r.key for r in await store.expired_claims()} == {old, fresh}
    assert len(await store.expired_claims(limit=1)) == 1


async def test_prune_removes_old_deliveries_and_old_terminal_calls(
    store: Store, clock: FakeClock
) -> None:
    """prune drops old deliveries and old terminal calls; pending calls are never pruned."""
    await store.record_delivery("old_resolved", "s")
    await store.mark_delivery_resolved("old_resolved")
    await store.record_delivery("old_unresolved", "s")
    keys = {name: CallKey("s", "t", name) for name in ("submitted", "stale", "claimed", "saved")}
    for key in keys.values():
        await claim(store, "a", key)
    await store.save_result(keys["submitted"], owner="a", attempt=1, result=result())
    await store.mark_submitted(keys["submitted"])
    await store.cancel(keys["stale"], owner="a", reason="turn cancelled", known_before=clock.now)
    await store.save_result(keys["saved"], owner="a", attempt=1, result=result())
    cutoff = clock.now + 1
    clock.advance(100)
    await store.record_delivery("new", "s")
    recent = CallKey("s", "t", "recent")
    await claim(store, "a", recent)
    await store.cancel(recent, owner="a", reason="turn cancelled", known_before=clock.now)

    removed = await store.prune(deliveries_before=cutoff, calls_before=cutoff)
    assert removed == 4
    assert await store.record_delivery("new", "s") is False
    assert await store.record_delivery("old_resolved", "s") is True
    assert await store.get_call(keys["submitted"]) is None
    assert await store.get_call(keys["stale"]) is None
    assert await store.get_call(keys["claimed"]) is not None
    assert await store.get_call(keys["saved"]) is not None
    assert await store.get_call(recent) is not None
    assert await store.prune(deliveries_before=0, calls_before=0) == 0


async def test_prune_many_rows(store: Store, clock: FakeClock) -> None:
    """prune removes everything due even when that is more than one batch, and nothing else."""
    await asyncio.gather(*(store.record_delivery(f"d{i}", "s") for i in range(1234)))
    done, live = CallKey("s", "t", "done"), CallKey("s", "t", "live")
    for key in (done, live):
        await claim(store, "a", key)
    await store.cancel(done, owner="a", reason="turn cancelled", known_before=clock.now)
    clock.advance(10)
    await store.record_delivery("new", "s")
    assert await store.prune(deliveries_before=clock.now - 1, calls_before=clock.now) == 1235
    stats = await store.stats()
    assert stats.deliveries == 1
    assert (stats.calls_by_state["claimed"], stats.calls_by_state["stale"]) == (1, 0)


async def test_non_positive_limits_return_nothing(store: Store, clock: FakeClock) -> None:
    """A limit of 0 or below returns nothing from every recovery query (never "no limit")."""
    await store.record_delivery("d1", "s")
    await claim(store, "a", CallKey("s", "t", "expired"))
    await claim(store, "a", CallKey("s", "t", "saved"))
    await store.save_result(CallKey("s", "t", "saved"), owner="a", attempt=1, result=result())
    clock.advance(LEASE + 1)
    for limit in (0, -1):
        assert await store.unresolved_deliveries(due_before=clock.now, limit=limit) == []
        assert await store.unsubmitted_results(due_before=clock.now, limit=limit) == []
        assert await store.expired_claims(limit=limit) == []
    assert len(await store.expired_claims(limit=1)) == 1


async def test_stats(store: Store, clock: FakeClock) -> None:
    """stats counts deliveries, calls in every state (zeros too), in-doubt claims and the
    oldest pending call."""
    empty = await store.stats()
    assert (empty.deliveries, empty.unresolved_deliveries, empty.in_doubt) == (0, 0, 0)
    assert empty.oldest_pending_at is None
    assert empty.calls_by_state == {state.value: 0 for state in CallState}

    await store.record_delivery("d1", "s")
    await store.record_delivery("d2", "s")
    await store.mark_delivery_resolved("d1")
    first_created = clock.now
    await claim(store, "a", CallKey("s", "t", "expired"))
    clock.advance(LEASE + 1)
    await claim(store, "a", CallKey("s", "t", "live"))
    await claim(store, "a", CallKey("s", "t", "saved"))
    await store.save_result(CallKey("s", "t", "saved"), owner="a", attempt=1, result=result())
    await claim(store, "a", CallKey("s", "t", "done"))
    await store.save_result(CallKey("s", "t", "done"), owner="a", attempt=1, result=result())
    await store.mark_submitted(CallKey("s", "t", "done"))

    stats = await store.stats()
    assert set(stats.calls_by_state) == {state.value for state in CallState}
    assert stats.deliveries == 2
    assert stats.unresolved_deliveries == 1
    assert {k: v for k, v in stats.calls_by_state.items() if v} == {
        "claimed": 2,
        "succeeded": 1,
        "submitted": 1,
    }
    assert stats.in_doubt == 1
    assert stats.oldest_pending_at == pytest.approx(first_created)


# -- payloads ------------------------------------------------------------------------


async def test_saved_result_round_trip_unicode_and_4mib(store: Store) -> None:
    """A result comes back byte-for-byte: unicode, newlines, a 4 MiB event, every field."""
    text = 'naïve ☃ 中文 \U0001f600 "quoted" \\ back\nline\x00nul'
    event_json = json.dumps({"output": text + "x" * (4 * 1024 * 1024)}, ensure_ascii=False)
    saved = SavedResult(
        success=False,
        event_json=event_json,
        idempotency_key="idem-☃",
        error_type="too_large",
        source="worker",
        full_output="full ☃ output",
    )
    await claim(store, "a")
    record = await store.save_result(KEY, owner="a", attempt=1, result=saved)
    assert record.result == saved
    stored = await store.get_call(KEY)
    assert stored is not None
    assert stored.result == saved
    assert (await store.unsubmitted_results(due_before=2e9))[0].result == saved


async def test_identifiers_of_any_shape_are_distinct_and_round_trip(
    store: Store, clock: FakeClock
) -> None:
    """Separators, glob characters, quotes, unicode and long ids neither collide nor break."""
    keys = [
        CallKey("a:b", "c", "d"),
        CallKey("a", "b:c", "d"),
        CallKey("a", "b", "c:d"),
        CallKey("*?[x]\\", '"quoted"', "ü🙂"),
        CallKey("s" * 5000, "t" * 5000, "c" * 5000),
    ]
    for key in keys:
        outcome = await store.claim_call(key, tool_name="t", owner="o", lease_seconds=10)
        assert outcome.status is ClaimStatus.CLAIMED
        assert outcome.record.key == key
        clock.advance(1)
    for key in keys:
        record = await store.get_call(key)
        assert record is not None
        assert record.key == key
    assert [r.key for r in await store.calls_for_session("a")] == [keys[1], keys[2]]
    assert await store.record_delivery("x" * 10_000, "ü🙂") is True
    assert [d.session_id for d in await store.unresolved_deliveries(due_before=clock.now)] == [
        "ü🙂"
    ]


# -- the suite's own rule ------------------------------------------------------------------


@pytest.mark.parametrize(("ci", "outcome"), [("true", "fail"), ("", "skip"), ("false", "skip")])
def test_require_service_fails_only_under_ci(
    monkeypatch: pytest.MonkeyPatch, ci: str, outcome: str
) -> None:
    """A missing Redis/PostgreSQL skips locally but fails the run when CI=true."""
    monkeypatch.setenv("CI", ci)
    expected = pytest.fail.Exception if outcome == "fail" else pytest.skip.Exception
    with pytest.raises(expected, match="redis unavailable: not running"):
        require_service("redis", "not running")


async def test_the_oldest_pending_call_is_one_this_app_answers(
    store: Store, clock: FakeClock
) -> None:
    """An action left ``unanswered`` (someone else answers it) is not the oldest pending
    call: it kept ``status`` and the page's oldest pending age growing, and alerts on it
    firing, for actions this app never answers (its own age is shown apart)."""
    left = CallKey("s", "t", "left")
    await claim(store, "a", left)
    assert await store.leave(left, owner="a", attempt=1, reason="no actions= policy")
    clock.advance(60)
    assert (await store.stats()).oldest_pending_at is None
    owed_since = clock.now
    await claim(store, "a", CallKey("s", "t", "owed"))
    assert (await store.stats()).oldest_pending_at == pytest.approx(owed_since)
