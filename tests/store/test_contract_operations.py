"""The store contract, part three: history, operator queries, settling, retry backoff,
retried writes and namespaces, on every backend (issues 14 and 16)."""

from __future__ import annotations

import pytest

from agentfn_asgi.calls.records import CallKey, CallQuery, CallState, ClaimStatus
from agentfn_asgi.store import Store

from ..support.clock import FakeClock
from .conftest import KEY, LEASE, StoreFactory, claim, result

pytestmark = pytest.mark.anyio


# -- history -------------------------------------------------------------------------------


async def test_every_step_lands_in_the_history(store: Store, clock: FakeClock) -> None:
    """Claim, takeover, save (with its duration), failed and good submissions, in order,
    each with its attempt and owner where one acted; none of it content."""
    t0 = clock.now
    await claim(store, "a")
    clock.advance(LEASE + 1)
    assert await claim(store, "b") is ClaimStatus.IN_DOUBT
    clock.advance(1)
    await store.save_result(
        KEY, owner="b", attempt=2, result=result("secret output"), duration=0.25
    )
    clock.advance(1)
    await store.submission_failed(KEY, detail="HTTP 503 server_error", retry_at=clock.now + 30)
    clock.advance(31)
    await store.mark_submitted(KEY)
    plain = await store.get_call(KEY)
    assert plain is not None and plain.history == ()
    record = await store.get_call(KEY, history=True)
    assert record is not None
    events = [(e.kind, e.attempt, e.owner) for e in record.history]
    assert events == [
        ("claimed", 1, "a"),
        ("taken_over", 2, "b"),
        ("saved", 2, "b"),
        ("submit_failed", 2, None),
        ("submitted", 2, None),
    ]
    assert [e.at for e in record.history] == pytest.approx(
        [t0, t0 + LEASE + 1, t0 + LEASE + 2, t0 + LEASE + 3, t0 + LEASE + 34]
    )
    saved = record.history[2].detail
    assert "source=ran" in saved and "duration=0.250s" in saved
    assert record.history[3].detail == "HTTP 503 server_error"
    assert all("secret output" not in e.detail for e in record.history)
    assert record.failures == 1


async def test_cancel_and_quarantine_are_in_the_history(store: Store, clock: FakeClock) -> None:
    """A quarantine and a cancellation keep their reason in the history too."""
    other = CallKey("sess_1", "turn_1", "call_2")
    await claim(store, "a")
    await claim(store, "a", other)
    await store.quarantine(KEY, owner="a", attempt=1, reason="reconcile said unknown")
    await store.cancel(other, owner="b", reason="the turn was cancelled", known_before=clock.now)
    held = await store.get_call(KEY, history=True)
    gone = await store.get_call(other, history=True)
    assert held is not None and gone is not None
    assert [(e.kind, e.detail) for e in held.history][-1] == (
        "quarantined",
        "reconcile said unknown",
    )
    assert [(e.kind, e.owner, e.detail) for e in gone.history][1:] == [
        ("cancelled", "b", "the turn was cancelled")
    ]
    assert gone.state is CallState.CANCELLED and gone.reason == "the turn was cancelled"


# -- fencing and retried writes -------------------------------------------------------------


async def test_a_delivery_recorded_again_with_its_nonce_is_new_again(store: Store) -> None:
    """Our own retried write (same nonce) is recognised as new; anyone else's is a duplicate."""
    assert await store.record_delivery("msg_1", "s", nonce="n1") is True
    assert await store.record_delivery("msg_1", "s", nonce="n1") is True
    assert await store.record_delivery("msg_1", "s", nonce="n2") is False
    assert await store.record_delivery("msg_1", "s") is False
    assert await store.record_delivery("msg_2", "s") is True
    assert await store.record_delivery("msg_2", "s") is False


async def test_stale_is_conditional_on_what_was_read(store: Store, clock: FakeClock) -> None:
    """mark_stale with unchanged_since leaves a record updated after that time alone: a
    result another replica saved after the caller's session read stands."""
    await claim(store, "a")
    read_at = clock.now
    clock.advance(2)
    await store.save_result(KEY, owner="a", attempt=1, result=result())
    await store.mark_stale(KEY, unchanged_since=read_at)
    record = await store.get_call(KEY)
    assert record is not None and record.state is CallState.SUCCEEDED
    await store.mark_stale(KEY, unchanged_since=clock.now)
    record = await store.get_call(KEY)
    assert record is not None and record.state is CallState.STALE


