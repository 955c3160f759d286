"""Every pending action answered (issue 34) end to end: the Starlette example as real uvicorn
processes over real HTTP, on SQLite, PostgreSQL and Redis, against the package's fake API,
with the examples' policy (``agentfn_asgi.demo.tools.ACTIONS``).

- One session holding a function call, an MCP request of each policy outcome, origin
  requests (a subdomain approved, another origin asked) and a sign-in (cancelled): the
  person's requests are listed by ``agentfn-asgi approvals --json`` with their kind, decided
  from the CLI, and every action is answered correctly and once.
- SIGKILL of the replica between a decision and its submission (the crash hook right after
  the answer is saved): a restarted replica submits it, once.
- Two replicas receiving the same delivery: one request listed, one answer.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from agentfn_asgi.calls.records import CallState
from agentfn_asgi.demo import free_port
from agentfn_asgi.store import open_store
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall, FakeRequest, Submission, serve_fake

from .support.backends import DURABLE, SHARED, store_url_for
from .support.replicas import replicas
from .test_approvals_e2e import SECRET, cli, env_for

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.backends]

CRASH = {"AGENTFN_TEST_ONLY_ENABLE_CRASH_HOOK": "yes-kill-this-process"}


def every_kind() -> list[list[FakeCall | FakeRequest]]:
    return [
        [
            FakeCall("get_customer", {"customer_id": "123"}, call_id="call_f"),
            FakeRequest.mcp("docs", "search", {"q": "refunds"}, request_id="req_docs"),
            FakeRequest.mcp("payments", "charge", {"cents": 500}, request_id="req_pay"),
            FakeRequest.mcp("shell", "run", None, request_id="req_shell"),
            FakeRequest.origin("https://shop.example.com", request_id="req_sub"),
            FakeRequest.origin("https://other.test", reason="checkout", request_id="req_other"),
            FakeRequest.sign_in(request_id="req_sign"),
        ]
    ]


async def listed(env: dict[str, str], count: int) -> list[dict[str, object]]:
    """``approvals --json`` once it lists ``count`` requests."""
    with anyio.fail_after(30):
        while True:
            code, out, err = await cli(env, "approvals", "--json")
            assert code == 0, err
            items = json.loads(out)
            if len(items) >= count:
                return list(items)
            await anyio.sleep(0.2)


def answers(submissions: list[Submission]) -> dict[str, object]:
    """Each request's decision (a function call's success), asserting one answer each."""
    ids = [s.call_id for s in submissions]
    assert len(ids) == len(set(ids)), ids
    return {
        s.call_id: s.success
        if s.call_id.startswith("call_")
        else (s.output.get("decision") or s.output.get("action"))
        for s in submissions
    }


@pytest.mark.parametrize("backend", DURABLE)
async def test_every_kind_answered_once_by_policy_and_from_the_cli(
    backend: str, tmp_path: Path
) -> None:
    port = free_port()
    fake = FakeAgentsAPI(
        webhook_secret=SECRET, webhook_url=f"http://127.0.0.1:{port}/openai/webhooks"
    )
    async with store_url_for(backend, tmp_path) as url, fake, serve_fake(fake) as base_url:
        env = env_for(url, base_url, tmp_path / "ledger.jsonl")
        async with replicas(env, tmp_path, [port]):
            sid = fake.create_session(every_kind())
            items = {str(item["call_id"]): item for item in await listed(env, 2)}
            assert set(items) == {"req_pay", "req_other"}
            pay, other = items["req_pay"], items["req_other"]
            assert (pay["kind"], pay["server_label"], pay["name"]) == ("mcp", "payments", "charge")
            assert (other["kind"], other["origin"]) == ("computer_use", "https://other.test")
            assert pay["session_id"] == sid and pay["tool_name"] == "mcp:payments/charge"

            code, _, err = await cli(
                env, "approvals", "approve", str(pay["approval_id"]), "--as", "alice"
            )
            assert code == 0, err
            code, _, err = await cli(env, "approvals", "deny", str(other["approval_id"]))
            assert code == 0, err
            code, _, err = await cli(env, "approvals", "approve", str(other["approval_id"]))
            assert code == 1 and "denied" in err
            await fake.wait_idle(sid, timeout=30)
    assert answers(fake.submissions) == {
        "call_f": True,
        "req_docs": "approve",
        "req_pay": "approve",
        "req_shell": "deny",
        "req_sub": "approve",
        "req_other": "deny",
        "req_sign": "cancel",
    }
    assert fake.duplicate_submissions == []


@pytest.mark.parametrize("backend", DURABLE)
async def test_killed_between_decision_and_submission_submits_once_after_restart(
    backend: str, tmp_path: Path
) -> None:
    """The replica dies right after saving the policy's answer (and, in a second session,
    a person's approval): nothing was submitted; the next replica submits each once."""
    port = free_port()
    fake = FakeAgentsAPI(
        webhook_secret=SECRET, webhook_url=f"http://127.0.0.1:{port}/openai/webhooks"
    )
    async with store_url_for(backend, tmp_path) as url, fake, serve_fake(fake) as base_url:
        env = env_for(url, base_url, tmp_path / "ledger.jsonl")
        dying = {**env, **CRASH, "AGENTFN_CRASH_AT": "after_save:mcp:docs/search"}
        async with replicas(dying, tmp_path, [port]) as running:
            sid = fake.create_session(
                [[FakeRequest.mcp("docs", "search", {"q": "x"}, request_id="req_docs")]]
            )
            with anyio.fail_after(30):
                await running[0].process.wait()
        assert fake.submissions == []
        store = open_store(url)
        try:
            [record] = await store.calls_for_session(sid)
        finally:
            await store.close()
        assert record.state is CallState.SUCCEEDED  # saved, never submitted

        dying = {**env, **CRASH, "AGENTFN_CRASH_AT": "after_save:mcp:payments/charge"}
        (tmp_path / "b").mkdir()
        async with replicas(dying, tmp_path / "b", [port]) as running:
            asked = fake.create_session(
                [[FakeRequest.mcp("payments", "charge", {"c": 1}, request_id="req_pay")]]
            )
            [item] = await listed(env, 1)
            code, _, err = await cli(env, "approvals", "approve", str(item["approval_id"]))
            assert code == 0, err
            with anyio.fail_after(30):  # it dies once it has saved the approval's answer
                await running[0].process.wait()
        # (its start-up sweep may have submitted the first session's saved answer meanwhile)
        assert [s.call_id for s in fake.submissions if s.call_id == "req_pay"] == []

        (tmp_path / "c").mkdir()
        async with replicas(env, tmp_path / "c", [port]):
            await fake.wait_idle(sid, timeout=30)
            await fake.wait_idle(asked, timeout=30)
    assert answers(fake.submissions) == {"req_docs": "approve", "req_pay": "approve"}


@pytest.mark.parametrize("backend", SHARED)
async def test_two_replicas_same_delivery_one_request_one_answer(
    backend: str, tmp_path: Path
) -> None:
    ports = [free_port(), free_port()]
    fake = FakeAgentsAPI(
        webhook_secret=SECRET,
        webhook_url=[f"http://127.0.0.1:{p}/openai/webhooks" for p in ports],
    )
    async with store_url_for(backend, tmp_path) as url, fake, serve_fake(fake) as base_url:
        env = env_for(url, base_url, tmp_path / "ledger.jsonl")
        async with replicas(env, tmp_path, ports):
            sid = fake.create_session(every_kind())
            items = await listed(env, 2)
            await anyio.sleep(1.0)  # both replicas have read the session by now
            items = await listed(env, 2)
            assert sorted(str(i["call_id"]) for i in items) == ["req_other", "req_pay"]
            for item in items:
                code, _, err = await cli(env, "approvals", "approve", str(item["approval_id"]))
                assert code == 0, err
            await fake.wait_idle(sid, timeout=30)
    decided = answers(fake.submissions)
    assert decided["req_pay"] == "approve" and decided["req_other"] == "approve"
    assert len(fake.submissions) == 7 and fake.duplicate_submissions == []
