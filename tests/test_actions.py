"""Every pending action answered (issue 34) in process, over the memory store and the fake:
MCP and computer-use approval requests are answered by the policy or by a person, each once,
through the call machinery; the kinds nobody answers are left alone and warned about once."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import anyio
import pytest

from agentfn_asgi.actions import (
    ActionRequest,
    ActionRules,
    MCPRequest,
    OriginRequest,
    SignInRequest,
    action_fields,
    origin_matches,
)
from agentfn_asgi.calls.records import CallState
from agentfn_asgi.cli.approvals import approval_json
from agentfn_asgi.testing import Connection, FakeCall, FakeRequest, Submission
from agentfn_asgi.tools import FunctionTools

from .support.stack import FAST, running_stack

SETTINGS = dataclasses.replace(FAST, approval_poll_interval=0.05)

#: The examples' contract (see agentfn_asgi/demo/tools.py).
RULES = ActionRules(
    mcp={"docs": "approve", "payments": "ask"},
    other_mcp="deny",
    origins={"https://example.com": "approve"},
    other_origins="ask",
    sign_in="cancel",
)


def lookup_tools() -> FunctionTools:
    tools = FunctionTools()

    @tools.function
    def lookup(order_id: str) -> str:
        """Look up an order."""
        return f"order {order_id}: shipped"

    return tools


def every_kind() -> list[Any]:
    return [
        FakeCall("lookup", {"order_id": "o1"}, call_id="call_f"),
        FakeRequest.mcp("docs", "search", {"q": "refunds"}, request_id="req_docs"),
        FakeRequest.mcp("payments", "charge", {"cents": 500}, request_id="req_pay"),
        FakeRequest.mcp("shell", "run", None, request_id="req_shell"),
        FakeRequest.origin("https://shop.example.com", request_id="req_sub"),
        FakeRequest.origin("https://example.com.evil.test", reason="x", request_id="req_evil"),
        FakeRequest.sign_in(request_id="req_sign"),
    ]


async def answered(stack: Connection, request_id: str) -> Submission:
    with anyio.fail_after(10):
        while not [s for s in stack.fake.submissions if s.call_id == request_id]:
            await anyio.sleep(0.02)
    return next(s for s in stack.fake.submissions if s.call_id == request_id)


async def waiting_views(stack: Connection, count: int) -> list[Any]:
    with anyio.fail_after(10):
        while len(views := await stack.app.operator().approvals()) < count:
            await anyio.sleep(0.02)
    return views


def test_the_rules_match_labels_tools_and_origins_with_subdomains() -> None:
    """A ``label/tool`` rule wins over its label; an origin covers its subdomains only (same
    scheme and port), never a look-alike host."""
    ids = {"session_id": "s", "turn_id": "t", "request_id": "r"}
    rules = ActionRules(mcp={"docs": "approve", "docs/delete": "ask"}, other_mcp="deny")
    assert rules(MCPRequest(**ids, server_label="docs", name="search")) == "approve"
    assert rules(MCPRequest(**ids, server_label="docs", name="delete")) == "ask"
    assert rules(MCPRequest(**ids, server_label="other")) == "deny"
    assert ActionRules()(OriginRequest(**ids, origin="https://a.test")) == "leave"
    assert RULES(SignInRequest(session_id="s", turn_id="t", request_id="r")) == "cancel"
    for origin in ("https://example.com", "https://a.b.example.com", "https://EXAMPLE.com:443"):
        assert origin_matches("https://example.com", origin), origin
    for origin in (
        "http://example.com",
        "https://example.com:8443",
        "https://badexample.com",
        "https://example.com.evil.test",
        "https://example.com:bad",
        "not an origin",
    ):
        assert not origin_matches("https://example.com", origin), origin
    with pytest.raises(ValueError, match="other_mcp"):
        ActionRules(other_mcp="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not an origin"):
        ActionRules(origins={"example.com": "approve"})
    with pytest.raises(ValueError, match="sign_in"):
        ActionRules(sign_in="approve")


def test_a_request_name_says_its_kind_and_what_a_person_reads() -> None:
    assert action_fields("lookup") == {"kind": "function"}
    assert action_fields("mcp:docs/search") == {
        "kind": "mcp",
        "server_label": "docs",
        "name": "search",
    }
    assert action_fields("mcp:docs")["name"] is None
    assert action_fields("computer_use:https://example.com")["origin"] == "https://example.com"
    assert action_fields("sign_in:")["request"] == "sign_in"


@pytest.mark.anyio
async def test_every_kind_in_one_session_is_answered_once_by_policy_or_person() -> None:
    """One session holding a function call and every policy outcome: the function runs, the
    policy's answers are submitted at once, the two ``ask`` requests wait for a person
    (listed with their kind, server label and name, or origin), are decided once, and every
    answer reaches the API exactly once, in the shape the API validates."""
    async with running_stack(lookup_tools(), settings=SETTINGS, actions=RULES) as stack:
        sid = stack.fake.create_session([every_kind()])
        assert (await answered(stack, "call_f")).success
        docs = await answered(stack, "req_docs")
        assert docs.success and docs.output == {"type": "mcp_tool_call", "decision": "approve"}
        shell = await answered(stack, "req_shell")
        assert shell.output["decision"] == "deny"
        sub = await answered(stack, "req_sub")
        assert sub.output == {"type": "browser_origin_access", "decision": "approve"}
        sign = await answered(stack, "req_sign")
        assert sign.output == {"type": "browser_authentication", "action": "cancel"}

        views = await waiting_views(stack, 2)
        by_call = {v.call_id: v for v in views}
        assert set(by_call) == {"req_pay", "req_evil"}
        pay = approval_json(by_call["req_pay"])
        assert (pay["kind"], pay["server_label"], pay["name"]) == ("mcp", "payments", "charge")
        evil = approval_json(by_call["req_evil"])
        assert (evil["kind"], evil["origin"]) == ("computer_use", "https://example.com.evil.test")
        got = await stack.app.operator().approval(by_call["req_pay"].approval_id)
        assert got is not None and '"server_label": "payments"' in (got[1].arguments or "")

        await stack.app.approve(by_call["req_pay"].approval_id, by="alice")
        await stack.app.deny(by_call["req_evil"].approval_id, reason="unknown site", by="bob")
        assert (await answered(stack, "req_pay")).output["decision"] == "approve"
        assert (await answered(stack, "req_evil")).output["decision"] == "deny"
        with anyio.fail_after(10):
            while stack.fake.session(sid)["status"] != "idle":
                await anyio.sleep(0.02)
        records = {r.key.call_id: r for r in await stack.store.calls_for_session(sid)}
    answers = [s.call_id for s in stack.fake.submissions]
    assert sorted(answers) == sorted(
        ["call_f", "req_docs", "req_pay", "req_shell", "req_sub", "req_evil", "req_sign"]
    )
    assert all(r.state is CallState.SUBMITTED for r in records.values())
    assert records["req_docs"].result is not None
    assert records["req_docs"].result.source == "policy"
    assert records["req_pay"].result is not None
    assert records["req_pay"].result.source == "approval"
    assert records["req_shell"].result is not None
    assert records["req_shell"].result.error_type == "request_denied"


@pytest.mark.anyio
async def test_nobody_deciding_in_time_denies_the_request() -> None:
    settings = dataclasses.replace(SETTINGS, approval_timeout=0.3)
    async with running_stack(lookup_tools(), settings=settings, actions=RULES) as stack:
        sid = stack.fake.create_session(
            [[FakeRequest.mcp("payments", "charge", request_id="req_x")]]
        )
        submission = await answered(stack, "req_x")
        [record] = await stack.store.calls_for_session(sid)
    assert submission.output == {"type": "mcp_tool_call", "decision": "deny"}
    assert record.approval is not None and record.approval.decision == "expired"


@pytest.mark.anyio
async def test_an_async_policy_decides_and_a_failing_one_refuses() -> None:
    """A coroutine policy is awaited; a policy that raises denies (never approves), and the
    function calls of the same session are answered as usual."""
    seen: list[ActionRequest] = []

    async def policy(request: ActionRequest) -> str:
        seen.append(request)
        if isinstance(request, MCPRequest) and request.server_label == "broken":
            raise RuntimeError("policy bug")
        return "approve"

    async with running_stack(lookup_tools(), settings=SETTINGS, actions=policy) as stack:
        stack.fake.create_session(
            [
                [
                    FakeCall("lookup", {"order_id": "o2"}, call_id="call_g"),
                    FakeRequest.mcp("broken", request_id="req_b"),
                    FakeRequest.mcp("fine", "t", {"a": 1}, message="ok?", request_id="req_ok"),
                ]
            ]
        )
        assert (await answered(stack, "req_b")).output["decision"] == "deny"
        assert (await answered(stack, "req_ok")).output["decision"] == "approve"
        assert (await answered(stack, "call_g")).success
    fine = next(r for r in seen if isinstance(r, MCPRequest) and r.server_label == "fine")
    assert (fine.name, fine.arguments, fine.message) == ("t", {"a": 1}, "ok?")


@pytest.mark.anyio
async def test_without_a_policy_requests_are_left_and_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No ``actions=``: the function call is answered, the requests are left pending
    (recorded ``unanswered``, nothing submitted for them), and one WARNING per session and
    kind says so, however many times the session is read."""
    caplog.set_level(logging.WARNING, logger="agentfn_asgi.dispatch.actions")
    async with running_stack(lookup_tools(), settings=SETTINGS) as stack:
        sid = stack.fake.create_session([every_kind()])
        assert (await answered(stack, "call_f")).success
        for _ in range(3):
            await stack.app.dispatcher.recover(sid)
        records = await stack.store.calls_for_session(sid)
        pending = stack.fake.session(sid)["required_actions"]
    states = {r.key.call_id: r.state for r in records}
    assert states.pop("call_f") is CallState.SUBMITTED
    assert set(states.values()) == {CallState.UNANSWERED} and len(states) == 6
    assert [s.call_id for s in stack.fake.submissions] == ["call_f"]
    assert len(pending) == 6
    warnings = [r.getMessage() for r in caplog.records if sid in r.getMessage()]
    assert len(warnings) == 2, warnings
    assert any("mcp_approval_request" in w for w in warnings)
    assert any("computer_use_approval_request" in w for w in warnings)


