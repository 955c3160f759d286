"""The store contract, approval part (issue 23): the rows request_approval, approve, deny,
expire_approval and run_approved of the state table, on every backend, with the memory store
as the reference: held only by the claim's holder, decided once, by the expiry, claimed to
run by one replica, isolated by namespace, and found by the request's id."""

from __future__ import annotations

import pytest

from agentfn_asgi.calls.records import ApprovalRequest, CallRecord, CallState, ClaimStatus
from agentfn_asgi.store import Store

from .conftest import KEY, LEASE, FakeClock, StoreFactory, claim, hold_for_approval, result

pytestmark = pytest.mark.anyio

TIMEOUT = 3600.0


def request(clock: FakeClock, approval_id: str = "apr_1") -> ApprovalRequest:
    return ApprovalRequest(
        approval_id=approval_id,
        tool_name="lookup",
        digest="d" * 64,
        requested_at=clock.now,
        expires_at=clock.now + TIMEOUT,
    )


async def held(store: Store, clock: FakeClock, approval_id: str = "apr_1") -> ApprovalRequest:
    await claim(store, "a")
    asked = request(clock, approval_id)
    record = await store.request_approval(KEY, owner="a", attempt=1, request=asked)
    assert record.state is CallState.AWAITING_APPROVAL and record.approval == asked
    return asked


async def test_only_the_holder_asks_and_a_waiting_call_is_left_alone(
    store: Store, clock: FakeClock
) -> None:
    """Another owner's request changes nothing; once waiting, the call's lease is the
    request's expiry, a claim of it is DONE (never run, never asked again) even after the
    lease would have lapsed, and it is neither in doubt nor settleable."""
    await claim(store, "a")
    refused = await store.request_approval(KEY, owner="b", attempt=1, request=request(clock))
    assert refused.state is CallState.CLAIMED and refused.approval is None
    asked = request(clock)
    record = await store.request_approval(KEY, owner="a", attempt=1, request=asked)
    assert record.lease_expires_at == pytest.approx(asked.expires_at)
    clock.advance(LEASE * 10)
    assert await claim(store, "b") is ClaimStatus.DONE
    assert await store.expired_claims() == []
    assert await store.settle(KEY, result=result()) is None
    found = await store.get_call(KEY, history=True)
    assert found is not None and found.state is CallState.AWAITING_APPROVAL
    assert found.approval == asked
    assert [e.kind for e in found.history] == ["claimed", "approval_requested"]
    assert "approval_id=apr_1" in found.history[1].detail


async def test_approve_is_taken_once_and_one_replica_runs_it(
    store_factory: StoreFactory, clock: FakeClock
) -> None:
    first, second = await store_factory(), await store_factory()
    await held(first, clock)
    clock.advance(5)
    approved = await second.decide_approval(
        KEY, approval_id="apr_1", decision="approved", by="alice", via="cli"
    )
    assert approved is not None and approved.state is CallState.APPROVED
    assert approved.approval is not None and approved.approval.decided_by == "alice"
    assert approved.approval.decided_at == pytest.approx(clock.now)
    for store, name in ((first, "bob"), (second, "carol")):
        again = await store.decide_approval(
            KEY, approval_id="apr_1", decision="approved", by=name, via="cli"
        )
        assert again is None
        assert (
            await store.decide_approval(
                KEY,
                approval_id="apr_1",
                decision="denied",
                by=name,
                via="cli",
                result=result("no", success=False),
            )
            is None
        )
    waiting = await first.approved_calls()
    assert [r.key for r in waiting] == [KEY]
    runs = [
        await first.claim_approved(KEY, owner="r1", lease_seconds=LEASE),
        await second.claim_approved(KEY, owner="r2", lease_seconds=LEASE),
    ]
    assert runs[0] is not None and runs[1] is None
    assert runs[0].state is CallState.CLAIMED and runs[0].attempt == 2
    assert runs[0].owner == "r1" and runs[0].approval == approved.approval
    assert await second.approved_calls() == []
    saved = await first.save_result(KEY, owner="r1", attempt=2, result=result("closed"))
    assert saved.state is CallState.SUCCEEDED
    record = await second.find_approval("apr_1")
    assert record is not None
    assert [e.kind for e in record.history] == [
        "claimed",
        "approval_requested",
        "approved",
        "claimed_approved",
        "saved",
    ]
    assert "by=alice" in record.history[2].detail and "via=cli" in record.history[2].detail


