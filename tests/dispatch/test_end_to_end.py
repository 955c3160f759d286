"""End-to-end behaviour of the dispatcher through the app, in process, against FakeAgentsAPI
(issue 4); its parts alone are in this folder's other modules."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentfn_asgi.calls.records import CallRecord, CallState
from agentfn_asgi.dispatch import DispatchSettings
from agentfn_asgi.errors import ToolError
from agentfn_asgi.messages import IN_DOUBT_MESSAGE
from agentfn_asgi.store import Store, open_store
from agentfn_asgi.testing import (
    Connection,
    FakeAgentsAPI,
    FakeCall,
    action_required_event,
    connect,
    signed_delivery,
)
from agentfn_asgi.tools import FunctionTools, NotRun, Ran, ToolContext

from ..support.stack import API_KEY, APP_URL, FAST, SECRET, running_stack

pytestmark = pytest.mark.anyio


def customer_tools(counter: dict[str, int] | None = None) -> FunctionTools:
    tools = FunctionTools()
    calls = counter if counter is not None else {}

    @tools.function
    def get_customer(customer_id: str) -> dict[str, Any]:
        """Look up a customer by ID."""
        calls["get_customer"] = calls.get("get_customer", 0) + 1
        if customer_id == "123":
            return {"found": True, "customer": {"name": "Example Customer", "plan": "pro"}}
        return {"found": False, "customer": None}

    @tools.function
    async def slow_echo(text: str, delay_ms: int) -> str:
        """Echo text after a delay."""
        calls["slow_echo"] = calls.get("slow_echo", 0) + 1
        await anyio.sleep(delay_ms / 1000)
        return text

    return tools


def outputs(fake: FakeAgentsAPI) -> dict[str, Any]:
    return {s.call_id: (s.success, s.output if s.success else s.error) for s in fake.submissions}


async def test_round_trip_submits_the_handler_output() -> None:
    """One call: webhook → session read → handler → tool_result with compact JSON output."""
    async with running_stack(customer_tools()) as stack:
        sid = stack.fake.create_session(
            [[FakeCall("get_customer", {"customer_id": "123"}, call_id="c1")]]
        )
        await stack.fake.wait_idle(sid, timeout=5)
    assert outputs(stack.fake) == {
        "c1": (True, '{"found":true,"customer":{"name":"Example Customer","plan":"pro"}}')
    }


async def test_parallel_calls_and_multi_step_turns() -> None:
    """Parallel calls in one step all run; the next step's calls follow; the session ends idle."""
    async with running_stack(customer_tools()) as stack:
        sid = stack.fake.create_session(
            [
                [
                    FakeCall("slow_echo", {"text": "a", "delay_ms": 50}, call_id="p1"),
                    FakeCall("slow_echo", {"text": "b", "delay_ms": 50}, call_id="p2"),
                    FakeCall("get_customer", {"customer_id": "9"}, call_id="p3"),
                ],
                [FakeCall("slow_echo", {"text": "c", "delay_ms": 1}, call_id="s2")],
            ]
        )
        await stack.fake.wait_idle(sid, timeout=5)
    assert outputs(stack.fake) == {
        "p1": (True, "a"),
        "p2": (True, "b"),
        "p3": (True, '{"found":false,"customer":null}'),
        "s2": (True, "c"),
    }


async def test_concurrent_duplicate_deliveries_run_the_handler_once() -> None:
    """The same delivery posted 20 times at once, plus 5 distinct deliveries: one execution."""
    counter: dict[str, int] = {}
    async with running_stack(customer_tools(counter)) as stack:
        sid = stack.fake.create_session(
            [[FakeCall("slow_echo", {"text": "x", "delay_ms": 100}, call_id="d1")]]
        )
        body, headers = signed_delivery(SECRET, action_required_event(sid))
        others = [signed_delivery(SECRET, action_required_event(sid)) for _ in range(5)]
        answers = await asyncio.gather(
            *(stack.post_webhook(body, headers) for _ in range(20)),
            *(stack.post_webhook(b, h) for b, h in others),
        )
        await stack.fake.wait_idle(sid, timeout=5)
    assert all(a.status_code == 200 for a in answers)
    assert sorted(a.json()["status"] for a in answers).count("accepted") >= 1
    assert counter["slow_echo"] == 1
    assert [s.call_id for s in stack.fake.submissions] == ["d1"]


