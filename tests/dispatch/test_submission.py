"""dispatch.submission: submitting a saved result, and what a refusal means for the call."""

from __future__ import annotations

import asyncio

import pytest

from agentfn_asgi.calls.records import CallKey, CallRecord, CallState
from agentfn_asgi.dispatch.submission import Submitter
from agentfn_asgi.errors import StoreError
from agentfn_asgi.results import (
    DEFAULT_SAFETY_MARGIN,
    TOOL_RESULT_LIMIT,
    batch_key,
    encode_result,
    events_body,
)
from agentfn_asgi.store.memory import MemoryStore
from agentfn_asgi.testing import FakeCall
from agentfn_asgi.tracing import Telemetry

from ..support.clock import FakeClock
from .conftest import API, saved

pytestmark = pytest.mark.anyio

GRACE = 60.0


def submitter(api: API, store: MemoryStore, clock: FakeClock) -> Submitter:
    return Submitter(
        api.client,
        store,
        Telemetry(),
        retry_delay=lambda failures: 5.0 * failures,
        not_found_grace=GRACE,
        not_found_pauses=(0.0,),
        clock=clock,
    )


async def test_a_saved_result_is_submitted_once_and_marked(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    key = api.one_call()
    record = await saved(store, key)
    assert await submitter(api, store, clock).submit(record) == "submitted"
    assert [(s.call_id, s.output) for s in api.fake.submissions] == [("c1", "value")]
    after = await store.get_call(key)
    assert after is not None and after.state is CallState.SUBMITTED
    # A settled record is not sent again.
    assert await submitter(api, store, clock).submit(after) == "skipped"


async def test_one_404_on_the_submission_keeps_the_result_for_the_sweep(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """Issue 22: one 404 on ``POST …/events`` while the session still waits for the call.
    Before: the call was marked stale at once and its result never sent (the session waited
    forever). Now: the result stays, with the sweep's backoff, and the retry delivers it."""
    key = api.one_call()
    record = await saved(store, key)
    parts = submitter(api, store, clock)
    api.fake.fail_next("submit", 1, 404)
    assert await parts.submit(record) == "failed"
    kept = await store.get_call(key)
    assert kept is not None and kept.state is CallState.SUCCEEDED
    assert kept.failures == 1 and kept.next_attempt_at == clock() + 5.0
    assert api.fake.submissions == []
    # The sweep's retry (the same bytes under the same key) is accepted.
    assert await parts.submit(kept) == "submitted"
    assert [s.call_id for s in api.fake.submissions] == ["c1"]


async def test_a_missing_session_gets_the_grace_then_the_call_is_stale(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """The session reads 404 too: inside ``not_found_grace`` (counted from the save) the
    result stays; once the session is still gone after it, the call becomes stale."""
    key = api.one_call()
    record = await saved(store, key)
    parts = submitter(api, store, clock)
    api.fake.delete_session(key.session_id)
    clock.advance(GRACE - 1)
    assert await parts.submit(record) == "failed"
    kept = await store.get_call(key)
    assert kept is not None and kept.state is CallState.SUCCEEDED
    clock.advance(1)
    assert await parts.submit(kept) == "stale"
    gone = await store.get_call(key)
    assert gone is not None and gone.state is CallState.STALE


async def test_a_404_for_a_call_the_session_no_longer_waits_for_is_stale_at_once(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """The grace is for a session the API cannot see; a session that is there and no longer
    waits for the call (its turn was cancelled) settles it at once."""
    key = api.one_call()
    record = await saved(store, key)
    api.fake.cancel_turn(key.session_id)
    api.fake.fail_next("submit", 1, 404)
    assert await submitter(api, store, clock).submit(record) == "stale"
    gone = await store.get_call(key)
    assert gone is not None and gone.state is CallState.STALE


async def test_the_registration_race_keeps_the_result(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """400 "Unknown pending tool call" for a call the session does list: resubmitted later."""
    key = api.one_call()
    record = await saved(store, key)
    parts = submitter(api, store, clock)
    api.fake.fail_next(
        "submit",
        10,
        400,
        body={"error": {"message": f"Unknown pending tool call: {key.call_id}", "type": "x"}},
    )
    assert await parts.submit(record) == "failed"
    api.fake.faults.failures["submit"].clear()
    kept = await store.get_call(key)
    assert kept is not None and await parts.submit(kept) == "submitted"


async def test_a_session_that_cannot_be_read_keeps_the_result(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """A 404 whose check read fails (the API down): nothing is decided, the sweep retries."""
    key = api.one_call()
    record = await saved(store, key)
    clock.advance(GRACE * 10)  # past the grace: only the read decides
    api.fake.fail_next("submit", 1, 404)
    api.fake.fail_next("retrieve", 10, 503)
    assert await submitter(api, store, clock).submit(record) == "failed"
    kept = await store.get_call(key)
    assert kept is not None and kept.state is CallState.SUCCEEDED


# -- results of one turn in one POST --------------------------------------------------------


def turn_of(api: API, n: int) -> list[CallKey]:
    """A session waiting for ``n`` calls of one turn; their keys."""
    calls = [FakeCall("lookup", {"key": str(i)}, call_id=f"c{i}") for i in range(n)]
    session_id = api.fake.create_session([calls])
    return [
        CallKey(session_id, action["turn_id"], action["call_id"])
        for action in api.fake.required_actions(session_id)
    ]


def posts(api: API) -> list[str | None]:
    """The idempotency key of each submission request the fake answered."""
    return [r.idempotency_key for r in api.fake.requests if r.route == "submit"]


async def submit_together(parts: Submitter, records: list[CallRecord]) -> list[object]:
    return await asyncio.gather(
        *(parts.submit(r, together=True) for r in records), return_exceptions=True
    )


async def test_results_ready_together_go_in_one_post_under_a_stable_key(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """Three results of one turn submitted in the same loop turn: one request, carrying
    the three events, under a key derived from theirs; each call is then marked."""
    keys = turn_of(api, 3)
    records = [await saved(store, key, output=f"v{i}") for i, key in enumerate(keys)]
    assert await submit_together(submitter(api, store, clock), records) == ["submitted"] * 3
    expected = batch_key([r.result.idempotency_key for r in records if r.result is not None])
    assert posts(api) == [expected]
    assert sorted((s.call_id, s.output) for s in api.fake.submissions) == [
        ("c0", "v0"),
        ("c1", "v1"),
        ("c2", "v2"),
    ]
    for key in keys:
        after = await store.get_call(key)
        assert after is not None and after.state is CallState.SUBMITTED


async def test_a_result_not_marked_together_goes_alone(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """Without ``together`` (no sibling running here) nothing waits: one POST per result."""
    keys = turn_of(api, 2)
    records = [await saved(store, key) for key in keys]
    parts = submitter(api, store, clock)
    await asyncio.gather(*(parts.submit(r) for r in records))
    assert sorted(posts(api), key=str) == sorted(
        (r.result.idempotency_key for r in records if r.result is not None), key=str
    )


class _MarksLost(MemoryStore):
    """A store whose marks fail: the process died between the POST and the marks."""

    async def mark_submitted(self, key: CallKey, *, detail: str = "") -> None:
        raise StoreError("the process died here")


async def test_a_crash_between_the_batch_and_its_marks_resubmits_the_same_batch(
    api: API, clock: FakeClock
) -> None:
    """The batch was accepted, the marks never written: the sweep's resubmission (here by
    another replica over the same store) sends the same events under the same key, and
    the API answers it as a replay: each result was accepted once."""
    keys = turn_of(api, 3)
    lost = _MarksLost(clock=clock)
    records = [await saved(lost, key) for key in keys]
    outcomes = await submit_together(submitter(api, lost, clock), records)
    assert all(isinstance(o, StoreError) for o in outcomes)
    # What was saved is all another replica finds: still to be submitted.
    store = MemoryStore(clock=clock)
    records = [await saved(store, key) for key in keys]
    assert await submit_together(submitter(api, store, clock), records) == ["submitted"] * 3
    first, again = posts(api)
    assert first == again and first is not None and first.startswith("afn-batch-")
    assert sorted(s.call_id for s in api.fake.submissions) == ["c0", "c1", "c2"]
    assert api.fake.duplicate_submissions == []


async def test_two_replicas_sending_the_same_batch_answer_each_call_once(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """Two replicas' sweeps resubmit the same saved results at once: the same body under
    the same key, so the API applies it once."""
    keys = turn_of(api, 4)
    records = [await saved(store, key) for key in keys]
    a, b = submitter(api, store, clock), submitter(api, store, clock)
    both = list(await asyncio.gather(submit_together(a, records), submit_together(b, records)))
    assert both == [["submitted"] * 4, ["submitted"] * 4]
    assert len(set(posts(api))) == 1
    assert sorted(s.call_id for s in api.fake.submissions) == ["c0", "c1", "c2", "c3"]
    assert api.fake.duplicate_submissions == []


async def test_a_refused_batch_falls_back_to_one_post_per_result(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """The API refuses the batch (a 400): each result goes alone under its own key, and
    one no longer pending (answered differently elsewhere: a 409 naming it) becomes stale
    without holding up the others."""
    keys = turn_of(api, 3)
    records = [await saved(store, key, output=f"v{i}") for i, key in enumerate(keys)]
    # Another answer for c1 was accepted meanwhile: the batch naming c1 is refused (409).
    other = encode_result(keys[1], "different", tool_name="lookup")
    await api.client.submit_raw_events(
        keys[1].session_id, events_body(other.event_json), idempotency_key="elsewhere"
    )
    outcomes = await submit_together(submitter(api, store, clock), records)
    assert outcomes == ["submitted", "stale", "submitted"]
    assert sorted((s.call_id, s.output) for s in api.fake.submissions) == [
        ("c0", "v0"),
        ("c1", "different"),
        ("c2", "v2"),
    ]
    own = {r.result.idempotency_key for r in records if r.result is not None}
    accepted = [s.idempotency_key for s in api.fake.submissions if s.call_id != "c1"]
    assert set(accepted) <= own


async def test_a_batch_refused_outright_is_sent_one_by_one(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """A 400 that names no event (the API not taking batches at all): the per-result path."""
    keys = turn_of(api, 2)
    records = [await saved(store, key) for key in keys]
    api.fake.fail_next("submit", 1, 400)
    assert await submit_together(submitter(api, store, clock), records) == ["submitted"] * 2
    assert len(posts(api)) == 3 and len(api.fake.submissions) == 2


async def test_a_failed_batch_is_every_members_failure_for_the_sweep(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """A failure worth another try (503 after the client's retries): each member keeps its
    result with the sweep's backoff; nothing is sent one by one."""
    keys = turn_of(api, 2)
    records = [await saved(store, key) for key in keys]
    api.fake.fail_next("submit", 50, 503)
    assert await submit_together(submitter(api, store, clock), records) == ["failed"] * 2
    assert len(set(posts(api))) == 1
    for key in keys:
        kept = await store.get_call(key)
        assert kept is not None and kept.state is CallState.SUCCEEDED and kept.failures == 1


async def test_a_batch_never_exceeds_the_size_budget(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """Thirty results of 200 KB (6 MB in all) go in bodies under the 4 MiB budget; a
    result near the limit goes alone, under its own key."""
    keys = turn_of(api, 31)
    records = [await saved(store, key, output="x" * 200_000) for key in keys[:30]]
    big = await saved(store, keys[30], output="y" * (TOOL_RESULT_LIMIT - 100_000))
    outcomes = await submit_together(submitter(api, store, clock), [*records, big])
    assert outcomes == ["submitted"] * 31
    bodies = [body for _, body in api.fake.idempotency.values()]
    assert len(bodies) == 3
    assert max(len(b) for b in bodies) <= TOOL_RESULT_LIMIT - DEFAULT_SAFETY_MARGIN
    assert big.result is not None and big.result.idempotency_key in api.fake.idempotency
    assert len(api.fake.submissions) == 31


async def test_a_member_that_stops_waiting_does_not_hold_up_its_batch(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """One member is cancelled while its batch's POST is under way: the others are marked
    submitted; its result, sent with them, stays saved for the sweep (the same batch again)."""
    keys = turn_of(api, 3)
    records = [await saved(store, key) for key in keys]
    parts = submitter(api, store, clock)
    api.fake.set_latency("submit", 0.05)
    tasks = [asyncio.create_task(parts.submit(r, together=True)) for r in records]
    await asyncio.sleep(0.02)  # gathered, and the POST under way
    tasks[2].cancel()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert outcomes[:2] == ["submitted", "submitted"]
    assert isinstance(outcomes[2], asyncio.CancelledError)
    states = [r.state for r in [await store.get_call(k) for k in keys] if r is not None]
    assert states == [CallState.SUBMITTED, CallState.SUBMITTED, CallState.SUCCEEDED]


async def test_a_batch_whose_first_member_is_cancelled_while_others_join_sends_them(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """The member that started a batch is cancelled during the loop turn in which the
    others join it: they go alone instead of waiting for ever (they did: the batch was
    only sent, or its members told, after that loop turn)."""
    keys = turn_of(api, 2)
    records = [await saved(store, key) for key in keys]
    parts = submitter(api, store, clock)
    first, second = (asyncio.create_task(parts.submit(r, together=True)) for r in records)
    await asyncio.sleep(0)  # both gathered: the first waits out its loop turn, the second joined
    first.cancel()
    assert await asyncio.wait_for(second, 5) == "submitted"
    with pytest.raises(asyncio.CancelledError):
        await first
    assert [s.call_id for s in api.fake.submissions] == [keys[1].call_id]


async def test_a_batch_answered_429_is_tried_again_later_not_one_by_one(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """Rate limited past the client's retries: every member waits for the sweep, which
    sends the same batch again; splitting it would have multiplied the refused requests."""
    keys = turn_of(api, 2)
    records = [await saved(store, key) for key in keys]
    api.fake.fail_next("submit", 50, 429)
    assert await submit_together(submitter(api, store, clock), records) == ["failed"] * 2
    assert len(set(posts(api))) == 1 and api.fake.submissions == []
