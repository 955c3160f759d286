"""Retries (flow control, issue 24): a plain tool's transient failure and any handler's
RetryLater are tried again at a time kept in the store, each attempt its own claim; the
bounds end them with a failure that tells the model it was retried."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentfn_asgi import RetryLater
from agentfn_asgi.calls.records import CallKey, CallState
from agentfn_asgi.demo.tools import ExampleResources, Ledger, build_tools
from agentfn_asgi.dispatch import Dispatcher
from agentfn_asgi.policy import RetryPolicy
from agentfn_asgi.store.memory import MemoryStore
from agentfn_asgi.testing import FakeCall
from agentfn_asgi.tools import FunctionTools, ToolContext
from agentfn_asgi.tracing import Telemetry
from agentfn_asgi.tracing.names import CALL_ATTEMPT

from ..support.clock import FakeClock
from .conftest import API, OWNER, SETTINGS

pytestmark = pytest.mark.anyio

FLAKY = RetryPolicy(attempts=4, initial_backoff=0.2)


def flaky_tools(fail_times: int, attempts: list[int], **options: Any) -> FunctionTools:
    """``lookup`` fails with ConnectionError on its first ``fail_times`` executions."""
    tools = FunctionTools()

    @tools.function(**options)
    def lookup(ctx: ToolContext, key: str) -> dict[str, Any]:
        """Look a key up (flaky)."""
        attempts.append(ctx.attempt)
        if len(attempts) <= fail_times:
            raise ConnectionError("upstream reset password=hunter2")
        return {"key": key, "attempts": len(attempts)}

    return tools


async def run_one(api: API, store: MemoryStore, clock: FakeClock, tools: FunctionTools) -> CallKey:
    key = api.one_call()
    dispatcher = Dispatcher(
        tools, api.client, store, settings=SETTINGS, owner=OWNER, clock=clock, sleep=clock.sleep
    )
    await dispatcher.start(recover=False)
    try:
        await dispatcher.resolve(key.session_id)
        await dispatcher.wait_for([key])
    finally:
        await dispatcher.stop(drain_timeout=1.0)
    return key


async def history_kinds(store: MemoryStore, key: CallKey) -> list[str]:
    record = await store.get_call(key, history=True)
    assert record is not None
    return [event.kind for event in record.history]


async def test_a_transient_failure_is_retried_with_backoff_until_it_succeeds(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """Fails twice, succeeds on attempt 3; waits 0.2 then 0.4 s (doubling), each attempt a
    new claim in the store."""
    attempts: list[int] = []
    key = await run_one(api, store, clock, flaky_tools(2, attempts, retry=FLAKY))
    assert attempts == [1, 2, 3]
    assert clock.sleeps == [pytest.approx(0.2), pytest.approx(0.4)]
    [submission] = api.fake.submissions
    assert submission.success is True
    assert await history_kinds(store, key) == [
        "claimed",
        "retry_scheduled",
        "retried",
        "retry_scheduled",
        "retried",
        "saved",
        "submitted",
    ]


async def test_past_its_attempts_the_model_is_told_it_was_retried_and_the_last_error(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """fail_times=9 with 4 attempts: a failure after the 4th, naming the error type only."""
    attempts: list[int] = []
    await run_one(api, store, clock, flaky_tools(9, attempts, retry=FLAKY))
    assert attempts == [1, 2, 3, 4]
    [submission] = api.fake.submissions
    assert submission.success is False
    error = submission.error or ""
    assert "tried 4 times" in error and "ConnectionError" in error
    assert "hunter2" not in error


async def test_the_deadline_ends_retries_before_the_attempts_do(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """No attempt starts past the deadline from the first claim: the second backoff would."""
    attempts: list[int] = []
    policy = RetryPolicy(attempts=10, initial_backoff=0.4, deadline=1.0)
    await run_one(api, store, clock, flaky_tools(9, attempts, retry=policy, timeout=0.5))
    assert attempts == [1, 2]
    [submission] = api.fake.submissions
    assert submission.success is False and "tried 2 times" in (submission.error or "")


async def test_other_exceptions_and_tools_without_a_policy_are_not_retried(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """Only the policy's transient types are retried; no policy, no retry."""
    attempts: list[int] = []
    await run_one(api, store, clock, flaky_tools(1, attempts))
    assert attempts == [1]
    [submission] = api.fake.submissions
    assert submission.success is False and "tried" not in (submission.error or "")


