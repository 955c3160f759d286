"""Durable human approval (issue 23) in process, over the memory store and the fake API:
a call of an ``approval=`` tool waits for a person, runs once when approved, fails with the
reason when denied, fails saying so when nobody decided in time, and is never asked for or
run twice by a redelivery."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentfn_asgi.backoff import Backoff
from agentfn_asgi.calls.records import CallKey, CallRecord, CallState, arguments_digest
from agentfn_asgi.cli import main
from agentfn_asgi.dispatch.approvals import ApprovalView
from agentfn_asgi.errors import (
    ApprovalDecidedError,
    ApprovalExpiredError,
    ApprovalNotFoundError,
    ToolDefinitionError,
)
from agentfn_asgi.store import Store
from agentfn_asgi.store.memory import MemoryStore
from agentfn_asgi.testing import Connection, FakeCall
from agentfn_asgi.tools import FunctionTools, ToolContext

from .support.stack import API_KEY, FAST, running_stack

pytestmark = pytest.mark.anyio

SETTINGS = dataclasses.replace(FAST, approval_poll_interval=0.05)


def account_tools(ran: list[str], **options: Any) -> FunctionTools:
    tools = FunctionTools()

    @tools.function(side_effects=True, approval=options.pop("approval", True), **options)
    def close_account(ctx: ToolContext, account_id: str) -> dict[str, Any]:
        """Close a customer's account."""
        ran.append(ctx.call_id)
        return {"closed": True, "account_id": account_id}

    @tools.reconciler("close_account")
    def closed_already(ctx: ToolContext, account_id: str) -> Any:
        from agentfn_asgi.tools import NotRun, Ran

        if ctx.call_id in ran:
            return Ran({"closed": True, "account_id": account_id})
        return NotRun()

    return tools


async def record_of(store: Store, session_id: str, call_id: str) -> CallRecord | None:
    for record in await store.calls_for_session(session_id):
        if record.key.call_id == call_id:
            return record
    return None


async def until_state(stack: Connection, sid: str, call_id: str, *states: CallState) -> CallRecord:
    with anyio.fail_after(10):
        while True:
            record = await record_of(stack.store, sid, call_id)
            if record is not None and record.state in states:
                return record
            await anyio.sleep(0.02)


async def submitted(stack: Connection, call_id: str) -> Any:
    with anyio.fail_after(10):
        while not [s for s in stack.fake.submissions if s.call_id == call_id]:
            await anyio.sleep(0.02)
    return next(s for s in stack.fake.submissions if s.call_id == call_id)


