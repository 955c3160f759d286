"""Flow control in the dispatcher (dispatch/execution.py): a tool's ``concurrency=``,
``concurrency_key=``, ``rate=`` and ``max_wait=`` over the memory store and the fake API.
A call the limiter refuses waits in the store (``waiting``) holding no process slot and no
thread, polls, runs once admitted, and fails telling the model the tool is busy once it
waited ``max_wait``."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agentfn_asgi import RetryLater
from agentfn_asgi.calls.records import (
    LIMITER_KEY_SEPARATOR,
    CallKey,
    CallState,
    ClaimOutcome,
    Limit,
)
from agentfn_asgi.dispatch import Dispatcher
from agentfn_asgi.messages import LIMIT_KEY_FAILED_MESSAGE, MAX_WAIT_MESSAGE
from agentfn_asgi.store.memory import MemoryStore
from agentfn_asgi.testing import FakeCall
from agentfn_asgi.tools import FunctionTools, ToolContext
from agentfn_asgi.tracing import Telemetry
from agentfn_asgi.tracing.names import LIMIT_WAITED, METRIC_CALLS_WAITING

from ..support.clock import FakeClock
from .conftest import API, LEASE, OWNER, SETTINGS, dispatching

pytestmark = pytest.mark.anyio


class Peak:
    """How many handler runs overlap, overall and per label."""

    def __init__(self) -> None:
        self.now: dict[str, int] = {}
        self.peak: dict[str, int] = {}
        self.total = self.total_peak = 0
        self.ran: list[str] = []

    async def run(self, label: str, seconds: float = 0.05) -> None:
        self.now[label] = self.now.get(label, 0) + 1
        self.total += 1
        self.peak[label] = max(self.peak.get(label, 0), self.now[label])
        self.total_peak = max(self.total_peak, self.total)
        try:
            await anyio.sleep(seconds)
        finally:
            self.now[label] -= 1
            self.total -= 1
            self.ran.append(label)


def session_of(api: API, calls: list[FakeCall]) -> list[CallKey]:
    """One session whose turn makes ``calls`` in parallel; their keys."""
    session_id = api.fake.create_session([calls])
    return [
        CallKey(session_id, action["turn_id"], action["call_id"])
        for action in api.fake.required_actions(session_id)
    ]


async def answered(api: API, keys: list[CallKey]) -> dict[str, Any]:
    """call id -> its submission, once every key has one."""
    with anyio.fail_after(10):
        while True:
            found = {s.call_id: s for s in api.fake.submissions}
            if all(key.call_id in found for key in keys):
                return found
            await anyio.sleep(0.01)


async def held_by_another_replica(store: MemoryStore, key: CallKey, tool: str) -> ClaimOutcome:
    """Another replica ("replica-b") claims ``key`` and takes the only slot of ``tool``'s
    limiter (``concurrency=1``), as a running call of it would."""
    return await store.claim_call(
        key,
        tool_name=tool,
        owner="replica-b",
        lease_seconds=LEASE,
        limit=Limit(name=tool, concurrency=1),
    )


async def history(store: MemoryStore, key: CallKey) -> list[tuple[str, str]]:
    record = await store.get_call(key, history=True)
    assert record is not None
    return [(event.kind, event.detail) for event in record.history]


async def test_concurrency_one_never_runs_two_at_once_and_answers_all(
    api: API, store: MemoryStore, clock: FakeClock, caplog: pytest.LogCaptureFixture
) -> None:
    """Three calls of a ``concurrency=1`` tool: one at a time, in the order they arrived,
    every one answered; the two that waited say so once in the log and in their history."""
    peak, tools = Peak(), FunctionTools()

    @tools.function(concurrency=1)
    async def lookup(key: str) -> str:
        """Look a key up."""
        await peak.run("lookup")
        return key

    keys = session_of(api, [FakeCall("lookup", {"key": k}, call_id=k) for k in "abc"])
    caplog.set_level(logging.INFO, "agentfn_asgi.dispatch.execution")
    async with dispatching(api, store, clock, tools) as dispatcher:
        await dispatcher.resolve(keys[0].session_id)
        found = await answered(api, keys)
        await dispatcher.wait_for(keys)
    assert peak.peak == {"lookup": 1} and len(peak.ran) == 3
    assert all(found[k.call_id].success for k in keys)
    waited = [k for k in keys if ("waiting", "concurrency") in await history(store, k)]
    assert len(waited) == 2
    for key in waited:
        kinds = [kind for kind, _ in await history(store, key)]
        assert kinds[:3] == ["claimed", "waiting", "admitted"] and "saved" in kinds
    lines = [r.getMessage() for r in caplog.records if "waiting for its limit" in r.getMessage()]
    assert len(lines) == 2, lines  # one line per wait, never one per poll
    assert all("tool=lookup" in line and "reason=concurrency" in line for line in lines)


async def test_a_concurrency_key_limits_each_key_on_its_own(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """``concurrency=1`` per tenant: one call per tenant at a time, the two tenants at once.
    The key function gets the parsed arguments and a context with attempt 0."""
    peak, tools = Peak(), FunctionTools()
    contexts: list[ToolContext] = []
    both, entered = anyio.Event(), []

    async def tenant_of(ctx: ToolContext, arguments: dict[str, Any]) -> str:
        contexts.append(ctx)
        return str(arguments["tenant"])

    @tools.function(concurrency=1, concurrency_key=tenant_of)
    async def report(tenant: str, n: int) -> str:
        """Build a report for a tenant."""
        entered.append(tenant)
        if len(entered) == 2:
            both.set()
        with anyio.move_on_after(2):
            await both.wait()  # the other tenant's call runs meanwhile
        await peak.run(tenant)
        return f"{tenant}{n}"

    calls = [
        FakeCall("report", {"tenant": t, "n": n}, call_id=f"{t}{n}") for t in "xy" for n in (1, 2)
    ]
    keys = session_of(api, calls)
    async with dispatching(api, store, clock, tools) as dispatcher:
        await dispatcher.resolve(keys[0].session_id)
        found = await answered(api, keys)
        await dispatcher.wait_for(keys)
    assert peak.peak == {"x": 1, "y": 1} and peak.total_peak == 2
    assert all(found[k.call_id].success for k in keys)
    assert {c.attempt for c in contexts} == {0} and {c.deadline for c in contexts} == {None}
    record = await store.get_call(keys[0])
    assert record is not None and record.limiter == f"report{LIMITER_KEY_SEPARATOR}x"


async def test_a_key_function_that_raises_fails_the_call_saying_it_did_not_run(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    ran: list[str] = []
    tools = FunctionTools()

    def broken(ctx: ToolContext, arguments: dict[str, Any]) -> str:
        raise KeyError("password=hunter2")

    @tools.function(concurrency=2, concurrency_key=broken)
    def lookup(key: str) -> str:
        """Look a key up."""
        ran.append(key)
        return key

    [key] = session_of(api, [FakeCall("lookup", {"key": "a"})])
    async with dispatching(api, store, clock, tools) as dispatcher:
        await dispatcher.resolve(key.session_id)
        await dispatcher.wait_for([key])
    [submission] = api.fake.submissions
    assert not submission.success and ran == []
    assert submission.error == LIMIT_KEY_FAILED_MESSAGE.format(name="lookup")


async def test_a_rate_spaces_the_starts_by_the_rate(api: API, store: MemoryStore) -> None:
    """``rate='2/s'`` (burst 1): three calls start at least half a second apart (on the
    suite's fake clock, which each pause moves)."""
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    starts: list[float] = []
    tools = FunctionTools()

    @tools.function(rate="2/s")
    async def lookup(key: str) -> str:
        """Look a key up."""
        starts.append(clock())
        return key

    keys = session_of(api, [FakeCall("lookup", {"key": k}, call_id=k) for k in "abc"])
    dispatcher = Dispatcher(
        tools, api.client, store, settings=SETTINGS, owner=OWNER, clock=clock, sleep=clock.sleep
    )
    await dispatcher.start(recover=False)
    try:
        await dispatcher.resolve(keys[0].session_id)
        await answered(api, keys)
        await dispatcher.wait_for(keys)
    finally:
        await dispatcher.stop(drain_timeout=1.0)
    starts.sort()
    assert len(starts) == 3
    assert starts[1] - starts[0] >= 0.5 - 1e-6 and starts[2] - starts[1] >= 0.5 - 1e-6
    details = [event for key in keys for event in await history(store, key)]
    assert ("waiting", "rate") in details


async def test_a_wait_past_max_wait_fails_telling_the_model_the_tool_is_busy(
    api: API, store: MemoryStore
) -> None:
    """The second call of a ``concurrency=1`` tool, its slot held by a running call, fails
    after ``max_wait`` (fake clock) with the busy message; it never ran, and the span says
    how long it waited."""
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    release, started = anyio.Event(), anyio.Event()
    ran: list[str] = []
    tools = FunctionTools()

    @tools.function(concurrency=1, max_wait=5)
    async def lookup(key: str) -> str:
        """Look a key up."""
        ran.append(key)
        started.set()
        await release.wait()
        return key

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    [first] = session_of(api, [FakeCall("lookup", {"key": "a"}, call_id="a")])
    [second] = session_of(api, [FakeCall("lookup", {"key": "b"}, call_id="b")])
    dispatcher = Dispatcher(
        tools,
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
        await dispatcher.resolve(first.session_id)
        with anyio.fail_after(5):
            await started.wait()
        await dispatcher.resolve(second.session_id)
        found = await answered(api, [second])
        release.set()
        await answered(api, [first])
        await dispatcher.wait_for([first, second])
    finally:
        await dispatcher.stop(drain_timeout=1.0)
    busy = found["b"]
    assert not busy.success and busy.error == MAX_WAIT_MESSAGE.format(name="lookup", seconds=5)
    assert ran == ["a"]
    kinds = [kind for kind, _ in await history(store, second)]
    assert kinds == ["claimed", "waiting", "saved", "submitted"]
    [span] = [s for s in exporter.get_finished_spans() if LIMIT_WAITED in (s.attributes or {})]
    attributes = span.attributes or {}
    waited = attributes[LIMIT_WAITED]
    assert attributes["gen_ai.tool.call.id"] == "b"
    assert isinstance(waited, float) and waited >= 5
    assert attributes["agentfn.call.source"] == "limit"


async def test_a_waiting_call_holds_no_process_slot(api: API, store: MemoryStore) -> None:
    """One process slot (``max_concurrency=1``) and a call waiting for its limiter (held by
    another replica): another tool's call still runs and is answered."""
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    tools = FunctionTools()

    @tools.function(concurrency=1)
    def limited(key: str) -> str:
        """Limited."""
        return key

    @tools.function
    def free(key: str) -> str:
        """Not limited."""
        return key

    [held, waiter] = session_of(
        api,
        [FakeCall("limited", {"key": "a"}, call_id="a"), FakeCall("limited", {"key": "b"})],
    )
    [other] = session_of(api, [FakeCall("free", {"key": "c"})])
    # Another replica holds the only slot of `limited` and is running its first call.
    outcome = await held_by_another_replica(store, held, "limited")
    assert outcome.status.value == "claimed"
    settings = dataclasses.replace(SETTINGS, max_concurrency=1)
    async with dispatching(api, store, clock, tools, settings) as dispatcher:
        await dispatcher.resolve(waiter.session_id)
        with anyio.fail_after(5):
            while (record := await store.get_call(waiter)) is None or (
                record.state is not CallState.WAITING
            ):
                await anyio.sleep(0.01)
        await dispatcher.resolve(other.session_id)
        await answered(api, [other])
        record = await store.get_call(waiter)
        assert record is not None and record.state is CallState.WAITING
        assert [s.call_id for s in api.fake.submissions] == [other.call_id]


async def test_a_waiter_whose_replica_died_is_adopted_and_run(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """A call left ``waiting`` by a replica that died (and the slot's holder, dead too): the
    sweep adopts it once its lease lapsed, takes a slot and runs it."""
    ran: list[str] = []
    tools = FunctionTools()

    @tools.function(concurrency=1)
    def lookup(key: str) -> str:
        """Look a key up."""
        ran.append(key)
        return key

    [held, waiter] = session_of(
        api, [FakeCall("lookup", {"key": "a"}, call_id="a"), FakeCall("lookup", {"key": "b"})]
    )
    limit = Limit(name="lookup", concurrency=1)
    for key in (held, waiter):
        await store.claim_call(
            key, tool_name="lookup", owner="gone", lease_seconds=LEASE, limit=limit
        )
    waiting = await store.get_call(waiter)
    assert waiting is not None and waiting.state is CallState.WAITING
    clock.advance(LEASE + SETTINGS.fence_margin + 1)
    async with dispatching(api, store, clock, tools) as dispatcher:
        await dispatcher.sweep()
        found = await answered(api, [held, waiter])
        await dispatcher.wait_for([held, waiter])
    assert found[waiter.call_id].success and sorted(ran) == ["a", "b"]
    kinds = [kind for kind, _ in await history(store, waiter)]
    assert "adopted" in kinds and kinds.index("adopted") > kinds.index("waiting")


async def test_the_gauge_counts_the_calls_waiting_here(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """``agentfn.tool.calls.waiting`` per tool: 1 while a call waits, 0 once it ran."""
    reader = InMemoryMetricReader()
    telemetry = Telemetry(meter_provider=MeterProvider(metric_readers=[reader]))
    tools = FunctionTools()

    @tools.function(concurrency=1)
    def lookup(key: str) -> str:
        """Look a key up."""
        return key

    [held, waiter] = session_of(
        api, [FakeCall("lookup", {"key": "a"}, call_id="a"), FakeCall("lookup", {"key": "b"})]
    )
    await held_by_another_replica(store, held, "lookup")

    def gauge() -> list[tuple[Any, int]]:
        data = reader.get_metrics_data()
        points: list[tuple[Any, int]] = []
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == METRIC_CALLS_WAITING:
                        for point in metric.data.data_points:
                            assert isinstance(point, NumberDataPoint)
                            name = dict(point.attributes or {}).get("gen_ai.tool.name")
                            points.append((name, int(point.value)))
        return points

    dispatcher = Dispatcher(
        tools, api.client, store, settings=SETTINGS, owner=OWNER, clock=clock, telemetry=telemetry
    )
    await dispatcher.start(recover=False)
    try:
        await dispatcher.resolve(waiter.session_id)
        with anyio.fail_after(5):
            while gauge() != [("lookup", 1)]:
                await anyio.sleep(0.01)
        # The other replica's call ends: its slot is free, the waiter runs.
        result = await store.save_result(
            held,
            owner="replica-b",
            attempt=1,
            result=_result(held),
        )
        assert result.state is CallState.SUCCEEDED
        await answered(api, [waiter])
        await dispatcher.wait_for([waiter])
    finally:
        await dispatcher.stop(drain_timeout=1.0)
    assert gauge() == [("lookup", 0)]


def _result(key: CallKey) -> Any:
    from agentfn_asgi.results import encode_result

    return encode_result(key, "done", tool_name="lookup")


async def test_close_stops_a_wait_and_leaves_the_call_waiting_for_another_replica(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    tools = FunctionTools()

    @tools.function(concurrency=1)
    def lookup(key: str) -> str:
        """Look a key up."""
        return key

    [held, waiter] = session_of(
        api, [FakeCall("lookup", {"key": "a"}, call_id="a"), FakeCall("lookup", {"key": "b"})]
    )
    await held_by_another_replica(store, held, "lookup")
    with anyio.fail_after(5):
        async with dispatching(api, store, clock, tools) as dispatcher:
            await dispatcher.resolve(waiter.session_id)
            while (record := await store.get_call(waiter)) is None or (
                record.state is not CallState.WAITING
            ):
                await anyio.sleep(0.01)
    record = await store.get_call(waiter)
    assert record is not None and record.state is CallState.WAITING and record.owner == OWNER
    assert api.fake.submissions == []


async def test_an_operators_rerun_asks_the_limiter_and_waits_its_turn(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    """A call released by an operator (``settle --rerun``) of a limited tool waits while
    another replica holds the slot, then runs, not in doubt."""
    ran: list[str] = []
    tools = FunctionTools()

    @tools.function(concurrency=1)
    def lookup(key: str) -> str:
        """Look a key up."""
        ran.append(key)
        return key

    [held, doubtful] = session_of(
        api, [FakeCall("lookup", {"key": "a"}, call_id="a"), FakeCall("lookup", {"key": "b"})]
    )
    # A replica died running `doubtful` (its claim lapsed, in doubt).
    await store.claim_call(doubtful, tool_name="lookup", owner="gone", lease_seconds=LEASE)
    clock.advance(LEASE + SETTINGS.fence_margin + 1)
    await held_by_another_replica(store, held, "lookup")
    async with dispatching(api, store, clock, tools) as dispatcher:
        status, _ = await dispatcher.settle(doubtful, rerun=True)
        assert status == "running"
        with anyio.fail_after(5):
            while (record := await store.get_call(doubtful)) is None or (
                record.state is not CallState.WAITING
            ):
                await anyio.sleep(0.01)
        assert ran == []
        await store.save_result(held, owner="replica-b", attempt=1, result=_result(held))
        found = await answered(api, [doubtful])
        await dispatcher.wait_for([doubtful])
    assert found[doubtful.call_id].success and ran == ["b"]
    kinds = [kind for kind, _ in await history(store, doubtful)]
    assert kinds[kinds.index("released") :][:3] == ["released", "waiting", "admitted"]


async def test_a_retry_of_a_limited_tool_takes_a_slot_like_any_claim(api: API) -> None:
    """``concurrency=1``: a call asking to be retried frees its slot, the other call runs,
    then the retry claims a slot again; never two at once, both answered."""
    # Real time: a fake clock's sleeps would also jump the waiter's polls forward, past the
    # running call's lease, and admit the waiter beside it (a lapsed holder frees its slot).
    store = MemoryStore()
    peak, attempts = Peak(), []
    tools = FunctionTools()

    @tools.function(concurrency=1)
    async def lookup(ctx: ToolContext, key: str) -> str:
        """Look a key up."""
        attempts.append((key, ctx.attempt))
        await peak.run("lookup", 0.01)
        if (key, ctx.attempt) == ("a", 1):
            raise RetryLater(after=0.2, reason="busy upstream")
        return key

    keys = session_of(api, [FakeCall("lookup", {"key": k}, call_id=k) for k in "ab"])
    dispatcher = Dispatcher(tools, api.client, store, settings=SETTINGS, owner=OWNER)
    await dispatcher.start(recover=False)
    try:
        await dispatcher.resolve(keys[0].session_id)
        found = await answered(api, keys)
        await dispatcher.wait_for(keys)
    finally:
        await dispatcher.stop(drain_timeout=1.0)
    assert peak.peak == {"lookup": 1}
    assert found["a"].success and found["b"].success
    assert sorted(attempts) == [("a", 1), ("a", 2), ("b", 1)]
    record = await store.get_call(keys[0])
    assert record is not None and record.limiter == "lookup"


async def test_arguments_that_do_not_parse_fail_validation_without_asking_the_key(
    api: API, store: MemoryStore, clock: FakeClock
) -> None:
    asked: list[dict[str, Any]] = []
    tools = FunctionTools()

    def tenant_of(ctx: ToolContext, arguments: dict[str, Any]) -> str:
        asked.append(arguments)
        return "t"

    @tools.function(concurrency=1, concurrency_key=tenant_of)
    def lookup(key: str) -> str:
        """Look a key up."""
        return key

    [key] = session_of(api, [FakeCall("lookup", {"key": 7})])
    async with dispatching(api, store, clock, tools) as dispatcher:
        await dispatcher.resolve(key.session_id)
        await dispatcher.wait_for([key])
    [submission] = api.fake.submissions
    assert not submission.success and asked == []
    record = await store.get_call(key)
    assert record is not None and record.result is not None and record.limiter is None
    assert record.result.error_type == "validation_error"
