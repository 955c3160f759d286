"""Call budgets in the dispatcher (``max_calls_per_session=``) over the memory store and the
fake API: a session's calls of the tool run up to the budget, counted once each before they
first run; the others fail with a message naming the budget and never run; a retry, a
takeover or an operator's re-run of a counted call is not counted again."""

from __future__ import annotations

import logging

import anyio
import pytest

from agentfn_asgi import RetryLater
from agentfn_asgi.calls.records import CallKey, CallState
from agentfn_asgi.dispatch import Dispatcher
from agentfn_asgi.messages import CALL_BUDGET_MESSAGE
from agentfn_asgi.store.memory import MemoryStore
from agentfn_asgi.testing import FakeCall
from agentfn_asgi.tools import FunctionTools, ToolContext

from ..support.clock import FakeClock
from .conftest import API, LEASE, OWNER, SETTINGS, dispatching
from .test_limits import answered, history, session_of

pytestmark = pytest.mark.anyio


def capped(budget: int, ran: list[str]) -> FunctionTools:
    tools = FunctionTools()

    @tools.function(max_calls_per_session=budget)
    def lookup(key: str) -> str:
        """Look a key up."""
        ran.append(key)
        return key

    return tools


async def test_calls_past_the_budget_fail_naming_it_and_never_run(
    api: API, store: MemoryStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Five calls of a tool with a budget of two in one session: two run (counted 1 and 2),
    three fail with the budget's message and never run; one INFO line each; another session
    has a budget of its own."""
    ran: list[str] = []
    tools = capped(2, ran)
    keys = session_of(api, [FakeCall("lookup", {"key": k}, call_id=k) for k in "abcde"])
    other = session_of(api, [FakeCall("lookup", {"key": "z"}, call_id="z")])
    caplog.set_level(logging.INFO, "agentfn_asgi.dispatch.execution")
    async with dispatching(api, store, clock, tools) as dispatcher:
        await dispatcher.resolve(keys[0].session_id)
        await dispatcher.resolve(other[0].session_id)
        found = await answered(api, keys + other)
        await dispatcher.wait_for(keys + other)
    refused = [k for k in keys if not found[k.call_id].success]
    assert len(refused) == 3
    assert sorted(ran) == sorted([*(k.call_id for k in keys if found[k.call_id].success), "z"])
    message = CALL_BUDGET_MESSAGE.format(name="lookup", budget=2)
    assert {found[k.call_id].error for k in refused} == {message}
    assert "budget of 2 calls" in message
    records = [await store.get_call(k) for k in keys]
    assert sorted(r.counted for r in records if r is not None and r.counted) == [1, 2]
    for key in refused:
        record = await store.get_call(key)
        assert record is not None and record.counted is None
        assert record.state is CallState.SUBMITTED and record.result is not None
        assert (record.result.error_type, record.result.source) == ("call_budget", "limit")
    assert found["z"].success
    lines = [
        r.getMessage() for r in caplog.records if "over its session's budget" in r.getMessage()
    ]
    assert len(lines) == 3 and all("tool=lookup" in line and "budget=2" in line for line in lines)


async def test_arguments_that_do_not_parse_are_not_counted(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """A call failing validation never runs, so it uses none of the budget."""
    ran: list[str] = []
    tools = capped(1, ran)
    keys = session_of(
        api,
        [FakeCall("lookup", {"nope": 1}, call_id="bad"), FakeCall("lookup", {"key": "a"})],
    )
    async with dispatching(api, store, clock, tools) as dispatcher:
        await dispatcher.resolve(keys[0].session_id)
        found = await answered(api, keys)
        await dispatcher.wait_for(keys)
    assert not found["bad"].success and ran == ["a"]
    bad = await store.get_call(keys[0])
    assert bad is not None and bad.counted is None


async def test_a_retry_is_not_counted_again(api: API) -> None:
    """Budget one: the first call asks to be retried and runs again (its second attempt is
    not counted), the second call is refused."""
    store = MemoryStore()
    attempts: list[tuple[str, int]] = []
    tools = FunctionTools()

    @tools.function(max_calls_per_session=1)
    async def lookup(ctx: ToolContext, key: str) -> str:
        """Look a key up."""
        attempts.append((key, ctx.attempt))
        if ctx.attempt == 1:
            raise RetryLater(after=0.05, reason="busy upstream")
        return key

    [first] = session_of(api, [FakeCall("lookup", {"key": "a"}, call_id="a")])
    dispatcher = Dispatcher(tools, api.client, store, settings=SETTINGS, owner=OWNER)
    await dispatcher.start(recover=False)
    try:
        await dispatcher.resolve(first.session_id)
        found = await answered(api, [first])
        await dispatcher.wait_for([first])
        api.fake.start_turn(first.session_id, [[FakeCall("lookup", {"key": "b"}, call_id="b")]])
        [action] = api.fake.required_actions(first.session_id)
        second = CallKey(first.session_id, action["turn_id"], "b")
        await dispatcher.resolve(first.session_id)
        found = await answered(api, [second])
        await dispatcher.wait_for([second])
    finally:
        await dispatcher.stop(drain_timeout=1.0)
    assert attempts == [("a", 1), ("a", 2)]
    assert not found["b"].success
    kinds = [kind for kind, _ in await history(store, first)]
    assert kinds.count("counted") == 1 and kinds.count("retried") == 1


async def test_a_takeover_and_an_operators_rerun_are_not_counted_again(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """Budget one: a counted call whose replica died is taken over and runs; released by an
    operator, it runs again; neither counts, and no other call fits."""
    ran: list[str] = []
    tools = capped(1, ran)
    [key] = session_of(api, [FakeCall("lookup", {"key": "a"}, call_id="a")])
    # A replica counted it and died running it.
    await store.claim_call(key, tool_name="lookup", owner="gone", lease_seconds=LEASE)
    counted = await store.count_call(key, owner="gone", attempt=1, budget=1)
    assert counted is not None and counted.counted == 1
    clock.advance(LEASE + SETTINGS.fence_margin + 1)
    async with dispatching(api, store, clock, tools) as dispatcher:
        await dispatcher.resolve(key.session_id)
        found = await answered(api, [key])
        await dispatcher.wait_for([key])
    assert found["a"].success and ran == ["a"]
    kinds = [kind for kind, _ in await history(store, key)]
    assert kinds.count("counted") == 1 and "taken_over" in kinds


async def test_a_rerun_of_a_counted_call_is_not_counted_again(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """An operator re-runs a counted call that is in doubt: it runs, counted once."""
    ran: list[str] = []
    tools = capped(1, ran)
    [key] = session_of(api, [FakeCall("lookup", {"key": "a"}, call_id="a")])
    await store.claim_call(key, tool_name="lookup", owner="gone", lease_seconds=LEASE)
    await store.count_call(key, owner="gone", attempt=1, budget=1)
    clock.advance(LEASE + SETTINGS.fence_margin + 1)
    async with dispatching(api, store, clock, tools) as dispatcher:
        status, _ = await dispatcher.settle(key, rerun=True)
        assert status == "running"
        found = await answered(api, [key])
        await dispatcher.wait_for([key])
    assert found["a"].success and ran == ["a"]
    kinds = [kind for kind, _ in await history(store, key)]
    assert kinds.count("counted") == 1 and "released" in kinds


async def test_a_budget_is_counted_before_an_approval_is_asked(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """With approval too: a call past the budget fails at once, no person is asked."""
    tools = FunctionTools()

    @tools.function(max_calls_per_session=1, approval=True)
    def close(account: str) -> str:
        """Close an account."""
        return account

    keys = session_of(api, [FakeCall("close", {"account": k}, call_id=k) for k in "ab"])
    async with dispatching(api, store, clock, tools) as dispatcher:
        await dispatcher.resolve(keys[0].session_id)
        with anyio.fail_after(5):
            while len(await store.waiting_approvals()) < 1 or not api.fake.submissions:
                await anyio.sleep(0.01)
    [waiting] = await store.waiting_approvals()
    [refused] = api.fake.submissions
    assert waiting.counted == 1 and refused.call_id != waiting.key.call_id
    assert not refused.success
