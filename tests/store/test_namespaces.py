"""Namespaces isolate every key (issue 22), on every backend.

Two apps (two OpenAI projects) share one database, each in its own namespace. For each
keyed operation: namespace B, given the very key (call or delivery id) of a record that
namespace A holds, in a state where the operation would change it, changes nothing of A's
(record, history, deliveries, counts) and answers as for a key it has never seen. The same
key then lives two independent lives, one per namespace.

Each test runs in both directions of two pairs of namespaces: two projects, and the default
namespace ``""`` (an app without ``OPENAI_PROJECT_ID``, or a CLI run without it) beside a
project.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from agentfn_asgi.calls.records import CallKey, CallQuery, CallState, ClaimStatus, StoreStats
from agentfn_asgi.errors import StoreError
from agentfn_asgi.store import Store
from tests.store.conftest import KEY, LEASE, FakeClock, StoreFactory, result

pytestmark = pytest.mark.anyio

OTHER_KEY = CallKey("sess_1", "turn_1", "call_2")  # a second call in A's session


@dataclass
class Two:
    """Namespace ``a`` holds the records; ``b`` tries to touch them."""

    a: Store
    b: Store
    clock: FakeClock

    async def view_of_a(self) -> object:
        """Everything A can observe of its own records (at this instant)."""
        return (
            await self.a.get_call(KEY, history=True),
            await self.a.get_call(OTHER_KEY, history=True),
            await self.a.find_calls(KEY.call_id),
            await self.a.calls_for_session(KEY.session_id),
            await self.a.list_deliveries(limit=100),
            await self.a.stats(),
        )

    async def b_sees_nothing(self) -> None:
        """B's every read and count is empty: what it did made no record of A's visible."""
        assert await self.b.get_call(KEY) is None
        assert await self.b.get_call(KEY, history=True) is None
        assert await self.b.find_calls(KEY.call_id) == []
        assert await self.b.calls_for_session(KEY.session_id) == []
        assert await self.b.list_calls(CallQuery()) == []
        assert await self.b.list_deliveries() == []
        far = self.clock.now + 10 * LEASE
        assert await self.b.unsubmitted_results(due_before=far) == []
        assert await self.b.unresolved_deliveries(due_before=far) == []
        assert await self.b.expired_claims() == []
        assert _empty(await self.b.stats())


def _empty(stats: StoreStats) -> bool:
    return (
        stats.deliveries == stats.unresolved_deliveries == stats.in_doubt == 0
        and not any(stats.calls_by_state.values())
        and stats.oldest_pending_at is None
    )


@pytest.fixture(
    params=[("proj_a", "proj_b"), ("proj_b", "proj_a"), ("", "proj_a"), ("proj_a", "")],
    ids=["a-b", "b-a", "default-a", "a-default"],
)
async def two(request: pytest.FixtureRequest, store_factory: StoreFactory, clock: FakeClock) -> Two:
    a_namespace, b_namespace = request.param
    return Two(
        await store_factory(namespace=a_namespace),
        await store_factory(namespace=b_namespace),
        clock,
    )


async def claimed(two: Two, key: CallKey = KEY, owner: str = "replica-a") -> None:
    outcome = await two.a.claim_call(key, tool_name="lookup", owner=owner, lease_seconds=LEASE)
    assert outcome.status is ClaimStatus.CLAIMED


async def saved(two: Two, key: CallKey = KEY) -> None:
    await claimed(two, key)
    record = await two.a.save_result(key, owner="replica-a", attempt=1, result=result())
    assert record.state is CallState.SUCCEEDED


async def quarantined(two: Two) -> None:
    await claimed(two)
    await two.a.quarantine(KEY, owner="replica-a", attempt=1, reason="reconcile: unknown")
    record = await two.a.get_call(KEY)
    assert record is not None and record.state is CallState.QUARANTINED


async def in_doubt(two: Two) -> None:
    await claimed(two)
    two.clock.advance(LEASE + 1)
    assert [r.key for r in await two.a.expired_claims()] == [KEY]


# -- reads ---------------------------------------------------------------------------------


async def test_reads_in_b_never_return_a_records(two: Two) -> None:
    """get_call, find_calls, calls_for_session, every listing and count of B are empty
    while A holds a call in each state and a delivery."""
    await two.a.record_delivery("msg_1", KEY.session_id)
    await saved(two, OTHER_KEY)
    await in_doubt(two)
    await two.b_sees_nothing()


# -- deliveries ----------------------------------------------------------------------------


async def test_record_delivery_in_b_is_new_and_leaves_a_delivery(two: Two) -> None:
    """B records a delivery id A has: new for B (True), then a repeat for B (False); A's
    delivery is unchanged and A still dedupes against it."""
    assert await two.a.record_delivery("msg_1", "sess_a", nonce="n1") is True
    before = await two.view_of_a()
    assert await two.b.record_delivery("msg_1", "sess_b") is True
    assert await two.b.record_delivery("msg_1", "sess_b") is False
    assert await two.view_of_a() == before
    assert await two.a.record_delivery("msg_1", "sess_a") is False
    assert [(d.delivery_id, d.session_id) for d in await two.b.list_deliveries()] == [
        ("msg_1", "sess_b")
    ]


async def test_record_delivery_in_b_with_a_nonce_is_its_own(two: Two) -> None:
    """A nonce is no way into another namespace: B's repeat with A's nonce is new for B
    once, then B's own record decides."""
    assert await two.a.record_delivery("msg_1", "sess_a", nonce="n1") is True
    before = await two.view_of_a()
    assert await two.b.record_delivery("msg_1", "sess_b", nonce="n1") is True
    assert await two.b.record_delivery("msg_1", "sess_b", nonce="n1") is True  # its own
    assert await two.b.record_delivery("msg_1", "sess_b", nonce="n2") is False
    assert await two.view_of_a() == before