async def test_the_cli_shows_what_is_being_decided_with_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``approvals`` listed requests without their arguments: a person deciding in the
    terminal could not see what they approve. ``--content`` reads them from the live
    session (they are not stored); ``--json --content`` adds ``arguments``."""
    url = f"sqlite:///{tmp_path / 'store.sqlite3'}"
    async with running_stack(
        account_tools([]), store=url, settings=SETTINGS, loopback=True
    ) as stack:
        sid = stack.fake.create_session(
            [[FakeCall("close_account", {"account_id": "acc_42"}, call_id="call_c")]]
        )
        record = await until_state(stack, sid, "call_c", CallState.AWAITING_APPROVAL)
        assert record.approval is not None
        monkeypatch.setenv("OPENAI_API_KEY", API_KEY)
        monkeypatch.setenv("OPENAI_BASE_URL", stack.client.base_url)
        listing = ["approvals", "--content", "--store", url]
        assert await anyio.to_thread.run_sync(main, listing) == 0
        line = f'{record.approval.approval_id}  arguments {{"account_id": "acc_42"}}'
        assert line in capsys.readouterr().out
        assert await anyio.to_thread.run_sync(main, [*listing, "--json"]) == 0
        [item] = json.loads(capsys.readouterr().out)
        assert json.loads(item["arguments"]) == {"account_id": "acc_42"}
        monkeypatch.delenv("OPENAI_API_KEY")
        assert await anyio.to_thread.run_sync(main, listing) == 0
        assert "arguments (unread: it needs OPENAI_API_KEY" in capsys.readouterr().out


async def test_a_held_call_runs_once_when_approved_and_the_decision_is_taken_once() -> None:
    """Nothing runs while the call waits; approve runs it once (a fresh attempt, not in
    doubt) and the result is accepted; a second approval is refused, naming the first."""
    ran: list[str] = []
    async with running_stack(account_tools(ran), settings=SETTINGS) as stack:
        sid = stack.fake.create_session(
            [[FakeCall("close_account", {"account_id": "acc_1"}, call_id="c1")]]
        )
        waiting = await until_state(stack, sid, "c1", CallState.AWAITING_APPROVAL)
        assert ran == [] and stack.fake.submissions == []
        request = waiting.approval
        assert request is not None and request.tool_name == "close_account"
        assert request.digest == arguments_digest({"account_id": "acc_1"})
        assert request.expires_at - request.requested_at == pytest.approx(24 * 3600)

        views = await stack.app.operator().approvals()
        assert [v.approval_id for v in views] == [request.approval_id]

        decided = await stack.app.approve(request.approval_id, by="alice")
        assert decided.decision == "approved" and decided.decided_by == "alice"
        submission = await submitted(stack, "c1")
        assert submission.success and '"closed":true' in submission.output
        assert ran == ["c1"]
        with pytest.raises(ApprovalDecidedError, match="already decided: approved by alice"):
            await stack.app.approve(request.approval_id, by="bob")
        with pytest.raises(ApprovalNotFoundError):
            await stack.app.approve("apr_nope", by="bob")
        detail = await stack.app.operator().call("c1", session_id=sid)
    kinds = [e.kind for e in detail.history]
    assert kinds == [
        "claimed",
        "approval_requested",
        "approved",
        "claimed_approved",
        "saved",
        "submitted",
    ]
    assert "by=alice via=api" in detail.history[2].detail
    assert detail.approval is not None and detail.approval.decision == "approved"
    assert ran == ["c1"]


async def test_a_denied_call_never_runs_and_the_model_gets_the_reason() -> None:
    ran: list[str] = []
    async with running_stack(account_tools(ran), settings=SETTINGS) as stack:
        sid = stack.fake.create_session(
            [[FakeCall("close_account", {"account_id": "acc_2"}, call_id="d1")]]
        )
        waiting = await until_state(stack, sid, "d1", CallState.AWAITING_APPROVAL)
        assert waiting.approval is not None
        await stack.app.deny(waiting.approval.approval_id, reason="customer has a balance", by="bo")
        submission = await submitted(stack, "d1")
        with pytest.raises(ApprovalDecidedError, match="denied by bo"):
            await stack.app.approve(waiting.approval.approval_id, by="alice")
    assert not submission.success
    assert "denied" in submission.error and "customer has a balance" in submission.error
    assert ran == []


async def test_nobody_deciding_in_time_fails_the_call_saying_so() -> None:
    ran: list[str] = []
    async with running_stack(account_tools(ran, approval_timeout=0.3), settings=SETTINGS) as stack:
        sid = stack.fake.create_session(
            [[FakeCall("close_account", {"account_id": "acc_3"}, call_id="e1")]]
        )
        waiting = await until_state(stack, sid, "e1", CallState.AWAITING_APPROVAL)
        submission = await submitted(stack, "e1")
        assert waiting.approval is not None
        with pytest.raises(ApprovalExpiredError):
            await stack.app.approve(waiting.approval.approval_id, by="late")
        record = await stack.store.get_call(waiting.key, history=True)
    assert not submission.success and "nobody approved it in time" in submission.error
    assert ran == []
    assert record is not None and record.approval is not None
    assert record.approval.decision == "expired"
    assert "approval_expired" in [e.kind for e in record.history]


async def test_bad_arguments_fail_as_usual_and_ask_nobody() -> None:
    ran: list[str] = []
    async with running_stack(account_tools(ran), settings=SETTINGS) as stack:
        sid = stack.fake.create_session(
            [[FakeCall("close_account", {"account_id": 7}, call_id="v1")]]
        )
        submission = await submitted(stack, "v1")
        record = await record_of(stack.store, sid, "v1")
    assert not submission.success and record is not None and record.approval is None


async def test_a_predicate_asks_only_when_it_says_so() -> None:
    """``approval=`` a callable: the refund over the limit waits, the small one runs."""
    ran: list[str] = []
    seen: list[tuple[str, dict[str, Any]]] = []

    async def over_limit(ctx: ToolContext, arguments: dict[str, Any]) -> bool:
        seen.append((ctx.call_id, arguments))
        return bool(arguments["account_id"].startswith("big_"))

    async with running_stack(account_tools(ran, approval=over_limit), settings=SETTINGS) as stack:
        sid = stack.fake.create_session(
            [
                [
                    FakeCall("close_account", {"account_id": "small_1"}, call_id="p1"),
                    FakeCall("close_account", {"account_id": "big_1"}, call_id="p2"),
                ]
            ]
        )
        await submitted(stack, "p1")
        await until_state(stack, sid, "p2", CallState.AWAITING_APPROVAL)
    assert ran == ["p1"]
    assert sorted(seen) == [("p1", {"account_id": "small_1"}), ("p2", {"account_id": "big_1"})]


async def test_a_redelivery_neither_asks_again_nor_runs_it() -> None:
    """The fake redelivers the session's webhook; the sweep runs: one request, nothing run,
    and the host's hook heard of it once (after a failure, retried)."""
    ran: list[str] = []
    heard: list[ApprovalView] = []

    async def on_request(view: ApprovalView) -> None:
        heard.append(view)
        if len(heard) == 1:
            raise RuntimeError("chat is down")

    async with running_stack(
        account_tools(ran), settings=SETTINGS, on_approval_request=on_request
    ) as stack:
        sid = stack.fake.create_session(
            [[FakeCall("close_account", {"account_id": "acc_4"}, call_id="r1")]]
        )
        first = await until_state(stack, sid, "r1", CallState.AWAITING_APPROVAL)
        for _ in range(3):
            stack.fake.redeliver(sid)
            await stack.app.recover()
        again = await record_of(stack.store, sid, "r1")
        with anyio.fail_after(10):
            while len(heard) < 2:
                await anyio.sleep(0.02)
    assert again is not None and again.state is CallState.AWAITING_APPROVAL
    assert again.approval == first.approval and ran == []
    assert first.approval is not None
    assert [v.approval_id for v in heard] == [first.approval.approval_id] * 2
    assert heard[0].session_id == sid and heard[0].call_id == "r1"