async def test_quarantined_calls_are_never_pruned(store: Store, clock: FakeClock) -> None:
    """A call held for an operator outlives any retention (it waits for a person)."""
    await claim(store, "a")
    await store.quarantine(KEY, owner="a", attempt=1, reason="held")
    clock.advance(10**7)
    await store.prune(deliveries_before=clock.now, calls_before=clock.now)
    record = await store.get_call(KEY)
    assert record is not None and record.state is CallState.QUARANTINED


# -- retry backoff --------------------------------------------------------------------------


async def test_failed_deliveries_wait_their_turn(store: Store, clock: FakeClock) -> None:
    """A delivery whose resolve failed is counted, keeps its error, and is due again only at
    its retry time: fresh deliveries come first. The cursor pages through the rest."""
    t0 = clock.now
    for n in range(3):
        await store.record_delivery(f"bad_{n}", f"s{n}")
    clock.advance(1)
    for n in range(3):
        await store.delivery_failed(f"bad_{n}", error="HTTP 403", retry_at=clock.now + 60)
    await store.record_delivery("good", "s9")
    due = await store.unresolved_deliveries(due_before=clock.now)
    assert [d.delivery_id for d in due] == ["good"]
    clock.advance(60)
    due = await store.unresolved_deliveries(due_before=clock.now)
    assert [d.delivery_id for d in due] == ["good", "bad_0", "bad_1", "bad_2"]
    bad = due[1]
    assert (bad.attempts, bad.last_error) == (1, "HTTP 403")
    assert bad.next_attempt_at == pytest.approx(t0 + 61)
    first = await store.unresolved_deliveries(due_before=clock.now, limit=2)
    after = (first[-1].next_attempt_at, first[-1].delivery_id)
    rest = await store.unresolved_deliveries(due_before=clock.now, after=after)
    assert [d.delivery_id for d in first + rest] == ["good", "bad_0", "bad_1", "bad_2"]
    stats = await store.stats()
    assert stats.failing_deliveries == 3
    await store.mark_delivery_resolved("bad_0")
    await store.delivery_failed("bad_0", error="late", retry_at=0)  # resolved: unchanged
    listed = await store.list_deliveries(unresolved_only=True)
    assert [d.delivery_id for d in listed] == ["good", "bad_2", "bad_1"]
    assert len(await store.list_deliveries()) == 4


async def test_failed_submissions_wait_their_turn(store: Store, clock: FakeClock) -> None:
    """A saved result whose submission failed is due again at its retry time; the cursor
    pages by (next_attempt_at, key)."""
    keys = [CallKey("s", "t", f"c{i}") for i in range(3)]
    for key in keys:
        await claim(store, "a", key)
        await store.save_result(key, owner="a", attempt=1, result=result())
    await store.submission_failed(keys[0], detail="HTTP 500", retry_at=clock.now + 100)
    due = await store.unsubmitted_results(due_before=clock.now)
    assert [r.key for r in due] == keys[1:]
    clock.advance(100)
    due = await store.unsubmitted_results(due_before=clock.now)
    assert [r.key for r in due] == [keys[1], keys[2], keys[0]]
    page = await store.unsubmitted_results(due_before=clock.now, limit=1)
    rest = await store.unsubmitted_results(
        due_before=clock.now, after=(page[0].next_attempt_at, page[0].key)
    )
    assert [r.key for r in page + rest] == [keys[1], keys[2], keys[0]]
    assert due[2].failures == 1


# -- operators: finding, listing, settling --------------------------------------------------


