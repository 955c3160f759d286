"""dispatch.settling: an operator's answer, or re-run, for a held or in-doubt call."""

from __future__ import annotations

import pytest

from agentfn_asgi.calls.records import CallKey, CallState
from agentfn_asgi.errors import CallNotFoundError, OperatorError, OperatorInputError
from agentfn_asgi.operator import CallFilter, Operator
from agentfn_asgi.store.memory import MemoryStore

from ..support.clock import FakeClock
from .conftest import API, LEASE, OWNER, SETTINGS, dispatching, lookup_tools

pytestmark = pytest.mark.anyio


async def in_doubt(api: API, store: MemoryStore, clock: FakeClock) -> CallKey:
    """A pending call claimed by a replica that died: its lease ran out past the margin."""
    key = api.one_call()
    await store.claim_call(key, tool_name="lookup", owner="gone", lease_seconds=LEASE)
    clock.advance(LEASE + SETTINGS.fence_margin + 1)
    return key


async def test_an_operators_output_for_an_in_doubt_call_is_saved_and_submitted(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    key = await in_doubt(api, store, clock)
    async with dispatching(api, store, clock, lookup_tools()) as dispatcher:
        status, message = await dispatcher.settle(key, output={"checked": True})
    assert status == "submitted", message
    assert [(s.call_id, s.output) for s in api.fake.submissions] == [("c1", '{"checked":true}')]
    record = await store.get_call(key)
    assert record is not None and record.state is CallState.SUBMITTED


async def test_a_call_that_is_not_settleable_is_refused_with_the_reason(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """A live claim (someone is running it) is refused; nothing is saved or sent."""
    key = api.one_call()
    await store.claim_call(key, tool_name="lookup", owner=OWNER, lease_seconds=LEASE)
    async with dispatching(api, store, clock, lookup_tools()) as dispatcher:
        status, message = await dispatcher.settle(key, error="gave up")
    assert status == "refused" and message
    assert api.fake.submissions == []


async def test_a_rerun_runs_the_call_again_under_the_next_attempt(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    runs: list[str] = []
    key = await in_doubt(api, store, clock)
    async with dispatching(api, store, clock, lookup_tools(runs)) as dispatcher:
        status, _ = await dispatcher.settle(key, rerun=True)
        await dispatcher.wait_for([key])
    assert status == "running"
    assert runs == ["a"]
    record = await store.get_call(key)
    assert record is not None and record.state is CallState.SUBMITTED and record.attempt == 2


async def test_settling_wrongly_raises_the_trees_errors(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """Issue 22: these were a bare LookupError and ValueError, outside the one tree; they
    stay catchable as those (the CLI and the page catch them so)."""
    key = await in_doubt(api, store, clock)
    async with dispatching(api, store, clock, lookup_tools()) as dispatcher:
        with pytest.raises(CallNotFoundError) as missing:
            await dispatcher.settle(CallKey(key.session_id, key.turn_id, "nope"), error="x")
        assert isinstance(missing.value, LookupError)
        with pytest.raises(OperatorInputError) as both:
            await dispatcher.settle(key, output="x", error="y")
        assert isinstance(both.value, ValueError) and isinstance(both.value, OperatorError)
    assert api.fake.submissions == []


async def test_in_doubt_is_the_same_on_the_page_in_the_counts_and_for_settle(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """A claim whose lease ran out less than the fencing margin ago is not in doubt yet
    anywhere: the operator's list, its counts and settle all use the margin (the page
    showed "in doubt" for a call that settle then refused); past the margin, all agree."""
    key = api.one_call()
    await store.claim_call(key, tool_name="lookup", owner="gone", lease_seconds=LEASE)
    clock.advance(LEASE + SETTINGS.fence_margin / 2)
    async with dispatching(api, store, clock, lookup_tools()) as dispatcher:
        operator = Operator(store, dispatcher=dispatcher, location="memory://", clock=clock)

        async def seen() -> tuple[str, int, int, bool]:
            (call,) = (await operator.calls(CallFilter(limit=10))).calls
            listed = await operator.calls(CallFilter(state="in_doubt", limit=10))
            overview = await operator.overview()
            detail = await operator.call(key.call_id)
            doubt = overview.outcomes["in_doubt"]
            return call.outcome, len(listed.calls), doubt, detail.settleable

        assert await seen() == ("running", 0, 0, False)
        status, _ = await dispatcher.settle(key, error="gave up")
        assert status == "refused"
        clock.advance(SETTINGS.fence_margin)
        assert await seen() == ("in_doubt", 1, 1, True)