async def test_a_cancelled_turn_withdraws_the_request_and_nothing_runs() -> None:
    """The turn is cancelled while a person has not decided: its idle webhook makes the app
    read the session, the call is cancelled (why, and that it was withdrawn while it waited
    for a person), the request leaves the list and refuses decisions."""
    ran: list[str] = []
    async with running_stack(account_tools(ran), settings=SETTINGS) as stack:
        sid = stack.fake.create_session(
            [[FakeCall("close_account", {"account_id": "acc_6"}, call_id="s2")]]
        )
        other = await until_state(stack, sid, "s2", CallState.AWAITING_APPROVAL)
        stack.fake.cancel_turn(sid)
        cancelled = await until_state(stack, sid, "s2", CallState.CANCELLED)
        assert cancelled.reason == (
            "the turn was cancelled; withdrawn while it waited for a person's approval"
        )
        assert other.approval is not None
        assert isinstance(stack.store, MemoryStore)
        assert await stack.store.waiting_approvals() == []
        with pytest.raises(ApprovalDecidedError, match="no longer waits: the call is cancelled"):
            await stack.app.approve(other.approval.approval_id, by="alice")
    assert ran == [] and stack.fake.submissions == []


async def test_an_approval_taken_before_the_cancellation_was_heard_runs_nothing() -> None:
    """No idle webhook reaches the app: an approval taken after the turn was cancelled
    runs nothing (the replica about to run it reads the session and cancels the call);
    the decided request then refuses another decision."""
    ran: list[str] = []
    async with running_stack(account_tools(ran), settings=SETTINGS, webhooks=False) as stack:
        sid = stack.fake.create_session(
            [[FakeCall("close_account", {"account_id": "acc_5"}, call_id="s1")]]
        )
        await stack.app.dispatcher.recover(sid)
        waiting = await until_state(stack, sid, "s1", CallState.AWAITING_APPROVAL)
        stack.fake.cancel_turn(sid)
        assert waiting.approval is not None
        await stack.app.approve(waiting.approval.approval_id, by="alice")
        cancelled = await until_state(stack, sid, "s1", CallState.CANCELLED)
        assert cancelled.reason is not None and "after its approval" in cancelled.reason
        with pytest.raises(ApprovalDecidedError, match="already decided: approved by alice"):
            await stack.app.deny(waiting.approval.approval_id, by="bob")
    assert ran == [] and stack.fake.submissions == []