async def test_redelivery_for_an_answered_call_submits_nothing_new() -> None:
    """A new delivery id for a session whose call was answered neither runs nor submits."""
    counter: dict[str, int] = {}
    async with running_stack(customer_tools(counter)) as stack:
        sid = stack.fake.create_session(
            [[FakeCall("get_customer", {"customer_id": "1"}, call_id="r1")]]
        )
        await stack.fake.wait_idle(sid, timeout=5)
        body, headers = signed_delivery(SECRET, action_required_event(sid))
        answer = await stack.post_webhook(body, headers)
        assert answer.json()["status"] == "accepted"
        await anyio.sleep(0.2)
    assert counter["get_customer"] == 1
    assert len(stack.fake.submissions) == 1


async def test_api_faults_on_read_and_submit_are_recovered() -> None:
    """503s on the session read and 429 (Retry-After) on submit are retried to success."""
    async with running_stack(customer_tools()) as stack:
        stack.fake.fail_next("retrieve", 2, 503)
        stack.fake.fail_next("submit", 2, 429, retry_after=0.01)
        sid = stack.fake.create_session(
            [[FakeCall("get_customer", {"customer_id": "123"}, call_id="f1")]]
        )
        await stack.fake.wait_idle(sid, timeout=5)
    assert list(outputs(stack.fake)) == ["f1"]


async def test_the_registration_race_is_recovered() -> None:
    """A 400 "Unknown pending tool call" for a call that is pending is retried, then accepted."""
    async with running_stack(customer_tools()) as stack:
        stack.fake.race_once("race1")
        sid = stack.fake.create_session(
            [[FakeCall("get_customer", {"customer_id": "123"}, call_id="race1")]]
        )
        await stack.fake.wait_idle(sid, timeout=5)
    assert list(outputs(stack.fake)) == ["race1"]


async def test_a_cancelled_turn_leaves_the_result_stale() -> None:
    """Cancelling the turn mid-call, unheard (no idle webhook reaches the app): the late
    result is refused and the call ends stale. (Heard, the handler is stopped first:
    tests/dispatch/test_cancelling.py.)"""
    started = anyio.Event()
    release = anyio.Event()
    tools = FunctionTools()

    @tools.function
    async def wait_a_bit() -> str:
        """Blocks until released."""
        started.set()
        await release.wait()
        return "late"

    async with running_stack(tools) as stack:
        sid = stack.fake.create_session([[FakeCall("wait_a_bit", {}, call_id="x1")]])
        with anyio.fail_after(5):
            await started.wait()
        stack.fake.webhooks.muted.add(sid)
        stack.fake.cancel_turn(sid)
        release.set()
        with anyio.fail_after(5):
            while (record := await _record(stack.store, sid, "x1")) is None or (
                record.state is not CallState.STALE
            ):
                await anyio.sleep(0.02)
    assert stack.fake.submissions == []


async def _record(store: Store, session_id: str, call_id: str) -> CallRecord | None:
    for record in await store.calls_for_session(session_id):
        if record.key.call_id == call_id:
            return record
    return None


async def test_failures_reach_the_model_with_documented_text() -> None:
    """Exception, ToolError, invalid arguments and a timeout each send their documented text."""
    tools = FunctionTools()

    @tools.function
    def boom() -> str:
        """Raises an unexpected error carrying a secret."""
        raise RuntimeError("password=hunter2")

    @tools.function
    def refuse(order_id: str) -> str:
        """Raises a ToolError."""
        raise ToolError(f"order {order_id} is already refunded")

    @tools.function(timeout=0.05)
    async def too_slow() -> str:
        """Sleeps past its timeout."""
        await anyio.sleep(5)
        return "never"

    async with running_stack(tools) as stack:
        sid = stack.fake.create_session(
            [
                [
                    FakeCall("boom", {}, call_id="e1"),
                    FakeCall("refuse", {"order_id": "42"}, call_id="e2"),
                    FakeCall("refuse", {"order_id": 42, "extra": "secret-value"}, call_id="e3"),
                    FakeCall("too_slow", {}, call_id="e4"),
                    FakeCall("no_such_tool", {}, call_id="e5"),
                ]
            ]
        )
        await stack.fake.wait_idle(sid, timeout=5)
    got = outputs(stack.fake)
    assert all(success is False for success, _ in got.values())
    assert "hunter2" not in got["e1"][1] and got["e1"][1]
    assert got["e2"][1] == "order 42 is already refunded"
    assert "order_id" in got["e3"][1] and "secret-value" not in got["e3"][1]
    assert "timed out" in got["e4"][1]
    assert "no_such_tool" in got["e5"][1]


