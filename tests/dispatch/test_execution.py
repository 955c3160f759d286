"""dispatch.execution: one call's life (claim, run, save, submit), the in-doubt policy and
the worker hand-off."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from agentfn_asgi.calls.records import CallKey, CallState
from agentfn_asgi.errors import CompletionMismatchError, CompletionTokenError
from agentfn_asgi.messages import ENQUEUE_FAILED_MESSAGE, IN_DOUBT_MESSAGE
from agentfn_asgi.store.memory import MemoryStore
from agentfn_asgi.tools import FunctionTools

from ..support.clock import FakeClock
from .conftest import API, LEASE, SETTINGS, dispatching, lookup_tools

pytestmark = pytest.mark.anyio


def refund_tools(runs: list[str]) -> FunctionTools:
    tools = FunctionTools()

    @tools.function(side_effects=True)
    def refund(key: str) -> str:
        """Refund an order (a side effect, no reconcile hook)."""
        runs.append(key)
        return "refunded"

    return tools


async def died_mid_call(api: API, store: MemoryStore, clock: FakeClock, name: str) -> CallKey:
    """A pending call claimed by a replica that died while running it."""
    key = api.one_call(name)
    await store.claim_call(key, tool_name=name, owner="gone", lease_seconds=LEASE)
    clock.advance(LEASE + SETTINGS.fence_margin + 1)
    return key


async def test_a_handler_failure_reaches_the_model_as_the_safe_message(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    tools = FunctionTools()

    @tools.function
    def lookup(key: str) -> str:
        """Fails with a secret in its exception."""
        raise RuntimeError("password=hunter2")

    key = api.one_call()
    async with dispatching(api, store, clock, tools) as dispatcher:
        await dispatcher.resolve(key.session_id)
        await dispatcher.wait_for([key])
    [submission] = api.fake.submissions
    assert submission.success is False and "hunter2" not in (submission.error or "x")
    record = await store.get_call(key)
    assert record is not None and record.result is not None
    assert record.result.error_type is not None


async def test_an_in_doubt_side_effect_call_is_never_run_again(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """No reconcile hook, ``in_doubt="fail"``: the model is told it may have happened."""
    runs: list[str] = []
    key = await died_mid_call(api, store, clock, "refund")
    async with dispatching(api, store, clock, refund_tools(runs)) as dispatcher:
        await dispatcher.resolve(key.session_id)
        await dispatcher.wait_for([key])
    assert runs == []
    [submission] = api.fake.submissions
    assert (submission.success, submission.error) == (False, IN_DOUBT_MESSAGE)


async def test_with_hold_an_in_doubt_side_effect_call_waits_for_an_operator(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    runs: list[str] = []
    key = await died_mid_call(api, store, clock, "refund")
    settings = dataclasses.replace(SETTINGS, in_doubt="hold")
    async with dispatching(api, store, clock, refund_tools(runs), settings) as dispatcher:
        await dispatcher.resolve(key.session_id)
        await dispatcher.wait_for([key])
    assert runs == [] and api.fake.submissions == []
    record = await store.get_call(key)
    assert record is not None and record.state is CallState.QUARANTINED
    assert record.reason


async def test_a_queued_tool_without_a_hand_off_fails_saying_so(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """No completion secret, so no hand-off (the app refuses such a registry; ``recover``
    may still meet one): the call fails with the enqueue message. Issue 22: the cause was a
    bare RuntimeError, now a ConfigurationError of the one tree (logged)."""
    queued: list[Any] = []
    tools = FunctionTools()

    @tools.function(enqueue=queued.append)
    def lookup(key: str) -> str:
        """Handed to a worker."""
        return key

    key = api.one_call()
    async with dispatching(api, store, clock, tools) as dispatcher:
        await dispatcher.resolve(key.session_id)
        await dispatcher.wait_for([key])
    assert queued == []
    [submission] = api.fake.submissions
    assert submission.success is False
    assert submission.error == ENQUEUE_FAILED_MESSAGE.format(name="lookup")


async def test_a_completion_naming_another_tool_is_refused(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """Issue 22: a bare LookupError before; now a CompletionMismatchError, a completion-token
    refusal (401 at the endpoint) that is still a LookupError."""
    key = api.one_call()
    await store.claim_call(key, tool_name="lookup", owner="a", lease_seconds=LEASE)
    async with dispatching(api, store, clock, lookup_tools()) as dispatcher:
        with pytest.raises(CompletionMismatchError) as refused:
            await dispatcher.complete(
                key, owner="a", tool_name="other", success=True, output="x", attempt=1
            )
    assert isinstance(refused.value, LookupError)
    assert isinstance(refused.value, CompletionTokenError)
    assert api.fake.submissions == []