async def test_an_approved_call_is_claimed_by_one_replica_only() -> None:
    """Two instances over one store: one claim of the approved call wins."""
    store = MemoryStore()
    other = store.sharing("")
    key = CallKey("s", "t", "c")
    await store.claim_call(key, tool_name="close_account", owner="a", lease_seconds=30)
    from agentfn_asgi.calls.records import ApprovalRequest

    request = ApprovalRequest(
        approval_id="apr_1",
        tool_name="close_account",
        digest="d",
        requested_at=0.0,
        expires_at=store._clock() + 60,
    )
    held = await store.request_approval(key, owner="a", attempt=1, request=request)
    assert held.state is CallState.AWAITING_APPROVAL and held.lease_expires_at == request.expires_at
    approved = await other.decide_approval(
        key, approval_id="apr_1", decision="approved", by="x", via="cli"
    )
    assert approved is not None and approved.state is CallState.APPROVED
    assert (
        await store.decide_approval(
            key, approval_id="apr_1", decision="approved", by="y", via="cli"
        )
        is None
    )
    claims = [
        await s.claim_approved(key, owner=name, lease_seconds=30)
        for s, name in ((store, "a"), (other, "b"))
    ]
    assert [c is not None for c in claims] == [True, False]
    assert claims[0] is not None and claims[0].attempt == 2 and claims[0].owner == "a"


def test_approval_options_are_checked_at_registration() -> None:
    tools = FunctionTools()

    def tool(account_id: str) -> str:
        """A tool."""
        return account_id

    with pytest.raises(ToolDefinitionError, match="approval must be"):
        tools.add(tool, approval="yes")  # type: ignore[arg-type]
    with pytest.raises(ToolDefinitionError, match="approval_timeout= only applies"):
        tools.add(tool, approval_timeout=5)
    with pytest.raises(ToolDefinitionError, match="positive"):
        tools.add(tool, approval=True, approval_timeout=0)
    assert tools.add(tool, approval=True, approval_timeout=60).approval_timeout == 60.0


async def test_the_span_the_log_and_the_metrics_tell_who_decided(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The run's execute_tool span notes the approval (id, decision, who, how, how long it
    waited); the decision's log line names them; the gauge counts waiting requests and the
    histogram records the time to the decision."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from agentfn_asgi.tracing import Telemetry

    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = Telemetry(
        tracer_provider=tracer_provider, meter_provider=MeterProvider(metric_readers=[reader])
    )
    ran: list[str] = []
    caplog.set_level("INFO", logger="agentfn_asgi")
    async with running_stack(account_tools(ran), settings=SETTINGS, telemetry=telemetry) as stack:
        sid = stack.fake.create_session(
            [[FakeCall("close_account", {"account_id": "acc_t"}, call_id="t1")]]
        )
        waiting = await until_state(stack, sid, "t1", CallState.AWAITING_APPROVAL)
        assert waiting.approval is not None
        with anyio.fail_after(10):  # counted at the sweep's pace
            while _gauge(reader) != [1]:
                await anyio.sleep(0.02)
        await stack.app.approve(waiting.approval.approval_id, by="carol")
        await submitted(stack, "t1")
    runs = [
        s
        for s in exporter.get_finished_spans()
        if s.name == "execute_tool close_account"
        and (s.attributes or {}).get("agentfn.approval.decision") == "approved"
    ]
    assert len(runs) == 1
    attributes = runs[0].attributes or {}
    assert attributes["agentfn.approval.id"] == waiting.approval.approval_id
    assert attributes["agentfn.approval.decided_by"] == "carol"
    assert attributes["agentfn.approval.decided_via"] == "api"
    held = [
        s
        for s in exporter.get_finished_spans()
        if (s.attributes or {}).get("agentfn.call.source") == "approval"
    ]
    assert len(held) == 1
    histogram = _metrics(reader)["agentfn.approval.time_to_decision"]
    [point] = histogram.data.data_points
    assert point.count == 1 and dict(point.attributes or {}) == {
        "agentfn.approval.decision": "approved"
    }
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("approval ")]
    assert any("approved" in line and "by=carol via=api" in line for line in lines), lines


