"""A turn's end stops its calls (agentfn_asgi.dispatch.cancelling), through the real app,
store and the package's fake over its ASGI transport."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import anyio
import pytest

from agentfn_asgi.calls.records import CallKey, CallRecord, CallState
from agentfn_asgi.testing import Connection, FakeCall
from agentfn_asgi.tools import FunctionTools, NotRun, ToolContext

from ..support.stack import FAST, running_stack

pytestmark = pytest.mark.anyio

SETTINGS = dataclasses.replace(FAST, reread_interval=0)


def _tools(events: list[tuple[str, str]], told: list[bool]) -> FunctionTools:
    tools = FunctionTools()

    @tools.function
    async def work(ctx: ToolContext, seconds: float) -> str:
        """Work a while.

        Args:
            seconds: How long.
        """
        events.append((ctx.call_id, "start"))
        try:
            await anyio.sleep(seconds)
        except anyio.get_cancelled_exc_class():
            events.append((ctx.call_id, "cancelled"))
            raise
        events.append((ctx.call_id, "end"))
        return "done"

    @tools.function
    def work_sync(ctx: ToolContext, seconds: float) -> str:
        """Work a while."""
        events.append((ctx.call_id, "start"))
        deadline = time.monotonic() + seconds
        while deadline > time.monotonic():
            if ctx.cancelled.wait(0.05):
                events.append((ctx.call_id, "cancelled"))
                return "never submitted"
        events.append((ctx.call_id, "end"))
        return "done"

    def reconcile(ctx: ToolContext, arguments: dict[str, Any]) -> NotRun:
        told.append(bool(ctx.cancelled))
        return NotRun()

    @tools.function(side_effects=True, reconcile=reconcile)
    async def pay(ctx: ToolContext, seconds: float) -> str:
        """Work a while."""
        events.append((ctx.call_id, "start"))
        await anyio.sleep(seconds)
        return "paid"

    @tools.function(concurrency=1)
    async def one_at_a_time(ctx: ToolContext, seconds: float) -> str:
        """Work a while."""
        events.append((ctx.call_id, "start"))
        await anyio.sleep(seconds)
        return "done"

    return tools


async def _record(stack: Connection, sid: str, call_id: str) -> CallRecord | None:
    for record in await stack.store.calls_for_session(sid):
        if record.key.call_id == call_id:
            return record
    return None


async def _until(stack: Connection, sid: str, call_id: str, state: CallState) -> CallRecord:
    with anyio.fail_after(10):
        while True:
            record = await _record(stack, sid, call_id)
            if record is not None and record.state is state:
                return record
            await anyio.sleep(0.02)


async def _started(events: list[tuple[str, str]], *call_ids: str) -> None:
    with anyio.fail_after(10):
        while {c for c, phase in events if phase == "start"} < set(call_ids):
            await anyio.sleep(0.02)


async def test_a_cancelled_turn_stops_its_async_and_sync_handlers_at_once() -> None:
    """The idle webhook of a cancelled turn: the app reads the session and its turn, cancels
    both running calls, the async handler is cancelled and the sync one sees
    ``ctx.cancelled`` within moments, and nothing is submitted for either (before, both ran
    to the end and their results were refused)."""
    events: list[tuple[str, str]] = []
    async with running_stack(_tools(events, []), settings=SETTINGS) as stack:
        sid = stack.fake.create_session(
            [[FakeCall("work", {"seconds": 30}, "a"), FakeCall("work_sync", {"seconds": 30}, "s")]]
        )
        await _started(events, "a", "s")
        assert stack.fake.cancel_turn(sid)
        with anyio.fail_after(2):
            while {c for c, phase in events if phase == "cancelled"} != {"a", "s"}:
                await anyio.sleep(0.02)
        for call_id in ("a", "s"):
            record = await _until(stack, sid, call_id, CallState.CANCELLED)
            assert record.reason == "the turn was cancelled; stopped while it ran"
            full = await stack.store.get_call(record.key, history=True)
            assert full is not None and [e.kind for e in full.history][-1] == "cancelled"
        await anyio.sleep(0.3)
        assert stack.fake.submissions == []
    assert ("a", "end") not in events and ("s", "end") not in events


async def test_without_any_webhook_the_periodic_reread_notices() -> None:
    """No webhook reaches the app: a session with a call running longer than
    ``reread_interval`` is read again on that interval, and the cancellation is found."""
    events: list[tuple[str, str]] = []
    settings = dataclasses.replace(SETTINGS, reread_interval=0.3)
    async with running_stack(_tools(events, []), settings=settings, webhooks=False) as stack:
        sid = stack.fake.create_session([[FakeCall("work", {"seconds": 30}, "a")]])
        await stack.app.dispatcher.recover(sid)
        await _started(events, "a")
        stack.fake.cancel_turn(sid)
        with anyio.fail_after(0.3 * 2 + 2):
            while ("a", "cancelled") not in events:
                await anyio.sleep(0.02)
        await _until(stack, sid, "a", CallState.CANCELLED)
    assert stack.fake.submissions == []


async def test_a_failed_turn_gives_its_error_code_as_the_reason() -> None:
    events: list[tuple[str, str]] = []
    async with running_stack(_tools(events, []), settings=SETTINGS) as stack:
        sid = stack.fake.create_session([[FakeCall("work", {"seconds": 30}, "a")]])
        await _started(events, "a")
        stack.fake.fail_turn(sid, "session_budget_exceeded", "The session's budget ran out.")
        record = await _until(stack, sid, "a", CallState.CANCELLED)
        assert record.reason == (
            "the turn failed (session_budget_exceeded: the session reached its spending limit);"
            " stopped while it ran"
        )


async def test_a_side_effect_call_stopped_mid_run_may_have_run_and_its_hook_is_told() -> None:
    """A tool with side effects stopped while it ran: the record says it may have run, and
    its reconcile hook is asked once, with ``ctx.cancelled`` set, so the host can
    compensate."""
    events: list[tuple[str, str]] = []
    told: list[bool] = []
    async with running_stack(_tools(events, told), settings=SETTINGS) as stack:
        sid = stack.fake.create_session([[FakeCall("pay", {"seconds": 30}, "p")]])
        await _started(events, "p")
        stack.fake.cancel_turn(sid)
        record = await _until(stack, sid, "p", CallState.CANCELLED)
        assert record.reason == "the turn was cancelled; stopped while it ran: it may have run"
        with anyio.fail_after(5):
            while not told:
                await anyio.sleep(0.02)
    assert told == [True] and stack.fake.submissions == []


async def test_a_call_waiting_for_a_slot_is_withdrawn_and_never_runs() -> None:
    events: list[tuple[str, str]] = []
    async with running_stack(_tools(events, []), settings=SETTINGS) as stack:
        sid = stack.fake.create_session(
            [
                [
                    FakeCall("one_at_a_time", {"seconds": 30}, "first"),
                    FakeCall("one_at_a_time", {"seconds": 30}, "second"),
                ]
            ]
        )
        await _started(events, "first")
        await _until(stack, sid, "second", CallState.WAITING)
        stack.fake.cancel_turn(sid)
        waiter = await _until(stack, sid, "second", CallState.CANCELLED)
        assert waiter.reason == (
            "the turn was cancelled; withdrawn while it waited for a slot of its limiter"
        )
        await _until(stack, sid, "first", CallState.CANCELLED)
        await anyio.sleep(0.3)
    assert [c for c, phase in events if phase == "start"] == ["first"]
    assert stack.fake.submissions == []


async def test_a_call_claimed_after_the_read_is_left_alone() -> None:
    """A settling read that predates a call's claim never cancels it: the store's
    known_before guard compares the claim's time with the read's."""
    events: list[tuple[str, str]] = []
    async with running_stack(_tools(events, []), settings=SETTINGS) as stack:
        sid = stack.fake.create_session([[FakeCall("work", {"seconds": 0.2}, "a")]])
        key = CallKey(sid, stack.fake.session(sid)["required_actions"][0]["turn_id"], "a")
        await _started(events, "a")
        record = await stack.store.get_call(key)
        assert record is not None
        assert not await stack.store.cancel(
            key, owner="x", reason="a read too old", known_before=record.created_at - 1
        )
        await _until(stack, sid, "a", CallState.SUBMITTED)