async def test_mark_delivery_resolved_in_b_leaves_a_delivery(two: Two) -> None:
    await two.a.record_delivery("msg_1", "sess_a")
    before = await two.view_of_a()
    await two.b.mark_delivery_resolved("msg_1")
    assert await two.view_of_a() == before
    due = await two.a.unresolved_deliveries(due_before=two.clock.now)
    assert [d.delivery_id for d in due] == ["msg_1"]


async def test_delivery_failed_in_b_leaves_a_delivery(two: Two) -> None:
    await two.a.record_delivery("msg_1", "sess_a")
    before = await two.view_of_a()
    await two.b.delivery_failed("msg_1", error="boom", retry_at=two.clock.now + 60)
    assert await two.view_of_a() == before
    due = await two.a.unresolved_deliveries(due_before=two.clock.now)
    assert [(d.delivery_id, d.attempts) for d in due] == [("msg_1", 0)]


# -- claims --------------------------------------------------------------------------------


async def test_claim_in_b_creates_b_own_record(two: Two) -> None:
    """B claims the key of A's live claim: B's own new record (CLAIMED, attempt 1), not
    BUSY; A's claim is unchanged."""
    await claimed(two)
    before = await two.view_of_a()
    outcome = await two.b.claim_call(KEY, tool_name="lookup", owner="replica-b", lease_seconds=5)
    assert outcome.status is ClaimStatus.CLAIMED
    assert (outcome.record.attempt, outcome.record.owner) == (1, "replica-b")
    assert await two.view_of_a() == before


async def test_claim_in_b_never_takes_over_a_expired_claim(two: Two) -> None:
    """A's lease ran out: B's claim is still a new record of B's (CLAIMED, not IN_DOUBT),
    and A's in-doubt call stays A's (attempt 1, owner a)."""
    await in_doubt(two)
    before = await two.view_of_a()
    outcome = await two.b.claim_call(KEY, tool_name="lookup", owner="replica-b", lease_seconds=5)
    assert (outcome.status, outcome.record.attempt) == (ClaimStatus.CLAIMED, 1)
    assert await two.view_of_a() == before