class _ListCounting(MemoryStore):
    """A memory store that counts the waiting requests its listings hand out."""

    listed = 0

    async def waiting_approvals(
        self, *, expired_by: float | None = None, limit: int = 100
    ) -> list[CallRecord]:
        found = await super().waiting_approvals(expired_by=expired_by, limit=limit)
        self.listed += len(found)
        return found


async def test_the_gauge_counts_the_waiting_requests_without_reading_them() -> None:
    """Every replica sets the gauge at the sweep's pace: from the store's count, never by
    reading the rows of every waiting request (it read up to 10,000 of them)."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from agentfn_asgi.calls.records import ApprovalRequest
    from agentfn_asgi.tracing import Telemetry

    store = _ListCounting()
    now = store._clock()
    for i in range(1000):
        key = CallKey("s_gauge", "t", f"c{i}")
        await store.claim_call(key, tool_name="close_account", owner="a", lease_seconds=30)
        request = ApprovalRequest(
            approval_id=f"apr_{i}",
            tool_name="close_account",
            digest="d" * 64,
            requested_at=now,
            expires_at=now + 3600,
        )
        await store.request_approval(key, owner="a", attempt=1, request=request)
    reader = InMemoryMetricReader()
    telemetry = Telemetry(meter_provider=MeterProvider(metric_readers=[reader]))
    async with running_stack(
        account_tools([]), store=store, settings=SETTINGS, telemetry=telemetry
    ):
        with anyio.fail_after(10):
            while _gauge(reader) != [1000]:
                await anyio.sleep(0.02)
    assert store.listed == 0


def _gauge(reader: Any) -> list[Any]:
    gauge = _metrics(reader).get("agentfn.approvals.waiting")
    return [] if gauge is None else [p.value for p in gauge.data.data_points]


def _metrics(reader: Any) -> dict[str, Any]:
    data = reader.get_metrics_data()
    found: dict[str, Any] = {}
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                found[metric.name] = metric
    return found


def test_status_counts_the_waiting_requests() -> None:
    from agentfn_asgi.cli.ops import format_overview
    from agentfn_asgi.operator import Overview

    overview = Overview(
        store="memory://",
        healthy=True,
        deliveries=0,
        unresolved_deliveries=0,
        calls_by_state={"awaiting_approval": 2},
        approvals_waiting=2,
    )
    assert "approvals       2 waiting (agentfn-asgi approvals)" in format_overview(overview, now=0)


async def test_an_approved_call_asking_to_be_retried_reruns_without_a_second_approval() -> None:
    """An approved call whose handler raises RetryLater is tried again at its time, still
    approved: nobody is asked twice, and the second attempt's result is the answer."""
    from agentfn_asgi import RetryLater

    attempts: list[int] = []
    tools = FunctionTools()

    @tools.function(approval=True)
    def transfer(ctx: ToolContext, amount: int) -> str:
        """Transfer money."""
        attempts.append(ctx.attempt)
        if len(attempts) == 1:
            raise RetryLater(after=0.05, reason="bank busy")
        return f"sent {amount}"

    async with running_stack(tools, settings=SETTINGS) as stack:
        sid = stack.fake.create_session([[FakeCall("transfer", {"amount": 5}, call_id="r1")]])
        waiting = await until_state(stack, sid, "r1", CallState.AWAITING_APPROVAL)
        assert waiting.approval is not None
        await stack.app.approve(waiting.approval.approval_id, by="alice")
        submission = await submitted(stack, "r1")
        record = await stack.store.get_call(waiting.key, history=True)
    assert submission.success and "sent 5" in submission.output
    assert len(attempts) == 2
    assert record is not None
    kinds = [e.kind for e in record.history]
    assert kinds.count("approval_requested") == 1 and "retry_scheduled" in kinds


