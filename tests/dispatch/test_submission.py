"""dispatch.submission: submitting a saved result, and what a refusal means for the call."""

from __future__ import annotations

import pytest

from agentfn_asgi.calls.records import CallState
from agentfn_asgi.dispatch.submission import Submitter
from agentfn_asgi.store.memory import MemoryStore
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