async def test_claim_in_b_of_a_saved_or_finished_call_is_new(two: Two) -> None:
    """A saved or submitted call is no SAVED/DONE answer in B: B claims its own."""
    await saved(two)
    await saved(two, OTHER_KEY)
    await two.a.mark_submitted(OTHER_KEY)
    before = await two.view_of_a()
    for key in (KEY, OTHER_KEY):
        outcome = await two.b.claim_call(key, tool_name="x", owner="replica-b", lease_seconds=5)
        assert (outcome.status, outcome.record.attempt) == (ClaimStatus.CLAIMED, 1)
    assert await two.view_of_a() == before


async def test_renew_lease_in_b_is_refused_and_leaves_a_lease(two: Two) -> None:
    await claimed(two)
    two.clock.advance(1)
    before = await two.view_of_a()
    renewed = await two.b.renew_lease(KEY, owner="replica-a", attempt=1, lease_seconds=3600)
    assert renewed is False
    assert await two.view_of_a() == before


# -- results -------------------------------------------------------------------------------


async def test_save_result_in_b_raises_and_leaves_a_claim(two: Two) -> None:
    """Saving for A's (owner, attempt) through B: a call B never claimed (StoreError)."""
    await claimed(two)
    before = await two.view_of_a()
    with pytest.raises(StoreError):
        await two.b.save_result(KEY, owner="replica-a", attempt=1, result=result("from b"))
    assert await two.view_of_a() == before


async def test_mark_submitted_in_b_leaves_a_saved_result(two: Two) -> None:
    await saved(two)
    before = await two.view_of_a()
    await two.b.mark_submitted(KEY, detail="200")
    assert await two.view_of_a() == before
    owed = await two.a.unsubmitted_results(due_before=two.clock.now)
    assert [r.key for r in owed] == [KEY]


async def test_submission_failed_in_b_leaves_a_saved_result(two: Two) -> None:
    await saved(two)
    before = await two.view_of_a()
    await two.b.submission_failed(KEY, detail="404", retry_at=two.clock.now + 60)
    assert await two.view_of_a() == before
    owed = await two.a.unsubmitted_results(due_before=two.clock.now)
    assert [(r.key, r.failures) for r in owed] == [(KEY, 0)]


@pytest.mark.parametrize("unchanged_since", [None, "now"])
async def test_mark_stale_in_b_leaves_a_call(two: Two, unchanged_since: str | None) -> None:
    """Neither a claimed nor a saved call of A's is marked stale through B (with or without
    ``unchanged_since``): A's session would wait for it forever."""
    await claimed(two)
    await saved(two, OTHER_KEY)
    two.clock.advance(1)
    since = None if unchanged_since is None else two.clock.now
    before = await two.view_of_a()
    await two.b.mark_stale(KEY, unchanged_since=since)
    await two.b.mark_stale(OTHER_KEY, unchanged_since=since)
    assert await two.view_of_a() == before


# -- operators and fencing -----------------------------------------------------------------


async def test_quarantine_in_b_leaves_a_claim(two: Two) -> None:
    await claimed(two)
    before = await two.view_of_a()
    await two.b.quarantine(KEY, owner="replica-a", attempt=1, reason="from b")
    assert await two.view_of_a() == before


@pytest.mark.parametrize("held", ["quarantined", "in_doubt"])
async def test_settle_in_b_is_none_and_leaves_a_call(two: Two, held: str) -> None:
    await (quarantined(two) if held == "quarantined" else in_doubt(two))
    before = await two.view_of_a()
    assert await two.b.settle(KEY, result=result("from b")) is None
    assert await two.view_of_a() == before


@pytest.mark.parametrize("held", ["quarantined", "in_doubt"])
async def test_release_in_b_is_none_and_leaves_a_call(two: Two, held: str) -> None:
    await (quarantined(two) if held == "quarantined" else in_doubt(two))
    before = await two.view_of_a()
    assert await two.b.release(KEY, owner="replica-b", lease_seconds=LEASE) is None
    assert await two.view_of_a() == before


