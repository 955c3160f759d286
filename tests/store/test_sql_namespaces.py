"""Namespaces isolate every key on SQLite and PostgreSQL (issue 22).

Namespace A holds a call in each state that a keyed operation acts on and a delivery; a
store of namespace B, on the same database, runs every keyed operation on the same keys
with the same owners and attempts. A's records must come out byte for byte as they were, and
B's operations act on B's own records only (a claim in B of A's key is B's first attempt).
A static test checks that every statement names the namespace.
"""

from __future__ import annotations

import re

import pytest

from agentfn_asgi.calls.records import CallKey, CallQuery, CallRecord, CallState, ClaimStatus
from agentfn_asgi.errors import StoreError
from agentfn_asgi.store import Store
from agentfn_asgi.store.sql import statements as statements
from agentfn_asgi.store.sql.statements import LIST_FILTERS, list_calls_statement

from .conftest import LEASE, FakeClock, StoreFactory, result

pytestmark = pytest.mark.anyio

# Only the SQL backends: the generic namespace suite covers every store.
SQL = pytest.mark.parametrize(
    "store_factory", ["sqlite", pytest.param("postgres", marks=pytest.mark.backends)], indirect=True
)

LIVE = CallKey("sess_a", "turn_1", "live")  # claimed by "a", lease running
SAVED = CallKey("sess_a", "turn_1", "saved")  # a result saved, not submitted
HELD = CallKey("sess_a", "turn_1", "held")  # quarantined
DOUBT = CallKey("sess_a", "turn_1", "doubt")  # claimed by "a", lease expired: in doubt
DONE = CallKey("sess_a", "turn_1", "done")  # submitted (prunable)
KEYS = (LIVE, SAVED, HELD, DOUBT, DONE)


async def fill_a(a: Store, clock: FakeClock) -> None:
    """A's records: one per state a keyed operation acts on, and two deliveries."""
    assert await a.record_delivery("msg_1", "sess_a") is True
    assert await a.record_delivery("msg_done", "sess_a") is True
    await a.mark_delivery_resolved("msg_done")
    await a.claim_call(DOUBT, tool_name="t", owner="a", lease_seconds=1.0)
    clock.advance(10)
    for key in (LIVE, SAVED, HELD, DONE):
        await a.claim_call(key, tool_name="t", owner="a", lease_seconds=LEASE)
    await a.save_result(SAVED, owner="a", attempt=1, result=result("a's"))
    await a.save_result(DONE, owner="a", attempt=1, result=result("a's"))
    await a.mark_submitted(DONE, detail="HTTP 202")
    await a.quarantine(HELD, owner="a", attempt=1, reason="a's reason")


async def snapshot(a: Store) -> dict[str, object]:
    """Everything A can observe of its own records."""
    calls: dict[CallKey, CallRecord | None] = {
        key: await a.get_call(key, history=True) for key in KEYS
    }
    return {
        "calls": calls,
        "session": await a.calls_for_session("sess_a"),
        "found": [await a.find_calls(key.call_id) for key in KEYS],
        "deliveries": await a.list_deliveries(limit=10),
        "stats": await a.stats(),
    }