async def _some_calls(store: Store, clock: FakeClock) -> dict[str, CallKey]:
    keys = {
        "running": CallKey("s1", "t1", "c_run"),
        "doubt": CallKey("s1", "t1", "c_doubt"),
        "held": CallKey("s2", "t1", "c_held"),
        "ok": CallKey("s2", "t1", "c_ok"),
        "bad": CallKey("s3", "t1", "c_bad"),
    }
    await claim(store, "a", keys["doubt"])
    clock.advance(1)
    await store.claim_call(keys["held"], tool_name="refund", owner="a", lease_seconds=LEASE)
    await store.quarantine(keys["held"], owner="a", attempt=1, reason="unknown")
    clock.advance(1)
    await claim(store, "a", keys["ok"])
    await store.save_result(keys["ok"], owner="a", attempt=1, result=result())
    await store.mark_submitted(keys["ok"])
    clock.advance(1)
    await claim(store, "a", keys["bad"])
    await store.save_result(keys["bad"], owner="a", attempt=1, result=result(success=False))
    await store.mark_submitted(keys["bad"])
    clock.advance(LEASE)  # the first claim runs out: in doubt
    await claim(store, "a", keys["running"])
    return keys


async def test_listing_calls_filters_and_pages(store: Store, clock: FakeClock) -> None:
    """list_calls: newest first; by state (in_doubt included), session, tool, since; pages
    continue after the last call of the previous one."""
    keys = await _some_calls(store, clock)
    every = await store.list_calls(CallQuery())
    assert [r.key for r in every] == [
        keys["running"],
        keys["bad"],
        keys["ok"],
        keys["held"],
        keys["doubt"],
    ]

    async def listed(**filters: object) -> list[CallKey]:
        return [r.key for r in await store.list_calls(CallQuery(**filters))]  # type: ignore[arg-type]

    assert await listed(state="in_doubt") == [keys["doubt"]]
    assert await listed(state="claimed") == [keys["running"], keys["doubt"]]
    assert await listed(state="quarantined") == [keys["held"]]
    assert await listed(session_id="s2") == [keys["ok"], keys["held"]]
    assert await listed(tool_name="refund") == [keys["held"]]
    assert await listed(since=every[2].created_at) == [keys["running"], keys["bad"], keys["ok"]]
    first = await store.list_calls(CallQuery(limit=2))
    last = first[-1]
    position = (last.created_at, *_parts(last.key))
    rest = await store.list_calls(CallQuery(before=position))
    assert [r.key for r in first + rest] == [r.key for r in every]
    assert await listed(limit=0) == []


def _parts(key: CallKey) -> tuple[str, str, str]:
    return (key.session_id, key.turn_id, key.call_id)


async def test_find_calls_by_call_id_across_sessions(store: Store) -> None:
    """find_calls: every session's call with that id, each with its history."""
    await claim(store, "a", CallKey("s1", "t", "shared"))
    await claim(store, "a", CallKey("s2", "t", "shared"))
    await claim(store, "a", CallKey("s1", "t", "other"))
    found = await store.find_calls("shared")
    assert sorted(r.key.session_id for r in found) == ["s1", "s2"]
    assert all([e.kind for e in r.history] == ["claimed"] for r in found)
    assert await store.find_calls("nothing") == []


async def test_stats_count_successes_failures_and_doubt(store: Store, clock: FakeClock) -> None:
    """stats: submitted results counted by outcome; in doubt counted apart."""
    await _some_calls(store, clock)
    stats = await store.stats()
    assert (stats.successes, stats.failures, stats.in_doubt) == (1, 1, 1)
    assert stats.calls_by_state["quarantined"] == 1


async def test_settling_takes_held_and_in_doubt_calls_only(store: Store, clock: FakeClock) -> None:
    """An operator's result is saved for a quarantined or an in-doubt call (settled in its
    history, then submitted as usual); a running, saved or submitted call is refused (None)."""
    keys = await _some_calls(store, clock)
    mine = result("operator says yes", key="op-1")
    for name in ("running", "ok", "bad"):
        assert await store.settle(keys[name], result=mine) is None
    assert await store.settle(CallKey("x", "y", "z"), result=mine) is None
    held = await store.settle(keys["held"], result=mine)
    assert held is not None
    assert (held.state, held.result, held.reason) == (CallState.SUCCEEDED, mine, None)
    doubt = await store.settle(keys["doubt"], result=result("no", success=False, key="op-2"))
    assert doubt is not None and doubt.state is CallState.FAILED
    assert await store.settle(keys["held"], result=mine) is None  # saved now
    record = await store.get_call(keys["held"], history=True)
    assert record is not None and record.history[-1].kind == "settled"
    assert await claim(store, "b", keys["held"]) is ClaimStatus.SAVED