async def test_an_oversize_result_fails_with_its_size_and_is_kept() -> None:
    """A 5 MB result: the model is told the size and the limit; the store keeps the output."""
    tools = FunctionTools()

    @tools.function
    def big() -> str:
        """Returns too much."""
        return "x" * 5_000_000

    @tools.function(truncate_oversize=True)
    def big_but_truncated() -> str:
        """Returns too much, truncated."""
        return "y" * 5_000_000

    async with running_stack(tools) as stack:
        sid = stack.fake.create_session(
            [[FakeCall("big", {}, call_id="b1"), FakeCall("big_but_truncated", {}, call_id="b2")]]
        )
        await stack.fake.wait_idle(sid, timeout=10)
        record = await _record(stack.store, sid, "b1")
    got = outputs(stack.fake)
    assert got["b1"][0] is False and "5000" in got["b1"][1].replace(",", "")
    assert record is not None and record.result is not None
    assert record.result.full_output is not None and len(record.result.full_output) == 5_000_000
    assert got["b2"][0] is True and len(got["b2"][1]) < 4_194_304


@pytest.mark.exclusive
async def test_ack_arrives_before_a_slow_handler_finishes() -> None:
    """The webhook answers while a 1 s handler is still running."""
    async with running_stack(customer_tools(), webhooks=False) as stack:
        sid = stack.fake.create_session(
            [[FakeCall("slow_echo", {"text": "z", "delay_ms": 1000}, call_id="a1")]]
        )
        body, headers = signed_delivery(SECRET, action_required_event(sid))
        began = time.monotonic()
        answer = await stack.post_webhook(body, headers)
        acked = time.monotonic() - began
        assert answer.status_code == 200
        assert stack.fake.submissions == []
        await stack.fake.wait_idle(sid, timeout=5)
    assert acked < 0.5


def refund_tools(
    ledger: Path, *, reconcile: bool, gate: anyio.Event | None = None
) -> FunctionTools:
    tools = FunctionTools()

    def _reconcile(ctx: ToolContext, arguments: dict[str, Any]) -> Ran | NotRun:
        for line in ledger.read_text().splitlines() if ledger.exists() else []:
            entry = json.loads(line)
            if entry["call_id"] == ctx.call_id:
                return Ran({"refund_id": f"rf_{ctx.call_id}", "order_id": entry["order_id"]})
        return NotRun()

    @tools.function(side_effects=True, reconcile=_reconcile if reconcile else None)
    async def create_refund(ctx: ToolContext, order_id: str) -> dict[str, str]:
        """Refund an order."""
        with ledger.open("a") as fh:
            fh.write(json.dumps({"call_id": ctx.call_id, "order_id": order_id}) + "\n")
        if gate is not None:
            await gate.wait()  # the "crash" happens here: the side effect is done, no result saved
        return {"refund_id": f"rf_{ctx.call_id}", "order_id": order_id}

    return tools


async def _trigger(stack: Connection, session_id: str) -> None:
    body, headers = signed_delivery(SECRET, action_required_event(session_id))
    assert (await stack.post_webhook(body, headers)).status_code == 200


@pytest.mark.parametrize("reconcile", [True, False])
async def test_second_instance_applies_the_in_doubt_policy(tmp_path: Path, reconcile: bool) -> None:
    """App 1 is stopped mid-call after the side effect; app 2 on the same SQLite file takes over.

    With a reconcile hook the ledger says it ran: its result is submitted and nothing runs
    twice. Without one the call is quarantined with the model-safe in-doubt message.
    """
    db = f"sqlite:///{tmp_path / 'calls.sqlite3'}"
    ledger = tmp_path / "ledger.jsonl"
    settings = DispatchSettings(
        lease_seconds=0.3, recovery_interval=0.1, recovery_grace=0.1, retry_base=0.05
    )
    fake = FakeAgentsAPI(api_key=API_KEY, webhook_secret=SECRET)
    async with fake:
        gate = anyio.Event()  # never set: app 1 never finishes its handler
        tools1 = refund_tools(ledger, reconcile=reconcile, gate=gate)
        async with running_stack(
            tools1, store=db, settings=settings, fake=fake, drain_timeout=0.05
        ) as first:
            sid = fake.create_session(
                [[FakeCall("create_refund", {"order_id": "o1"}, call_id="rf1")]]
            )
            await _trigger(first, sid)
            with anyio.fail_after(5):
                while not ledger.exists():
                    await anyio.sleep(0.01)
        # App 1 is gone with the call claimed and no saved result; its lease runs out.
        await anyio.sleep(0.4)
        tools2 = refund_tools(ledger, reconcile=reconcile)
        async with running_stack(tools2, store=db, settings=settings, fake=fake):
            await fake.wait_idle(sid, timeout=5)
    assert len(ledger.read_text().splitlines()) == 1
    [submission] = fake.submissions
    if reconcile:
        assert submission.success is True and "rf_rf1" in str(submission.output)
    else:
        assert submission.success is False and submission.error == IN_DOUBT_MESSAGE


