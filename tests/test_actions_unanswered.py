"""Nothing waits in silence, and environment connections (issue 34), in process over the
memory store and the fake: an action nobody here answers is recorded ``unanswered`` with its
age and settles when the session stops listing it; a policy or hook that answers it later
takes it up; the ``connect_environment`` hook runs once per occurrence, nothing POSTed."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import logging
import threading
import time
from collections.abc import Callable

import anyio
import pytest

from agentfn_asgi.actions import ActionRules, EnvironmentConnection
from agentfn_asgi.calls.records import CallKey, CallRecord, CallState
from agentfn_asgi.errors import StoreUnavailableError
from agentfn_asgi.store import MemoryStore
from agentfn_asgi.testing import Connection, FakeCall, FakeRequest

from .support.stack import running_stack
from .test_actions import SETTINGS, lookup_tools

LEAVE_MCP = ActionRules(other_mcp="leave")


async def record_of(stack: Connection, key: CallKey, *states: CallState) -> CallRecord:
    """The record of ``key`` once it is in one of ``states``."""
    with anyio.fail_after(10):
        while True:
            record = await stack.store.get_call(key, history=True)
            if record is not None and record.state in states:
                return record
            await anyio.sleep(0.02)


@pytest.mark.anyio
async def test_a_leave_decision_is_recorded_unanswered_without_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``leave``: the request is recorded ``unanswered`` (claimed, then left: its history says
    why), nothing is submitted, no WARNING; reads again change nothing; the turn's end
    cancels it."""
    caplog.set_level(logging.WARNING, logger="agentfn_asgi.dispatch.actions")
    async with running_stack(lookup_tools(), settings=SETTINGS, actions=LEAVE_MCP) as stack:
        sid = stack.fake.create_session([[FakeRequest.mcp("crm", "find", request_id="req_l")]])
        turn = stack.fake.session(sid)["required_actions"][0]["turn_id"]
        key = CallKey(sid, turn, "req_l")
        left = await record_of(stack, key, CallState.UNANSWERED)
        for _ in range(2):
            await stack.app.dispatcher.recover(sid)
        again = await stack.store.get_call(key, history=True)
        assert stack.fake.cancel_turn(sid)
        await stack.app.dispatcher.recover(sid)
        ended = await stack.store.get_call(key)
    assert [e.kind for e in left.history] == ["claimed", "unanswered"]
    assert left.history[-1].detail == "left by the actions= policy"
    assert again == left
    assert ended is not None and ended.state is CallState.CANCELLED
    assert "left unanswered here" in (ended.reason or "")
    assert not stack.fake.submissions
    assert not [r for r in caplog.records if sid in r.getMessage()]


@pytest.mark.anyio
async def test_an_unanswered_request_answered_elsewhere_becomes_stale() -> None:
    """A read that no longer lists an unanswered request while its turn goes on: someone
    else answered it (``stale``), never cancelled."""
    async with running_stack(lookup_tools(), settings=SETTINGS, actions=LEAVE_MCP) as stack:
        sid = stack.fake.create_session(
            [
                [
                    FakeRequest.mcp("crm", "find", request_id="req_e"),
                    FakeCall("lookup", {"order_id": "o1"}, call_id="call_x"),
                ],
                [FakeRequest.mcp("crm", "find", request_id="req_next")],  # the turn goes on
            ]
        )
        turn = stack.fake.session(sid)["required_actions"][0]["turn_id"]
        key = CallKey(sid, turn, "req_e")
        await record_of(stack, key, CallState.UNANSWERED)
        # Answered elsewhere: the fake's own check of an answer, as the host's front end.
        await stack.client.submit_events(
            sid,
            [
                {
                    "type": "agent.session.input.mcp_approval_request_result",
                    "request_id": "req_e",
                    "response": {"type": "mcp_tool_call", "decision": "approve"},
                }
            ],
            idempotency_key="elsewhere",
        )
        await stack.app.dispatcher.recover(sid)
        record = await stack.store.get_call(key)
    assert record is not None and record.state is CallState.STALE