async def test_retry_later_retries_a_side_effect_tool_at_the_time_it_asked(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """RetryLater(after=7) from a side-effect tool: tried again 7 s later, not in doubt (no
    reconcile hook asked, nothing quarantined), and its reason kept in the history."""
    runs: list[int] = []
    tools = FunctionTools()

    @tools.function(side_effects=True)
    def lookup(ctx: ToolContext, key: str) -> str:
        """Charge once the upstream lets us (429 first)."""
        runs.append(ctx.attempt)
        if len(runs) == 1:
            raise RetryLater(after=7, reason="429 from payments")
        return "charged"

    key = await run_one(api, store, clock, tools)
    assert runs == [1, 2] and clock.sleeps == [7.0]
    [submission] = api.fake.submissions
    assert submission.success is True
    record = await store.get_call(key, history=True)
    assert record is not None
    details = [(e.kind, e.detail) for e in record.history if e.kind == "retry_scheduled"]
    assert details == [("retry_scheduled", "RetryLater: 429 from payments")]


async def test_a_side_effect_tool_is_never_retried_on_another_exception(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    runs: list[int] = []
    tools = FunctionTools()

    @tools.function(side_effects=True)
    def lookup(ctx: ToolContext, key: str) -> str:
        """Charge (the connection drops)."""
        runs.append(ctx.attempt)
        raise ConnectionError("reset")

    await run_one(api, store, clock, tools)
    assert runs == [1]
    [submission] = api.fake.submissions
    assert submission.success is False


async def test_a_scheduled_retry_is_resumed_by_another_replica_at_its_time_never_sooner(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """The replica that scheduled the retry is gone: a sweep before the time leaves it; the
    first sweep after it runs the next attempt (attempt 2), once."""
    key = api.one_call()
    await store.claim_call(key, tool_name="lookup", owner="gone", lease_seconds=30)
    assert await store.schedule_retry(
        key, owner="gone", attempt=1, at=clock() + 60, reason="ConnectionError"
    )
    attempts: list[int] = []
    tools = flaky_tools(0, attempts, retry=FLAKY)
    dispatcher = Dispatcher(
        tools, api.client, store, settings=SETTINGS, owner=OWNER, clock=clock, sleep=clock.sleep
    )
    await dispatcher.start(recover=False)
    try:
        clock.advance(59)
        await dispatcher.sweep()
        await dispatcher.wait_for([key])
        assert attempts == []
        record = await store.get_call(key)
        assert record is not None and record.state is CallState.RETRY_SCHEDULED
        clock.advance(1)
        await dispatcher.sweep()
        await dispatcher.wait_for([key])
    finally:
        await dispatcher.stop(drain_timeout=1.0)
    assert attempts == [2]
    [submission] = api.fake.submissions
    assert submission.success is True


@pytest.mark.parametrize(("fail_times", "success", "lines"), [(2, True, 3), (9, False, 4)])
async def test_the_examples_flaky_lookup_contract(
    api: API,
    store: MemoryStore,
    clock: FakeClock,
    tmp_path: Path,
    fail_times: int,
    success: bool,
    lines: int,
) -> None:
    """The examples' flaky_lookup: one ledger line per execution (attempt k + 1), success on
    attempt 3 for fail_times=2; fail_times=9 ends as a failure after 4, saying so."""
    ledger = Ledger(tmp_path / "ledger.jsonl")
    session_id = api.fake.create_session(
        [[FakeCall("flaky_lookup", {"key": "k1", "fail_times": fail_times}, call_id="c1")]]
    )
    [action] = api.fake.required_actions(session_id)
    key = CallKey(session_id, action["turn_id"], action["call_id"])
    dispatcher = Dispatcher(
        build_tools(),
        api.client,
        store,
        settings=SETTINGS,
        owner=OWNER,
        clock=clock,
        sleep=clock.sleep,
        resources=ExampleResources(ledger=ledger),
    )
    await dispatcher.start(recover=False)
    try:
        await dispatcher.resolve(session_id)
        await dispatcher.wait_for([key])
    finally:
        await dispatcher.stop(drain_timeout=1.0)
    assert [e["attempt"] for e in ledger.entries()] == list(range(1, lines + 1))
    assert clock.sleeps == [pytest.approx(0.2 * 2**n) for n in range(lines - 1)]
    [submission] = api.fake.submissions
    assert submission.success is success
    if success:
        assert json.loads(submission.output or "") == {"key": "k1", "attempts": 3}
    else:
        assert "tried 4 times" in (submission.error or "")


async def test_each_attempt_is_its_own_span_with_its_number(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """Three attempts, three call spans numbered 1, 2, 3: the first two marked with the
    transient error and the retry, the last with its result."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    key = api.one_call()
    dispatcher = Dispatcher(
        flaky_tools(2, [], retry=FLAKY),
        api.client,
        store,
        settings=SETTINGS,
        owner=OWNER,
        clock=clock,
        sleep=clock.sleep,
        telemetry=Telemetry(tracer_provider=provider),
    )
    await dispatcher.start(recover=False)
    try:
        await dispatcher.resolve(key.session_id)
        await dispatcher.wait_for([key])
    finally:
        await dispatcher.stop(drain_timeout=1.0)
        provider.shutdown()
    calls = [s for s in exporter.get_finished_spans() if CALL_ATTEMPT in (s.attributes or {})]
    calls.sort(key=lambda s: s.start_time or 0)
    assert [(s.attributes or {})[CALL_ATTEMPT] for s in calls] == [1, 2, 3]
    assert [(s.attributes or {}).get("error.type") for s in calls] == [
        "transient_error",
        "transient_error",
        None,
    ]


async def test_a_waiting_retry_does_not_hold_up_a_shutdown(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """Stopping while a call waits an hour for its retry ends the wait at once; the retry
    stays scheduled in the store for the next process."""
    tools = FunctionTools()

    @tools.function
    def lookup(key: str) -> str:
        """Rate-limited upstream."""
        raise RetryLater(after=3600, reason="429")

    key = api.one_call()
    dispatcher = Dispatcher(tools, api.client, store, settings=SETTINGS, owner=OWNER, clock=clock)
    await dispatcher.start(recover=False)
    await dispatcher.resolve(key.session_id)
    with anyio.fail_after(30):  # a bound for a hung test, far below the hour and the drain
        while (record := await store.get_call(key)) is None or (
            record.state is not CallState.RETRY_SCHEDULED
        ):
            await anyio.sleep(0.01)
        await dispatcher.stop(drain_timeout=600)
    record = await store.get_call(key)
    assert record is not None and record.state is CallState.RETRY_SCHEDULED
    assert api.fake.submissions == []