async def test_an_approved_call_of_a_limited_tool_waits_for_its_turn_then_runs() -> None:
    """``approval=`` with ``concurrency=1``: once approved, the call asks its limiter like
    any claim (its slot held by another replica's call: it waits), then runs, approved."""
    from agentfn_asgi.calls.records import Limit

    ran: list[str] = []
    tools = FunctionTools()

    @tools.function(approval=True, concurrency=1)
    def transfer(ctx: ToolContext, amount: int) -> str:
        """Transfer money."""
        ran.append(ctx.call_id)
        return f"sent {amount}"

    async with running_stack(tools, settings=SETTINGS) as stack:
        sid = stack.fake.create_session(
            [
                [
                    FakeCall("transfer", {"amount": 5}, call_id="l1"),
                    FakeCall("transfer", {"amount": 6}, call_id="l2"),
                ]
            ]
        )
        first = await until_state(stack, sid, "l1", CallState.AWAITING_APPROVAL)
        other = await until_state(stack, sid, "l2", CallState.AWAITING_APPROVAL)
        assert first.approval is not None and other.approval is not None
        # Another replica holds the tool's only slot (a call of another session).
        blocker = CallKey("sess_other", "turn", "call")
        limit = Limit(name="transfer", concurrency=1)
        await stack.store.claim_call(
            blocker, tool_name="transfer", owner="replica-b", lease_seconds=60, limit=limit
        )
        await stack.app.approve(first.approval.approval_id, by="alice")
        await until_state(stack, sid, "l1", CallState.WAITING)
        assert ran == []
        await stack.store.quarantine(blocker, owner="replica-b", attempt=1, reason="freed")
        submission = await submitted(stack, "l1")
        record = await stack.store.get_call(first.key, history=True)
    assert submission.success and ran == ["l1"]
    assert record is not None
    kinds = [e.kind for e in record.history]
    assert kinds[kinds.index("claimed_approved") :][:3] == [
        "claimed_approved",
        "waiting",
        "admitted",
    ]


async def test_an_approved_call_whose_session_was_deleted_is_cancelled_not_polled() -> None:
    """Sessions deleted while their calls waited: once approved, those calls are cancelled
    (their session reads 404) instead of staying approved and read on every poll; the call
    approved beside them runs."""
    ran: list[str] = []
    quick_404 = dataclasses.replace(SETTINGS, not_found_retries=(0.05,))
    async with running_stack(account_tools(ran), settings=quick_404) as stack:
        fake = stack.fake
        sids = [
            fake.create_session(
                [[FakeCall("close_account", {"account_id": f"a{i}"}, call_id=f"c{i}")]]
            )
            for i in range(3)
        ]
        waiting = [
            await until_state(stack, sid, f"c{i}", CallState.AWAITING_APPROVAL)
            for i, sid in enumerate(sids)
        ]
        fake.delete_session(sids[0])
        fake.delete_session(sids[1])
        for record in waiting:
            assert record.approval is not None
            await stack.app.approve(record.approval.approval_id, by="alice")
        await submitted(stack, "c2")
        for i in (0, 1):
            gone = await until_state(stack, sids[i], f"c{i}", CallState.CANCELLED)
            assert gone.reason is not None and gone.reason.startswith("the session was deleted")
        reads = len(fake.requests)
        await anyio.sleep(0.5)  # ten polls: nobody reads the deleted sessions again
        assert [r for r in fake.requests[reads:] if sids[0] in r.path or sids[1] in r.path] == []
    assert ran == ["c2"]