async def test_a_margin_keeps_a_recently_expired_call_out_of_settling(
    store: Store, clock: FakeClock
) -> None:
    """An in-doubt call is settled only once its lease expired more than the margin ago."""
    await claim(store, "a")
    clock.advance(LEASE + 2)
    assert await store.settle(KEY, result=result(), margin=5.0) is None
    assert await store.release(KEY, owner="op", lease_seconds=LEASE, margin=5.0) is None
    clock.advance(4)
    assert await store.settle(KEY, result=result(), margin=5.0) is not None


async def test_releasing_claims_for_a_rerun(store: Store, clock: FakeClock) -> None:
    """release: a held call is claimed by the operator's owner with the next attempt, so the
    re-run's save is fenced like any other; a running call is refused."""
    keys = await _some_calls(store, clock)
    assert await store.release(keys["running"], owner="op", lease_seconds=LEASE) is None
    released = await store.release(keys["held"], owner="op", lease_seconds=LEASE)
    assert released is not None
    assert (released.state, released.owner, released.attempt) == (CallState.CLAIMED, "op", 2)
    assert released.reason is None
    late = await store.save_result(keys["held"], owner="a", attempt=1, result=result())
    assert late.result is None
    saved = await store.save_result(keys["held"], owner="op", attempt=2, result=result())
    assert saved.state is CallState.SUCCEEDED
    record = await store.get_call(keys["held"], history=True)
    assert record is not None
    assert [e.kind for e in record.history][-2:] == ["released", "saved"]


# -- namespaces -----------------------------------------------------------------------------


async def test_namespaces_share_a_store_without_seeing_each_other(
    store_factory: StoreFactory, clock: FakeClock
) -> None:
    """Two apps (two OpenAI projects) on one store: each sweeps, lists and counts only its
    own deliveries and calls; a delivery id is deduplicated within its namespace only (a
    delivery of one project never hides the other's)."""
    one = await store_factory(namespace="proj_1")
    two = await store_factory(namespace="proj_2")
    assert await one.record_delivery("msg_1", "s1") is True
    assert await two.record_delivery("msg_2", "s2") is True
    assert await two.record_delivery("msg_1", "s1") is True
    assert await two.record_delivery("msg_1", "s1") is False
    await two.mark_delivery_resolved("msg_1")
    await one.claim_call(KEY, tool_name="t", owner="a", lease_seconds=LEASE)
    other = CallKey("s2", "t", "c")
    await two.claim_call(other, tool_name="t", owner="b", lease_seconds=LEASE)
    await two.save_result(other, owner="b", attempt=1, result=result())
    clock.advance(LEASE + 1)
    assert [d.delivery_id for d in await one.unresolved_deliveries(due_before=clock.now)] == [
        "msg_1"
    ]
    assert [r.key for r in await one.expired_claims()] == [KEY]
    assert await two.expired_claims() == []
    assert await one.unsubmitted_results(due_before=clock.now) == []
    assert [r.key for r in await two.unsubmitted_results(due_before=clock.now)] == [other]
    assert [r.key for r in await one.list_calls(CallQuery())] == [KEY]
    assert (await one.stats()).calls_by_state["claimed"] == 1
    assert (await two.stats()).calls_by_state["claimed"] == 0
    assert [d.delivery_id for d in await two.list_deliveries()] == ["msg_2", "msg_1"]
    assert [d.delivery_id for d in await one.list_deliveries()] == ["msg_1"]
    await one.prune(deliveries_before=clock.now + 1, calls_before=clock.now + 1)
    assert [d.delivery_id for d in await two.list_deliveries()] == ["msg_2", "msg_1"]


async def test_a_claim_retried_by_its_holder_changes_nothing(
    store: Store, clock: FakeClock
) -> None:
    """Our own claim, retried after its answer was lost, is the same claim: its lease, its
    last change and its delivery stay as the first claim left them (the state table's
    ``reclaim`` row keeps the record; found by the generated histories on SQL)."""
    first = await store.claim_call(KEY, tool_name="t", owner="a", lease_seconds=LEASE)
    clock.advance(1)
    again = await store.claim_call(
        KEY, tool_name="t", owner="a", lease_seconds=LEASE * 3, delivery_id="d1"
    )
    assert again.status is ClaimStatus.CLAIMED
    record = await store.get_call(KEY)
    assert record is not None
    assert (record.lease_expires_at, record.updated_at, record.delivery_id) == (
        first.record.lease_expires_at,
        first.record.updated_at,
        None,
    )