async def test_deny_saves_the_failure_and_expiry_needs_the_lapse(
    store: Store, clock: FakeClock
) -> None:
    """Deny needs the request open, expiry needs it lapsed; each saves the failure that is
    then submitted as any saved result; a decision names the request it decides."""
    await held(store, clock)
    wrong = await store.decide_approval(
        KEY, approval_id="apr_other", decision="approved", by="x", via="cli"
    )
    assert wrong is None
    early = await store.decide_approval(
        KEY,
        approval_id="apr_1",
        decision="expired",
        by="nobody",
        via="expiry",
        result=result("late", success=False),
    )
    assert early is None
    assert await store.waiting_approvals(expired_by=clock.now) == []
    clock.advance(TIMEOUT)
    lapsed = await store.waiting_approvals(expired_by=clock.now)
    assert [r.key for r in lapsed] == [KEY]
    late = await store.decide_approval(
        KEY, approval_id="apr_1", decision="approved", by="x", via="cli"
    )
    assert late is None
    expired = await store.decide_approval(
        KEY,
        approval_id="apr_1",
        decision="expired",
        by="nobody",
        via="expiry",
        result=result("nobody approved it in time", success=False),
    )
    assert expired is not None and expired.state is CallState.FAILED
    assert expired.approval is not None and expired.approval.decision == "expired"
    due = await store.unsubmitted_results(due_before=clock.now)
    assert [r.key for r in due] == [KEY]
    await store.mark_submitted(KEY)
    final = await store.get_call(KEY)
    assert final is not None and final.state is CallState.SUBMITTED


async def test_denied_with_the_reason(store: Store, clock: FakeClock) -> None:
    await held(store, clock)
    denied = await store.decide_approval(
        KEY,
        approval_id="apr_1",
        decision="denied",
        by="bo",
        via="page",
        reason="has a balance",
        result=result("denied: has a balance", success=False),
    )
    assert denied is not None and denied.state is CallState.FAILED
    assert denied.result is not None and "has a balance" in denied.result.event_json
    assert denied.approval is not None and denied.approval.reason == "has a balance"
    assert await store.waiting_approvals() == []
    record = await store.get_call(KEY, history=True)
    assert record is not None and "reason=has a balance" in record.history[-1].detail


async def test_a_waiting_call_is_cancelled_and_then_refuses(store: Store, clock: FakeClock) -> None:
    """The turn ended while a person had not decided: the request leaves the list."""
    await held(store, clock)
    assert await store.cancel(KEY, owner="x", reason="turn cancelled", known_before=clock.now)
    assert await store.waiting_approvals() == []
    assert (
        await store.decide_approval(
            KEY, approval_id="apr_1", decision="approved", by="x", via="cli"
        )
        is None
    )
    found = await store.find_approval("apr_1")
    assert found is not None and found.state is CallState.CANCELLED


async def test_approvals_are_kept_apart_by_namespace(
    store_factory: StoreFactory, clock: FakeClock
) -> None:
    mine, theirs = await store_factory(), await store_factory(namespace="other")
    await held(mine, clock)
    assert await theirs.find_approval("apr_1") is None
    assert await theirs.waiting_approvals() == []
    assert (
        await theirs.decide_approval(
            KEY, approval_id="apr_1", decision="approved", by="x", via="cli"
        )
        is None
    )
    assert [r.key for r in await mine.waiting_approvals()] == [KEY]
    assert await mine.count_waiting_approvals() == 1
    assert await theirs.count_waiting_approvals() == 0
    stats = await mine.stats()
    assert stats.calls_by_state["awaiting_approval"] == 1
    assert (await theirs.stats()).calls_by_state["awaiting_approval"] == 0


async def test_a_pruned_call_takes_its_request_along(store: Store, clock: FakeClock) -> None:
    """Once the denied call is submitted and old, pruning removes it and its request id."""
    await held(store, clock)
    await store.decide_approval(
        KEY,
        approval_id="apr_1",
        decision="denied",
        by="x",
        via="cli",
        result=result("no", success=False),
    )
    await store.mark_submitted(KEY)
    clock.advance(10)
    assert await store.prune(deliveries_before=clock.now, calls_before=clock.now) == 1
    assert await store.find_approval("apr_1") is None


async def test_the_memory_store_copies_only_the_requests_it_lists(
    clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memory store's list of 20 out of 300 waiting copies out 20 records (the others
    are passed over, never copied and sorted); SQLite and PostgreSQL read their index in the
    list's order (tests/store/test_sqlite.py, test_postgres.py), Redis its sorted set."""
    from agentfn_asgi.store import memory

    store = memory.MemoryStore(clock=clock)
    await hold_for_approval(store, 300, expires_at=clock.now + TIMEOUT)
    copied = 0
    plain = memory._plain

    def counted(record: CallRecord) -> CallRecord:
        nonlocal copied
        copied += 1
        return plain(record)

    monkeypatch.setattr(memory, "_plain", counted)
    listed = await store.waiting_approvals(limit=20)
    assert [r.key.call_id for r in listed] == [f"c{i:05}" for i in range(20)]
    assert copied == 20