async def test_an_approved_call_whose_session_cannot_be_read_is_retried_with_pauses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The session read fails (403, an outage): the approved call waits and is read again
    after pauses that double, not on every poll; it runs once the read works."""
    from agentfn_asgi.dispatch import approvals

    monkeypatch.setattr(approvals, "REREAD", Backoff(base=0.4, cap=60.0))
    ran: list[str] = []
    async with running_stack(account_tools(ran), settings=SETTINGS) as stack:
        fake = stack.fake
        sid = fake.create_session([[FakeCall("close_account", {"account_id": "a"}, call_id="c")]])
        record = await until_state(stack, sid, "c", CallState.AWAITING_APPROVAL)
        assert record.approval is not None
        fake.fail_next("retrieve", 10_000, 403)
        reads = len(fake.requests)
        await stack.app.approve(record.approval.approval_id, by="alice")
        await anyio.sleep(1.0)  # twenty polls; reads at 0, 0.4 and 1.2 s
        failed = [r for r in fake.requests[reads:] if r.route == "retrieve"]
        assert len(failed) <= 3, len(failed)  # on every poll: about twenty
        assert (await until_state(stack, sid, "c", CallState.APPROVED)).state is CallState.APPROVED
        fake.faults.failures["retrieve"].clear()
        await submitted(stack, "c")
    assert ran == ["c"]


async def test_the_approval_request_does_not_use_up_a_retry_attempt() -> None:
    """With ``RetryPolicy(attempts=2)``, an approved call whose handler keeps failing with a
    transient error runs twice, and the model is told it was tried 2 times: asking for the
    approval ran nothing, so it is no attempt (``ctx.attempt`` counts the runs: 1, then 2)."""
    from agentfn_asgi import RetryPolicy

    runs: list[int] = []
    tools = FunctionTools()

    @tools.function(
        approval=True, retry=RetryPolicy(attempts=2, initial_backoff=0.05, transient=(OSError,))
    )
    def transfer(ctx: ToolContext, amount: int) -> str:
        """Transfer money."""
        runs.append(ctx.attempt)
        raise OSError("bank unreachable")

    async with running_stack(tools, settings=SETTINGS) as stack:
        sid = stack.fake.create_session([[FakeCall("transfer", {"amount": 5}, call_id="t2")]])
        waiting = await until_state(stack, sid, "t2", CallState.AWAITING_APPROVAL)
        assert waiting.approval is not None
        await stack.app.approve(waiting.approval.approval_id, by="alice")
        submission = await submitted(stack, "t2")
    assert not submission.success and "tried 2 times" in (submission.error or "")
    assert runs == [1, 2]


async def test_a_retry_deadline_counts_from_the_approval_not_from_the_request() -> None:
    """``RetryPolicy(deadline=...)`` bounds the retries of the runs: a call that waited for
    its approval longer than the deadline is still retried after it was approved."""
    from agentfn_asgi import RetryPolicy

    runs: list[int] = []
    tools = FunctionTools()

    @tools.function(
        approval=True,
        timeout=0.5,
        retry=RetryPolicy(attempts=3, initial_backoff=0.05, deadline=1.0, transient=(OSError,)),
    )
    def transfer(ctx: ToolContext, amount: int) -> str:
        """Transfer money."""
        runs.append(ctx.attempt)
        if len(runs) == 1:
            raise OSError("bank unreachable")
        return "sent"

    async with running_stack(tools, settings=SETTINGS) as stack:
        sid = stack.fake.create_session([[FakeCall("transfer", {"amount": 5}, call_id="t3")]])
        waiting = await until_state(stack, sid, "t3", CallState.AWAITING_APPROVAL)
        assert waiting.approval is not None
        await anyio.sleep(1.2)  # the person takes longer than the deadline to decide
        await stack.app.approve(waiting.approval.approval_id, by="alice")
        submission = await submitted(stack, "t3")
    assert submission.success and runs == [1, 2]