# -- actions nobody here answers (issue 34) ---------------------------------------------------


async def test_an_unanswered_action_is_kept_with_its_age_and_taken_up_later(
    store: Store, clock: FakeClock
) -> None:
    """Claimed then left, a call is ``unanswered`` (its history says why), listed by state,
    counted, and a claim finds it ``DONE``; taking it up makes it a fresh attempt, first
    claimed now; only the holder leaves it."""
    t0 = clock.now
    await claim(store, "a")
    assert not await store.leave(KEY, owner="b", attempt=1, reason="no actions= policy")
    assert await store.leave(KEY, owner="a", attempt=1, reason="no actions= policy")
    clock.advance(5)
    outcome = await store.claim_call(KEY, tool_name="mcp:crm", owner="b", lease_seconds=LEASE)
    assert outcome.status is ClaimStatus.DONE and outcome.record.state is CallState.UNANSWERED
    [listed] = await store.list_calls(CallQuery(state="unanswered"))
    assert listed.key == KEY and listed.created_at == pytest.approx(t0)
    stats = await store.stats()
    assert stats.calls_by_state["unanswered"] == 1
    taken = await store.take_up(KEY, owner="b", lease_seconds=LEASE, nonce="n1")
    assert taken is not None and taken.state is CallState.CLAIMED
    assert (taken.attempt, taken.owner) == (2, "b")
    assert taken.created_at == pytest.approx(t0 + 5)
    assert await store.take_up(KEY, owner="c", lease_seconds=LEASE) is None
    record = await store.get_call(KEY, history=True)
    assert record is not None
    assert [(e.kind, e.detail) for e in record.history][1:] == [
        ("unanswered", "no actions= policy"),
        ("taken_up", ""),
    ]


async def test_an_unanswered_action_no_longer_listed_goes_stale_or_is_cancelled(
    store: Store, clock: FakeClock
) -> None:
    """A read that no longer lists it: ``stale`` (answered elsewhere) or ``cancelled`` (its
    turn ended); never when it was first claimed after the read."""
    other = CallKey("sess_1", "turn_1", "call_2")
    for key in (KEY, other):
        await claim(store, "a", key)
        assert await store.leave(key, owner="a", attempt=1, reason="left")
    await store.mark_stale(KEY, unchanged_since=clock.now - 1)
    assert (await store.get_call(KEY)).state is CallState.UNANSWERED  # type: ignore[union-attr]
    await store.mark_stale(KEY, unchanged_since=clock.now)
    assert (await store.get_call(KEY)).state is CallState.STALE  # type: ignore[union-attr]
    assert await store.cancel(other, owner="a", reason="the turn ended", known_before=clock.now)
    assert (await store.get_call(other)).state is CallState.CANCELLED  # type: ignore[union-attr]


async def test_a_turnless_action_retires_and_its_next_occurrence_takes_it_up(
    store: Store, clock: FakeClock
) -> None:
    """An environment connection's record retires once no longer listed (first claimed
    before the read, whatever it was doing: finished, unanswered, its hook still running),
    and is taken up by its next occurrence."""
    key = CallKey("sess_1", "", "environment:env_1")
    await claim(store, "a", key)
    await store.save_result(key, owner="a", attempt=1, result=result())
    await store.mark_submitted(key)
    assert not await store.retire(key, known_before=clock.now - 1)
    assert await store.retire(key, known_before=clock.now)
    assert (await store.get_call(key)).state is CallState.RETIRED  # type: ignore[union-attr]
    outcome = await store.claim_call(
        key, tool_name="environment:env_1", owner="b", lease_seconds=LEASE
    )
    assert outcome.status is ClaimStatus.DONE
    clock.advance(1)
    taken = await store.take_up(key, owner="b", lease_seconds=LEASE)
    assert taken is not None and (taken.state, taken.attempt) == (CallState.CLAIMED, 2)
    assert not await store.retire(key, known_before=clock.now - 1)  # taken up after the read
    assert await store.retire(key, known_before=clock.now)  # its hook running: retired too
    assert (await store.get_call(key)).state is CallState.RETIRED  # type: ignore[union-attr]