@pytest.mark.anyio
async def test_a_session_id_off_the_pattern_is_refused_naming_the_pattern() -> None:
    """An action_required webhook whose data.id is not a session id (``../x``) was refused
    with "the session id is missing"; now the 400 names the pattern it must match."""
    from agentfn_asgi.testing import action_required_event, signed_delivery

    from .support.stack import SECRET

    async with running_stack(lookup_tools(), settings=SETTINGS) as stack:
        bad = await stack.post_webhook(*signed_delivery(SECRET, action_required_event("../x")))
        gone = await stack.post_webhook(*signed_delivery(SECRET, action_required_event("")))
    assert bad.status_code == 400 and "[A-Za-z0-9_-]{1,256}" in bad.json()["error"]
    assert gone.status_code == 400 and "is missing" in gone.json()["error"]


SECRET_VALUE = "hunter2-do-not-store"


@pytest.mark.anyio
async def test_a_sign_in_is_answered_from_memory_and_its_values_never_stored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The sign-in hook's values reach the API and nothing else: the store keeps the
    redacted answer, no log line holds them; a submission that fails keeps nothing, and
    the call's takeover asks the hook again (as a crash would)."""
    from agentfn_asgi.actions import NOT_STORED, SignIn

    asked: list[SignInRequest] = []

    def sign_in(request: SignInRequest) -> SignIn:
        asked.append(request)
        return SignIn({"username": "ada", "password": SECRET_VALUE})

    caplog.set_level(logging.DEBUG)
    async with running_stack(lookup_tools(), settings=SETTINGS, sign_in=sign_in) as stack:
        stack.fake.fail_next("submit", 20, status=503)  # every try of the first attempt
        sid = stack.fake.create_session(
            [[FakeRequest.sign_in(credential_origin="https://id.test", request_id="req_in")]]
        )
        submission = await answered(stack, "req_in")
        [record] = await stack.store.calls_for_session(sid)
    fields = {f["field_id"]: f["value"] for f in submission.output["fields"]}
    assert fields == {"username": "ada", "password": SECRET_VALUE}
    assert len(asked) >= 2 and asked[0].credential_origin == "https://id.test"
    assert record.state is CallState.SUBMITTED and record.result is not None
    assert SECRET_VALUE not in record.result.event_json and NOT_STORED in record.result.event_json
    assert [s.call_id for s in stack.fake.submissions] == ["req_in"]
    assert not [r for r in caplog.records if SECRET_VALUE in r.getMessage()]