@pytest.mark.anyio
async def test_a_policy_after_a_restart_takes_up_what_was_left() -> None:
    """Left unanswered by an app without a policy, the request is answered by the next app
    (a restart with ``actions=``) over the same store: taken up, a fresh attempt."""
    store = MemoryStore()
    fake_calls = [[FakeRequest.mcp("docs", "search", request_id="req_t")]]
    async with running_stack(lookup_tools(), settings=SETTINGS, store=store) as first:
        sid = first.fake.create_session(fake_calls)
        turn = first.fake.session(sid)["required_actions"][0]["turn_id"]
        key = CallKey(sid, turn, "req_t")
        await record_of(first, key, CallState.UNANSWERED)
        fake = first.fake
        async with running_stack(
            lookup_tools(),
            settings=SETTINGS,
            store=store,
            fake=fake,
            actions=ActionRules(mcp={"docs": "approve"}),
        ) as second:
            await second.app.dispatcher.recover(sid)
            record = await record_of(second, key, CallState.SUBMITTED)
    assert [e.kind for e in record.history][:4] == ["claimed", "unanswered", "taken_up", "saved"]
    assert [s.call_id for s in fake.submissions] == ["req_t"]
    assert fake.submissions[0].success


@pytest.mark.anyio
async def test_an_environment_connection_runs_the_hook_once_per_occurrence() -> None:
    """The hook gets the session id, environment id and the session's ``environment``; it
    runs once however often the session is read, nothing is POSTed; once the environment
    connected (a read no longer lists it) the record retires, and the next occurrence runs
    the hook again. A hook that raises is run again."""
    seen: list[EnvironmentConnection] = []
    failures = [1]

    async def connect(request: EnvironmentConnection) -> None:
        if failures:
            failures.pop()
            raise RuntimeError("the executor is still booting")
        seen.append(request)

    async with running_stack(
        lookup_tools(), settings=SETTINGS, connect_environment=connect
    ) as stack:
        sid = stack.fake.create_session([])
        key = CallKey(sid, "", "environment:env_1")
        stack.fake.require_environment(sid, "env_1")
        first = await record_of(stack, key, CallState.SUBMITTED)
        for _ in range(2):
            await stack.app.dispatcher.recover(sid)
        assert len(seen) == 1
        assert stack.fake.environment_connected(sid, "env_1")
        await stack.app.dispatcher.recover(sid)
        retired = await record_of(stack, key, CallState.RETIRED)
        stack.fake.require_environment(sid, "env_1")
        await record_of(stack, key, CallState.SUBMITTED)
        with anyio.fail_after(10):
            while len(seen) < 2:
                await anyio.sleep(0.02)
    assert seen[0].session_id == sid and seen[0].environment_id == "env_1"
    assert seen[0].environment == {"type": "none"}
    assert first.result is not None and first.result.source == "environment"
    assert retired.history[-1].kind == "retired"
    assert not stack.fake.submissions