async def test_a_plain_tool_in_doubt_runs_again(tmp_path: Path) -> None:
    """Without side effects, a call whose claim expired is simply run again (at-least-once)."""
    db = f"sqlite:///{tmp_path / 'calls.sqlite3'}"
    settings = DispatchSettings(
        lease_seconds=0.3, recovery_interval=0.1, recovery_grace=0.1, retry_base=0.05
    )
    runs: list[str] = []
    gate = anyio.Event()

    def tools_with(block: bool) -> FunctionTools:
        tools = FunctionTools()

        @tools.function
        async def lookup(ctx: ToolContext) -> str:
            """Plain lookup."""
            runs.append(ctx.idempotency_key)
            if block:
                await gate.wait()
            return f"attempt {ctx.attempt}"

        return tools

    fake = FakeAgentsAPI(api_key=API_KEY, webhook_secret=SECRET)
    async with fake:
        async with running_stack(
            tools_with(True), store=db, settings=settings, fake=fake, drain_timeout=0.05
        ) as first:
            sid = fake.create_session([[FakeCall("lookup", {}, call_id="pl1")]])
            await _trigger(first, sid)
            with anyio.fail_after(5):
                while not runs:
                    await anyio.sleep(0.01)
        await anyio.sleep(0.4)
        async with running_stack(tools_with(False), store=db, settings=settings, fake=fake):
            await fake.wait_idle(sid, timeout=5)
    assert len(runs) == 2 and runs[0] == runs[1]  # same idempotency key on both attempts
    assert [(s.success, s.output) for s in fake.submissions] == [(True, "attempt 2")]


async def test_saved_result_is_resubmitted_not_rerun(tmp_path: Path) -> None:
    """App 1 saves a result but cannot submit (API down); app 2 resubmits it without running."""
    db = f"sqlite:///{tmp_path / 'calls.sqlite3'}"
    counter: dict[str, int] = {}
    settings = DispatchSettings(
        lease_seconds=0.3, recovery_interval=0.1, recovery_grace=0.1, retry_base=0.05
    )
    fake = FakeAgentsAPI(api_key=API_KEY, webhook_secret=SECRET)
    async with fake:
        fake.fail_next("submit", 1000, 503)
        async with running_stack(
            customer_tools(counter), store=db, settings=settings, fake=fake
        ) as first:
            sid = fake.create_session(
                [[FakeCall("get_customer", {"customer_id": "123"}, call_id="s1")]]
            )
            await _trigger(first, sid)
            with anyio.fail_after(5):
                while (await first.store.unsubmitted_results(due_before=2e9)) == []:
                    await anyio.sleep(0.02)
        fake.faults.failures["submit"].clear()  # the API is back
        async with running_stack(customer_tools(counter), store=db, settings=settings, fake=fake):
            await fake.wait_idle(sid, timeout=5)
    assert counter["get_customer"] == 1
    assert list(outputs(fake)) == ["s1"]


async def test_rejected_deliveries_never_run_handlers() -> None:
    """Unsigned, mis-signed and stale deliveries are refused (400/401) and nothing runs."""
    counter: dict[str, int] = {}
    async with running_stack(customer_tools(counter), webhooks=False) as stack:
        sid = stack.fake.create_session(
            [[FakeCall("get_customer", {"customer_id": "1"}, call_id="u1")]]
        )
        body, headers = signed_delivery(SECRET, action_required_event(sid))
        assert (await stack.post_webhook(body, {})).status_code == 400
        bad = dict(headers, **{"webhook-signature": "v1," + "A" * 43 + "="})
        assert (await stack.post_webhook(body, bad)).status_code == 401
        old_body, old = signed_delivery(
            SECRET, action_required_event(sid), timestamp=int(time.time()) - 3600
        )
        assert (await stack.post_webhook(old_body, old)).status_code == 401
        await anyio.sleep(0.2)
    assert counter == {}
    assert stack.fake.submissions == []