@pytest.mark.anyio
async def test_a_sign_in_hook_that_declines_or_fails_cancels() -> None:
    from agentfn_asgi.actions import SignIn

    def sign_in(request: SignInRequest) -> SignIn | None:
        if request.request_id == "req_bad":
            return SignIn({"nope": "x"})  # a field the request does not ask for
        return None

    async with running_stack(lookup_tools(), settings=SETTINGS, sign_in=sign_in) as stack:
        stack.fake.create_session(
            [[FakeRequest.sign_in(request_id="req_no"), FakeRequest.sign_in(request_id="req_bad")]]
        )
        declined = await answered(stack, "req_no")
        failed = await answered(stack, "req_bad")
    assert (
        declined.output == failed.output == {"type": "browser_authentication", "action": "cancel"}
    )


@pytest.mark.anyio
async def test_an_operator_re_runs_an_in_doubt_request_and_may_not_give_it_a_result() -> None:
    """A request in doubt (its claim lapsed: a replica died after claiming it) takes a
    decision, not a tool result: ``settle`` with an output is refused, a re-run asks the
    policy again and submits its answer."""
    from agentfn_asgi.calls.records import CallKey

    # No sweep takes it over meanwhile; a lapsed lease is in doubt at once.
    settings = dataclasses.replace(SETTINGS, recovery_interval=3600.0, lease_margin=0.0)
    async with running_stack(
        lookup_tools(), settings=settings, actions=RULES, webhooks=False
    ) as stack:
        sid = stack.fake.create_session([[FakeRequest.mcp("docs", "s", request_id="req_d")]])
        turn = stack.fake.required_actions(sid)[0]["turn_id"]
        key = CallKey(sid, turn, "req_d")
        await stack.store.claim_call(
            key, tool_name="mcp:docs/s", owner="dead-replica", lease_seconds=0.01
        )
        await anyio.sleep(0.1)
        refused = await stack.app.dispatcher.settle(key, output="yes")
        running = await stack.app.dispatcher.settle(key, rerun=True)
        submission = await answered(stack, "req_d")
    assert refused[0] == "refused" and "re-run" in refused[1]
    assert running[0] == "running"
    assert submission.output == {"type": "mcp_tool_call", "decision": "approve"}


@pytest.mark.anyio
async def test_follow_answers_approval_requests_without_webhooks() -> None:
    """Stream mode (``follow``) answers a session that holds approval requests only, as a
    webhook would have the app do (it used to look at function calls alone)."""
    async with running_stack(
        lookup_tools(), settings=SETTINGS, actions=RULES, webhooks=False, loopback=True
    ) as stack:
        sid = stack.fake.create_session(
            [[FakeRequest.mcp("docs", "s", request_id="req_f"), FakeRequest.sign_in()]]
        )
        with anyio.fail_after(20):
            summary = await stack.app.follow(sid)
    assert summary.status == "idle" and summary.results_submitted == 2
    answers = {s.call_id: s.output for s in stack.fake.submissions}
    assert answers["req_f"] == {"type": "mcp_tool_call", "decision": "approve"}