@pytest.mark.anyio
async def test_without_a_hook_an_environment_connection_is_unanswered_until_it_connects(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No hook: recorded ``unanswered`` (one WARNING for the session), retired once the
    environment connected, and recorded again for its next occurrence."""
    caplog.set_level(logging.WARNING, logger="agentfn_asgi.dispatch.actions")
    async with running_stack(lookup_tools(), settings=SETTINGS) as stack:
        sid = stack.fake.create_session([])
        key = CallKey(sid, "", "environment:env_2")
        stack.fake.require_environment(sid, "env_2")
        left = await record_of(stack, key, CallState.UNANSWERED)
        stack.fake.environment_connected(sid, "env_2")
        await stack.app.dispatcher.recover(sid)
        await record_of(stack, key, CallState.RETIRED)
        stack.fake.require_environment(sid, "env_2")
        again = await record_of(stack, key, CallState.UNANSWERED)
    assert left.history[-1].detail == "no connect_environment hook"
    assert again.attempt == 2
    warnings = [r.getMessage() for r in caplog.records if sid in r.getMessage()]
    assert len(warnings) == 1 and "environment_connection" in warnings[0]


@pytest.mark.anyio
async def test_why_nobody_answers_each_kind() -> None:
    """The reason recorded (and shown) for each kind left unanswered; a hook or a policy
    that answers it gives no reason."""
    from agentfn_asgi.dispatch.actions import RequestAnswers
    from agentfn_asgi.wire import AgentSession

    session = AgentSession.model_validate(
        {
            "id": "sess_1",
            "status": "requires_action",
            "required_actions": [
                {"type": "environment_connection", "environment_id": "env_1"},
                {"type": "telepathy_request", "thought": "?"},
                {
                    "type": "mcp_approval_request",
                    "request_id": "r1",
                    "turn_id": "t1",
                    "request": {"type": "mcp_tool_call", "server_label": "crm"},
                },
            ],
        }
    )
    [request] = session.calls
    environment, unknown = session.turnless_calls
    assert (environment.call_id, unknown.call_id) == (
        "environment:env_1",
        "action:telepathy_request",
    )
    key = CallKey("sess_1", "", environment.call_id)
    nobody = RequestAnswers(None)
    assert await nobody.admission(key, environment) == "no connect_environment hook"
    assert await nobody.admission(key, unknown) == "an action type this version does not know"
    assert await nobody.admission(key, request) == "no actions= policy"
    hooked = RequestAnswers(LEAVE_MCP, connect_environment=lambda _: None)
    assert not isinstance(await hooked.admission(key, environment), str)
    assert await hooked.admission(key, request) == "left by the actions= policy"


@pytest.mark.anyio
async def test_follow_runs_the_connect_hook_and_records_what_nobody_answers() -> None:
    """Stream mode (``follow``) reads the same actions as a webhook: the hook's environment
    connection is owed and answered, a request nobody answers is recorded ``unanswered``
    (not owed: the follow ends with its turn)."""
    seen: list[str] = []
    async with running_stack(
        lookup_tools(),
        settings=SETTINGS,
        webhooks=False,
        loopback=True,
        connect_environment=lambda request: seen.append(request.environment_id),
    ) as stack:
        sid = stack.fake.create_session([[FakeRequest.mcp("crm", "find", request_id="req_s")]])
        turn = stack.fake.session(sid)["required_actions"][0]["turn_id"]
        stack.fake.require_environment(sid, "env_s")

        async def end_when_recorded() -> None:
            await record_of(stack, CallKey(sid, turn, "req_s"), CallState.UNANSWERED)
            await record_of(stack, CallKey(sid, "", "environment:env_s"), CallState.SUBMITTED)
            stack.fake.environment_connected(sid, "env_s")
            stack.fake.cancel_turn(sid)

        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:
                group.start_soon(end_when_recorded)
                summary = await stack.app.follow(sid)
        record = await stack.store.get_call(CallKey(sid, "", "environment:env_s"), history=True)
    assert seen == ["env_s"] and summary.calls_owed == 1
    # Connected by the end of the follow, whose last read retired the occurrence.
    assert record is not None and [e.kind for e in record.history][-2:] == ["submitted", "retired"]
    assert not stack.fake.submissions


@pytest.mark.anyio
async def test_a_webhook_read_that_no_longer_lists_the_environment_ends_its_occurrence() -> None:
    """No settling read needed: the next webhook's read (a function call's) that no longer
    lists the environment connection this process saw retires it, so the connection's next
    occurrence runs the hook again."""
    seen: list[str] = []
    # No sweep, no periodic re-read during the test: only the webhooks' reads.
    quiet = dataclasses.replace(SETTINGS, recovery_interval=3600.0, reread_interval=0.0)
    async with running_stack(
        lookup_tools(), settings=quiet, connect_environment=lambda r: seen.append(r.session_id)
    ) as stack:
        sid = stack.fake.create_session([])
        key = CallKey(sid, "", "environment:env_w")
        stack.fake.require_environment(sid, "env_w")
        await record_of(stack, key, CallState.SUBMITTED)
        # A read ends an occurrence first seen before it by more than the clock-skew margin.
        await anyio.sleep(quiet.fence_margin + 0.1)
        stack.fake.environment_connected(sid, "env_w")
        # The turn stays open (its second step waits for a request nobody answers): no
        # idle webhook, no settling read.
        stack.fake.start_turn(
            sid,
            [
                [FakeCall("lookup", {"order_id": "o2"}, call_id="call_w")],
                [FakeRequest.mcp("crm", "find", request_id="req_w")],
            ],
        )
        retired = await record_of(stack, key, CallState.RETIRED)
        assert stack.fake.session(sid)["status"] == "requires_action"
        stack.fake.require_environment(sid, "env_w")
        with anyio.fail_after(10):
            while len(seen) < 2:
                await anyio.sleep(0.02)
    assert [e.kind for e in retired.history][-2:] == ["submitted", "retired"]


#: No sweep, no periodic re-read: only the reads a test asks for (webhooks, ``recover``).
QUIET = dataclasses.replace(SETTINGS, recovery_interval=3600.0, reread_interval=0.0)


async def until(check: Callable[[], bool], *, seconds: float = 10.0) -> None:
    """Wait until ``check()`` holds."""
    with anyio.fail_after(seconds):
        while not check():
            await anyio.sleep(0.02)


@pytest.mark.anyio
@pytest.mark.parametrize("read", ["webhook", "settling"])
async def test_an_occurrence_that_ends_while_its_hook_runs_is_retired(read: str) -> None:
    """The environment connects while the hook still runs: the read that no longer lists it
    (a webhook's, or a settling one) retires the record all the same, and stops the hook
    (its occurrence is over), so the next occurrence runs the hook again rather than finding
    a finished record that no claim takes up."""
    entered: list[str] = []
    release = anyio.Event()

    async def connect(request: EnvironmentConnection) -> None:
        entered.append(request.environment_id)
        if len(entered) == 1:
            await release.wait()

    async with running_stack(lookup_tools(), settings=QUIET, connect_environment=connect) as stack:
        sid = stack.fake.create_session([])
        key = CallKey(sid, "", "environment:env_r")
        stack.fake.require_environment(sid, "env_r")
        await until(lambda: len(entered) == 1)
        # A read ends an occurrence first seen before it by more than the clock-skew margin.
        await anyio.sleep(QUIET.fence_margin + 0.1)
        assert stack.fake.environment_connected(sid, "env_r")
        if read == "webhook":
            stack.fake.start_turn(
                sid,
                [
                    [FakeCall("lookup", {"order_id": "o3"}, call_id="call_r")],
                    [FakeRequest.mcp("crm", "find", request_id="req_r")],
                ],
            )
            turn = stack.fake.session(sid)["required_actions"][0]["turn_id"]
            await record_of(stack, CallKey(sid, turn, "call_r"), CallState.SUBMITTED)
        else:
            await stack.app.dispatcher.recover(sid)
        release.set()  # the first run ends (or was stopped) after the read
        retired = await record_of(stack, key, CallState.RETIRED, CallState.SUBMITTED)
        stack.fake.require_environment(sid, "env_r")
        await until(lambda: len(entered) == 2, seconds=5)
    assert retired.state is CallState.RETIRED
    assert [e.kind for e in retired.history][-2:] == ["claimed", "retired"]


@pytest.mark.anyio
async def test_a_lapsed_claim_of_an_environment_no_longer_listed_is_retired() -> None:
    """A replica died while its hook ran, and the environment connected since: the sweep
    finds the lapsed claim, reads the session, and retires it (not in doubt for ever)."""
    async with running_stack(lookup_tools(), settings=QUIET) as stack:
        sid = stack.fake.create_session([])
        key = CallKey(sid, "", "environment:env_d")
        await stack.store.claim_call(
            key, tool_name="environment:env_d", owner="gone", lease_seconds=0.01
        )
        await anyio.sleep(QUIET.fence_margin + 0.1)
        await stack.app.dispatcher.sweep()
        record = await stack.store.get_call(key)
        lapsed = await stack.store.expired_claims(margin=QUIET.fence_margin)
    assert record is not None and record.state is CallState.RETIRED
    assert key not in [r.key for r in lapsed]


@pytest.mark.anyio
async def test_a_hook_that_keeps_failing_is_left_unanswered_and_taken_up_later() -> None:
    """A hook that fails ``max_attempts`` times is retried through the store (a scheduled
    retry), then recorded ``unanswered`` saying so, never ``submitted``: the action is still
    listed, and an app whose hook works (a restart) takes it up."""
    store = MemoryStore()
    settings = dataclasses.replace(QUIET, max_attempts=2)
    runs: list[str] = []

    def broken(request: EnvironmentConnection) -> None:
        runs.append(request.environment_id)
        raise RuntimeError("the orchestrator is down")

    async with running_stack(
        lookup_tools(), settings=settings, store=store, connect_environment=broken
    ) as first:
        sid = first.fake.create_session([])
        key = CallKey(sid, "", "environment:env_f")
        first.fake.require_environment(sid, "env_f")
        left = await record_of(first, key, CallState.UNANSWERED, CallState.SUBMITTED)
        fake = first.fake
    connected: list[str] = []
    async with running_stack(
        lookup_tools(),
        settings=settings,
        store=store,
        fake=fake,
        connect_environment=lambda request: connected.append(request.environment_id),
    ) as second:
        await second.app.dispatcher.recover(sid)
        answered = await record_of(second, key, CallState.SUBMITTED)
    assert left.state is CallState.UNANSWERED
    assert left.reason == "the connect_environment hook failed 2 times"
    assert [e.kind for e in left.history] == [
        "claimed",
        "retry_scheduled",
        "retried",
        "unanswered",
    ]
    assert runs == ["env_f", "env_f"] and connected == ["env_f"]
    assert answered.result is not None and answered.result.error_type is None


@pytest.mark.anyio
async def test_a_sync_hook_past_its_time_limit_never_runs_twice_at_once() -> None:
    """A sync hook past its time limit keeps running in its thread: the retry waits for it
    (within the time limit) before it runs the hook again, never beside it."""
    settings = dataclasses.replace(QUIET, default_timeout=0.3, max_attempts=5)
    lock = threading.Lock()
    running, peak, runs = [0], [0], [0]

    def slow_first(_: EnvironmentConnection) -> None:
        with lock:
            running[0] += 1
            runs[0] += 1
            first = runs[0] == 1
            peak[0] = max(peak[0], running[0])
        try:
            if first:
                time.sleep(0.7)  # past the time limit: abandoned, still running
        finally:
            with lock:
                running[0] -= 1

    async with running_stack(
        lookup_tools(), settings=settings, connect_environment=slow_first
    ) as stack:
        sid = stack.fake.create_session([])
        key = CallKey(sid, "", "environment:env_s")
        stack.fake.require_environment(sid, "env_s")
        record = await record_of(stack, key, CallState.SUBMITTED, CallState.UNANSWERED)
    assert peak[0] == 1
    assert record.state is CallState.SUBMITTED and runs[0] == 2


@pytest.mark.anyio
async def test_a_delivery_with_a_turnless_action_beside_its_one_call_is_resolved() -> None:
    """The claim of a delivery's only function call carries its resolution; a turn-less
    action beside it (here left unanswered, the call ignored as another service's) means
    the delivery is resolved on its own, never left for the sweep."""
    settings = dataclasses.replace(QUIET, unknown_tools="ignore")
    async with running_stack(lookup_tools(), settings=settings, webhooks=False) as stack:
        sid = stack.fake.create_session([[FakeCall("elsewhere", {}, call_id="call_c")]])
        stack.fake.require_environment(sid, "env_c")
        assert await stack.store.record_delivery("wh_c", sid, nonce="n")
        await stack.app.dispatcher.resolve(sid, delivery_id="wh_c", settle=False)
        await record_of(stack, CallKey(sid, "", "environment:env_c"), CallState.UNANSWERED)
        [delivery] = await stack.store.list_deliveries()
    assert delivery.resolved


@pytest.mark.anyio
async def test_follow_owes_only_what_this_app_answers() -> None:
    """``follow`` owes an action exactly when the dispatcher answers it: a sign-in hook
    without a policy answers sign-ins only, so an origin request is recorded ``unanswered``
    and not owed."""
    async with running_stack(
        lookup_tools(),
        settings=SETTINGS,
        webhooks=False,
        loopback=True,
        sign_in=lambda request: None,
    ) as stack:
        sid = stack.fake.create_session(
            [[FakeRequest.origin("https://shop.example.com", request_id="req_o")]]
        )
        turn = stack.fake.session(sid)["required_actions"][0]["turn_id"]

        async def end_when_recorded() -> None:
            await record_of(stack, CallKey(sid, turn, "req_o"), CallState.UNANSWERED)
            stack.fake.cancel_turn(sid)

        with anyio.fail_after(20):
            async with anyio.create_task_group() as group:
                group.start_soon(end_when_recorded)
                summary = await stack.app.follow(sid)
    assert summary.calls_owed == 0


@pytest.mark.anyio
async def test_a_hook_waiting_for_its_retry_holds_no_slot() -> None:
    """A failed hook's next run waits in the store, not in a concurrency slot: with one
    slot, a function call listed meanwhile runs at once, before the hook's retry."""
    settings = dataclasses.replace(QUIET, max_concurrency=1, retry_base=2.0)
    runs: list[float] = []

    def flaky(_: EnvironmentConnection) -> None:
        runs.append(time.monotonic())
        if len(runs) == 1:
            raise RuntimeError("the executor is still booting")

    async with running_stack(lookup_tools(), settings=settings, connect_environment=flaky) as stack:
        sid = stack.fake.create_session([])
        key = CallKey(sid, "", "environment:env_slot")
        stack.fake.require_environment(sid, "env_slot")
        await until(lambda: len(runs) == 1)
        turn = stack.fake.start_turn(
            sid, [[FakeCall("lookup", {"order_id": "o9"}, call_id="call_9")]]
        )
        with anyio.fail_after(1.0):  # well before the retry's 2 s
            await record_of(stack, CallKey(sid, turn, "call_9"), CallState.SUBMITTED)
        assert len(runs) == 1
        await record_of(stack, key, CallState.SUBMITTED)
    assert len(runs) == 2


class _LeaveFailsOnce(MemoryStore):
    """A store that cannot be written the first time an action is left (an outage)."""

    failed = False

    async def leave(self, key: CallKey, *, owner: str, attempt: int, reason: str) -> bool:
        if not self.failed:
            self.failed = True
            raise StoreUnavailableError("the store is down")
        return await super().leave(key, owner=owner, attempt=attempt, reason=reason)


@pytest.mark.anyio
async def test_a_store_error_while_leaving_an_action_is_logged_not_lost_in_a_task(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The store failing while an action is recorded unanswered: a warning, and the call's
    task ends cleanly (the error used to escape it, unread: "Task exception was never
    retrieved"); its claim lapses and a later read records it."""
    caplog.set_level(logging.WARNING, logger="agentfn_asgi.dispatch.execution")
    store = _LeaveFailsOnce()
    unread: list[object] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: unread.append(context.get("exception")))
    try:
        async with running_stack(
            lookup_tools(), store=store, settings=SETTINGS, actions=LEAVE_MCP
        ) as stack:
            stack.fake.create_session([[FakeRequest.mcp("crm", "find", request_id="r")]])
            with anyio.fail_after(10):
                while not store.failed:
                    await anyio.sleep(0.02)
                while stack.app.dispatcher.inflight:
                    await anyio.sleep(0.02)
        gc.collect()
    finally:
        loop.set_exception_handler(None)
    assert unread == []
    assert [r for r in caplog.records if "recording action" in r.getMessage()]