@SQL
async def test_namespace_b_cannot_touch_namespace_a(
    store_factory: StoreFactory, clock: FakeClock
) -> None:
    """Every keyed operation of B, on A's keys, owners and attempts, leaves A's records
    exactly as they were and finds, changes or counts nothing of A's."""
    a = await store_factory(namespace="proj_a")
    b = await store_factory(namespace="proj_b")
    await fill_a(a, clock)
    before = await snapshot(a)

    # Reads, listings and counts in B find nothing of A's.
    for key in KEYS:
        assert await b.get_call(key) is None
        assert await b.get_call(key, history=True) is None
        assert await b.find_calls(key.call_id) == []
    assert await b.calls_for_session("sess_a") == []
    assert await b.list_calls(CallQuery()) == []
    assert await b.list_calls(CallQuery(state="in_doubt")) == []
    assert await b.expired_claims() == []
    assert await b.unsubmitted_results(due_before=clock.now + 1e6) == []
    assert await b.unresolved_deliveries(due_before=clock.now + 1e6) == []
    assert await b.list_deliveries() == []
    stats = await b.stats()
    assert (stats.deliveries, sum(stats.calls_by_state.values())) == (0, 0)

    # Writes in B to A's keys change nothing (and find no record to change).
    await b.mark_delivery_resolved("msg_1")
    await b.delivery_failed("msg_1", error="b's error", retry_at=clock.now + 99)
    assert await b.renew_lease(LIVE, owner="a", attempt=1, lease_seconds=LEASE) is False
    with pytest.raises(StoreError):
        await b.save_result(LIVE, owner="a", attempt=1, result=result("b's"))
    await b.quarantine(LIVE, owner="a", attempt=1, reason="b's reason")
    await b.mark_submitted(SAVED, detail="b's")
    await b.submission_failed(SAVED, detail="b's", retry_at=clock.now + 99)
    for key in (LIVE, SAVED, DOUBT):
        await b.mark_stale(key)
        await b.mark_stale(key, unchanged_since=clock.now + 1)
    for key in (HELD, DOUBT):
        assert await b.settle(key, result=result("b's")) is None
        assert await b.release(key, owner="b", lease_seconds=LEASE) is None
    assert await b.prune(deliveries_before=clock.now + 1e6, calls_before=clock.now + 1e6) == 0
    assert await snapshot(a) == before

    # B's delivery ids and calls are its own: the same ids are new to B.
    assert await b.record_delivery("msg_1", "sess_a") is True
    assert await b.record_delivery("msg_1", "sess_a") is False
    for key in KEYS:
        outcome = await b.claim_call(key, tool_name="t", owner="b", lease_seconds=LEASE)
        assert (outcome.status, outcome.record.attempt) == (ClaimStatus.CLAIMED, 1), key
        assert outcome.record.owner == "b"
    # ... and B's work on them never reaches A.
    await b.save_result(SAVED, owner="b", attempt=1, result=result("b's"))
    await b.mark_submitted(SAVED, detail="b's")
    await b.quarantine(HELD, owner="b", attempt=1, reason="b's reason")
    assert await b.settle(HELD, result=result("b's")) is not None
    await b.mark_stale(LIVE)
    assert await b.renew_lease(DOUBT, owner="b", attempt=1, lease_seconds=LEASE) is True
    await b.mark_delivery_resolved("msg_1")
    clock.advance(LEASE * 10)
    assert await b.release(DOUBT, owner="b2", lease_seconds=LEASE) is not None
    assert await b.prune(deliveries_before=clock.now, calls_before=clock.now) > 0
    after = await snapshot(a)
    assert after["calls"] == before["calls"]
    assert after["session"] == before["session"]
    assert after["deliveries"] == before["deliveries"]
    held = await a.get_call(HELD)
    assert held is not None and held.state is CallState.QUARANTINED
    # A's own operations still work on A's records.
    settled = await a.settle(HELD, result=result("a's"))
    assert settled is not None and settled.state is CallState.SUCCEEDED


@SQL
async def test_the_same_call_in_two_namespaces_is_two_records(
    store_factory: StoreFactory, clock: FakeClock
) -> None:
    """One key, two namespaces: two rows, each with its own state, attempt and history."""
    a = await store_factory(namespace="proj_a")
    b = await store_factory(namespace="")
    await a.claim_call(LIVE, tool_name="t", owner="a", lease_seconds=LEASE)
    await b.claim_call(LIVE, tool_name="t", owner="b", lease_seconds=LEASE)
    await a.save_result(LIVE, owner="a", attempt=1, result=result("a's"))
    mine, theirs = await a.get_call(LIVE, history=True), await b.get_call(LIVE, history=True)
    assert mine is not None and theirs is not None
    assert (mine.state, mine.owner) == (CallState.SUCCEEDED, "a")
    assert (theirs.state, theirs.owner) == (CallState.CLAIMED, "b")
    assert [e.kind for e in mine.history] == ["claimed", "saved"]
    assert [e.kind for e in theirs.history] == ["claimed"]


_TABLE = re.compile(r"\b(?:FROM|INTO|UPDATE)\s+\{p\}(calls|deliveries)\b")


def test_every_statement_names_the_namespace() -> None:
    """Each statement on the tables has ``namespace = :namespace`` in its condition, and the
    upserts' conflict targets lead with the namespace."""
    named = {name: getattr(statements, name) for name in statements.__all__}
    texts = {name: text for name, text in named.items() if isinstance(text, str)}
    texts.update(
        {f"list_calls({name})": list_calls_statement([name]) for name in LIST_FILTERS},
    )
    checked = 0
    for name, text in texts.items():
        if not _TABLE.search(text):
            continue
        checked += 1
        flat = " ".join(text.split())
        if flat.startswith("INSERT"):
            assert "ON CONFLICT (namespace, " in flat, name
            assert ":namespace" in flat, name
        else:
            assert "namespace = :namespace" in flat, name
    assert checked >= 25