# -- retention -----------------------------------------------------------------------------


async def test_prune_in_b_removes_nothing_of_a(two: Two) -> None:
    """A's old delivery and submitted and stale calls are A's to prune: B removes 0."""
    await two.a.record_delivery("msg_1", "sess_a")
    await saved(two)
    await two.a.mark_submitted(KEY)
    await claimed(two, OTHER_KEY)
    await two.a.cancel(OTHER_KEY, owner="a", reason="gone", known_before=two.clock.now)
    two.clock.advance(3600)
    before = await two.view_of_a()
    later = two.clock.now + 1
    assert await two.b.prune(deliveries_before=later, calls_before=later) == 0
    assert await two.view_of_a() == before
    assert await two.a.prune(deliveries_before=later, calls_before=later) == 3


# -- the same key, two lives ----------------------------------------------------------------


async def test_the_same_keys_live_independently_in_each_namespace(two: Two) -> None:
    """A and B each claim, save, submit, refuse, quarantine, settle and release the same
    keys: every step is seen only in its own namespace."""
    assert await two.a.record_delivery("msg_1", "sess_a") is True
    assert await two.b.record_delivery("msg_1", "sess_b") is True
    await two.b.mark_delivery_resolved("msg_1")
    assert [d.resolved for d in await two.a.list_deliveries()] == [False]
    assert [d.resolved for d in await two.b.list_deliveries()] == [True]

    await claimed(two)  # A: KEY claimed by replica-a
    b_claim = await two.b.claim_call(KEY, tool_name="lookup", owner="replica-b", lease_seconds=5)
    assert b_claim.status is ClaimStatus.CLAIMED
    saved_b = await two.b.save_result(KEY, owner="replica-b", attempt=1, result=result("b"))
    assert saved_b.state is CallState.SUCCEEDED
    await two.b.mark_submitted(KEY)
    a_record = await two.a.get_call(KEY)
    assert a_record is not None and (a_record.state, a_record.owner) == (
        CallState.CLAIMED,
        "replica-a",
    )
    saved_a = await two.a.save_result(KEY, owner="replica-a", attempt=1, result=result("a"))
    assert saved_a.result is not None and saved_a.result.event_json == result("a").event_json
    b_record = await two.b.get_call(KEY, history=True)
    assert b_record is not None and b_record.state is CallState.SUBMITTED
    assert b_record.result == result("b")
    assert [e.kind for e in b_record.history] == ["claimed", "saved", "submitted"]

    # OTHER_KEY: quarantined in A, in doubt in B; each operator acts on their own.
    await claimed(two, OTHER_KEY)
    await two.a.quarantine(OTHER_KEY, owner="replica-a", attempt=1, reason="hold")
    await two.b.claim_call(OTHER_KEY, tool_name="lookup", owner="replica-b", lease_seconds=5)
    two.clock.advance(6)
    released = await two.b.release(OTHER_KEY, owner="operator-b", lease_seconds=LEASE)
    assert released is not None and (released.attempt, released.owner) == (2, "operator-b")
    settled = await two.a.settle(OTHER_KEY, result=result("settled"))
    assert settled is not None and settled.attempt == 1
    a_other = await two.a.get_call(OTHER_KEY, history=True)
    b_other = await two.b.get_call(OTHER_KEY, history=True)
    assert a_other is not None and b_other is not None
    assert [e.kind for e in a_other.history] == ["claimed", "quarantined", "settled"]
    assert [e.kind for e in b_other.history] == ["claimed", "released"]
    assert (await two.a.stats()).calls_by_state == {
        **{state.value: 0 for state in CallState},
        "succeeded": 2,
    }
    assert (await two.b.stats()).calls_by_state == {
        **{state.value: 0 for state in CallState},
        "submitted": 1,
        "claimed": 1,
    }
