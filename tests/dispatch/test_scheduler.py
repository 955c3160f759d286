"""dispatch.scheduler: resolving sessions, the not-found grace, and the recovery sweep."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agentfn_asgi.calls.records import CallKey, CallState, ClaimOutcome
from agentfn_asgi.dispatch.scheduler import _claimed
from agentfn_asgi.errors import (
    APIError,
    SessionNotFoundYetError,
    StoreError,
    StoreUnavailableError,
)
from agentfn_asgi.store.memory import MemoryStore
from agentfn_asgi.testing import FakeCall

from ..support.clock import FakeClock
from .conftest import API, SETTINGS, dispatching, lookup_tools, saved

pytestmark = pytest.mark.anyio


async def test_resolve_runs_each_pending_call_once_and_submits_it(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    runs: list[str] = []
    key = api.one_call()
    async with dispatching(api, store, clock, lookup_tools(runs)) as dispatcher:
        await store.record_delivery("d1", key.session_id, nonce="n")
        await dispatcher.resolve(key.session_id, delivery_id="d1")
        await dispatcher.resolve(key.session_id)  # a second read while it runs: no re-run
        await dispatcher.wait_for([key])
    assert runs == ["a"]
    assert [(s.call_id, s.output) for s in api.fake.submissions] == [("c1", "value of a")]
    record = await store.get_call(key)
    assert record is not None and record.state is CallState.SUBMITTED
    assert await store.unresolved_deliveries(due_before=clock() + 1) == []


async def test_a_session_not_found_within_the_grace_stays_for_the_sweep(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """A 404 for a session whose delivery just arrived raises SessionNotFoundYetError (an
    APIError: the delivery stays unresolved); past ``not_found_grace`` the session counts
    as deleted and its recorded calls become stale."""
    key = api.one_call()
    await saved(store, key)
    api.fake.delete_session(key.session_id)
    async with dispatching(api, store, clock, lookup_tools()) as dispatcher:
        with pytest.raises(SessionNotFoundYetError) as caught:
            await dispatcher.resolve(key.session_id, delivery_id="d1", received_at=clock())
        assert isinstance(caught.value, APIError)
        record = await store.get_call(key)
        assert record is not None and record.state is CallState.SUCCEEDED
        clock.advance(SETTINGS.not_found_grace)
        await dispatcher.resolve(key.session_id, received_at=clock() - SETTINGS.not_found_grace)
    record = await store.get_call(key)
    assert record is not None and record.state is CallState.STALE


async def test_one_404_on_the_submission_is_resubmitted_by_the_sweep(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """Issue 22, through the dispatcher: the result refused once with 404 is kept (not
    stale), and the sweep resubmits it once its backoff has passed; the session is answered.
    Before, the call was stale at once and the session waited forever."""
    runs: list[str] = []
    key = api.one_call()
    api.fake.fail_next("submit", 1, 404)
    async with dispatching(api, store, clock, lookup_tools(runs)) as dispatcher:
        await dispatcher.resolve(key.session_id)
        await dispatcher.wait_for([key])
        assert api.fake.submissions == []
        kept = await store.get_call(key)
        assert kept is not None and kept.state is CallState.SUCCEEDED and kept.failures == 1
        clock.advance(SETTINGS.retry_delay(1) + SETTINGS.recovery_grace)
        await dispatcher.sweep()
        await dispatcher.wait_for([key])
    assert runs == ["a"]  # resubmitted, never run again
    assert [s.call_id for s in api.fake.submissions] == ["c1"]
    assert api.fake.session(key.session_id)["status"] == "idle"


async def test_the_sweep_marks_calls_of_a_cancelled_turn_stale(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """A saved result whose turn was cancelled meanwhile: the sweep's submission is refused
    and the session (read again) no longer waits for it, so the call is stale, once."""
    key = api.one_call()
    await saved(store, key)
    api.fake.cancel_turn(key.session_id)
    async with dispatching(api, store, clock, lookup_tools()) as dispatcher:
        clock.advance(SETTINGS.recovery_grace)
        await dispatcher.sweep()
        await dispatcher.wait_for([key])
    record = await store.get_call(key)
    assert record is not None and record.state is CallState.STALE
    assert api.fake.submissions == []


async def test_waiting_for_one_claim_says_what_a_gather_of_it_would() -> None:
    """A delivery's single claim is awaited directly: its failure is raised as it is, a
    claim cancelled before the store decided it is a StoreError (the delivery stays for the
    sweep), and a cancelled resolver stays cancelled."""
    loop = asyncio.get_running_loop()
    failed: asyncio.Future[None] = loop.create_future()
    failed.set_exception(StoreError("down"))
    with pytest.raises(StoreError, match="down"):
        await _claimed([failed])
    interrupted: asyncio.Future[None] = loop.create_future()
    interrupted.cancel()
    with pytest.raises(StoreError, match="interrupted"):
        await _claimed([interrupted])
    done: asyncio.Future[None] = loop.create_future()
    done.set_result(None)
    await _claimed([done])
    pending: asyncio.Future[None] = loop.create_future()
    waiter = asyncio.ensure_future(_claimed([pending]))
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert pending.cancelled()  # as a gather cancels what it waits for


class _Logged(MemoryStore):
    """The memory store, noting the delivery-related writes the dispatcher asks of it."""

    def __init__(self, clock: FakeClock, *, failing_claims: bool = False) -> None:
        super().__init__(clock=clock)
        self.log: list[tuple[str, bool]] = []
        self.failing_claims = failing_claims

    async def claim_call(self, key: CallKey, **options: Any) -> ClaimOutcome:
        self.log.append(("claim", bool(options.get("resolves_delivery"))))
        if self.failing_claims:
            raise StoreUnavailableError("the store went away")
        return await super().claim_call(key, **options)

    async def mark_delivery_resolved(self, delivery_id: str) -> None:
        self.log.append(("resolve", False))
        await super().mark_delivery_resolved(delivery_id)


@pytest.mark.parametrize(
    ("calls", "settle", "expected"),
    [
        # The usual delivery: its one call's claim resolves it, in the same store step.
        (1, False, [("claim", True)]),
        # Several calls: each claim is its own step; the delivery after the last one.
        (2, False, [("claim", False), ("claim", False), ("resolve", False)]),
        # The sweep settles between the claims and the resolution: nothing rides.
        (1, True, [("claim", False), ("resolve", False)]),
    ],
    ids=["one-call", "two-calls", "sweep"],
)
async def test_a_delivery_is_resolved_by_its_only_claim(
    api: API, clock: FakeClock, calls: int, settle: bool, expected: list[tuple[str, bool]]
) -> None:
    """A delivery waiting for one call is resolved by that call's claim (one round trip
    fewer per delivery); otherwise by its own write once every claim is decided."""
    store = _Logged(clock)
    turn = [FakeCall("lookup", {"key": f"k{n}"}, call_id=f"c{n}") for n in range(calls)]
    session_id = api.fake.create_session([turn])
    async with dispatching(api, store, clock, lookup_tools()) as dispatcher:
        await store.record_delivery("d1", session_id)
        await dispatcher.resolve(session_id, delivery_id="d1", settle=settle)
        assert store.log == expected
        assert await store.unresolved_deliveries(due_before=clock() + 1) == []
        keys = [record.key for record in await store.calls_for_session(session_id)]
        await dispatcher.wait_for(keys)
    assert len(api.fake.submissions) == calls


async def test_a_claim_that_fails_leaves_its_delivery_for_the_sweep(
    api: API, clock: FakeClock
) -> None:
    """The claim that would have resolved the delivery fails: the delivery stays
    unresolved (the sweep reads the session again), and no call was recorded."""
    store = _Logged(clock, failing_claims=True)
    key = api.one_call()
    async with dispatching(api, store, clock, lookup_tools()) as dispatcher:
        await store.record_delivery("d1", key.session_id)
        with pytest.raises(StoreUnavailableError):
            await dispatcher.resolve(key.session_id, delivery_id="d1", settle=False)
    assert store.log == [("claim", True)]
    [left] = await store.unresolved_deliveries(due_before=clock() + 1)
    assert left.delivery_id == "d1"
    assert await store.get_call(key) is None