async def test_store_outage_answers_503(tmp_path: Path) -> None:
    """A store that cannot be opened makes the webhook answer 503 so the sender retries."""
    (tmp_path / "dir.sqlite3").mkdir()
    store = open_store(f"sqlite:///{tmp_path / 'dir.sqlite3'}")
    async with running_stack(customer_tools(), store=store, start=False) as stack:
        body, headers = signed_delivery(SECRET, action_required_event("sess_x"))
        answer = await stack.post_webhook(body, headers)
    assert answer.status_code == 503


def test_constants_are_consistent() -> None:
    """The fast test settings keep leases longer than sweeps, as production defaults do."""
    assert FAST.lease_seconds > FAST.recovery_interval
    assert API_KEY and APP_URL


async def test_a_result_the_api_refuses_becomes_a_failure_not_a_loop() -> None:
    """Our size budget set above the API's limit: the API refuses the 4.5 MB body (400 "too
    large"). Resending it could never succeed, so the model gets a failure saying so, once."""
    tools = FunctionTools()

    @tools.function
    def huge() -> str:
        """Returns more than the API takes."""
        return "x" * 4_500_000

    settings = DispatchSettings(
        lease_seconds=2.0, recovery_interval=0.1, recovery_grace=0.1, result_limit=10_000_000
    )
    async with running_stack(tools, settings=settings) as stack:
        sid = stack.fake.create_session([[FakeCall("huge", {}, call_id="h1")]])
        await stack.fake.wait_idle(sid, timeout=10)
        await anyio.sleep(0.5)  # several sweeps: nothing is resent
    [submission] = stack.fake.submissions
    assert submission.success is False
    assert submission.error is not None
    assert "refused by the Agents API (HTTP 400" in submission.error
    submits = [r for r in stack.fake.requests if r.method == "POST"]
    assert len(submits) == 2  # the refused result, then the failure; no retry loop


@pytest.mark.parametrize(
    "action", ["mcp_approval_request", "computer_use_approval_request", "environment_connection"]
)
async def test_a_webhook_naming_another_action_still_answers_a_pending_call(action: str) -> None:
    """The webhook names one action type even when several are pending: one naming an MCP,
    computer-use or environment action is recorded and the session read, so the function
    call pending beside it is answered."""
    counter: dict[str, int] = {}
    async with running_stack(customer_tools(counter), webhooks=False) as stack:
        sid = stack.fake.create_session(
            [[FakeCall("get_customer", {"customer_id": "1"}, call_id="c1")]]
        )
        body, headers = signed_delivery(SECRET, action_required_event(sid, action))
        answer = await stack.post_webhook(body, headers)
        assert (answer.status_code, answer.json()["status"]) == (200, "accepted")
        await stack.fake.wait_idle(sid, timeout=5)
    assert counter["get_customer"] == 1
    assert [s.call_id for s in stack.fake.submissions] == ["c1"]


@pytest.mark.slow
async def test_a_turns_results_ready_together_go_in_one_post_over_loopback(
    tmp_path: Path,
) -> None:
    """A turn of five parallel async calls on SQLite, the fake served over loopback: the
    results saved together reach the API in fewer requests than results (one, when all
    five are saved in one loop turn), each call answered once and marked submitted."""
    tools = FunctionTools()

    @tools.function
    async def lookup(key: str) -> str:
        """Look a key up."""
        return key.upper()

    store = f"sqlite:///{tmp_path / 'turn.sqlite3'}"
    async with connect(tools, store=store, loopback=True) as (app, fake):
        calls = [FakeCall("lookup", {"key": k}, call_id=f"c{k}") for k in "abcde"]
        session = fake.create_session([calls])
        await fake.wait_idle(session)
        await app.dispatcher.wait_for(r.key for r in await app.store.calls_for_session(session))
        records = await app.store.calls_for_session(session)
    posts = [r for r in fake.requests if r.route == "submit"]
    assert sorted((s.call_id, s.output) for s in fake.submissions) == [
        (f"c{k}", k.upper()) for k in "abcde"
    ]
    assert fake.duplicate_submissions == []
    assert 1 <= len(posts) < 5 and all(r.status == 202 for r in posts)
    assert any((r.idempotency_key or "").startswith("afn-batch-") for r in posts)
    assert [r.state for r in records] == [CallState.SUBMITTED] * 5
