"""Durable human approval end to end (issue 23): the Starlette example as real uvicorn
processes over real HTTP, on SQLite, PostgreSQL and Redis, decided with the real CLI
(``agentfn-asgi approvals``) in processes of its own, against the package's fake API.

- A ``close_account`` call is held with nothing in the ledger; ``approvals approve`` runs it
  once and the result is accepted; another is denied and the model gets the reason; a third
  expires into a failure.
- SIGKILL of the replica that holds a waiting call, then approval: the other replica runs
  it, once. The same request approved from two processes at once: one decision, one run.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentfn_asgi.calls.records import CallRecord, CallState
from agentfn_asgi.demo import free_port
from agentfn_asgi.store import open_store
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall, serve_fake

from .support.backends import DURABLE, SHARED, store_url_for
from .support.replicas import replicas
from .test_examples import django_db_file

__all__ = ["django_db_file"]  # the fixture, imported for the examples' test

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.backends]

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


def env_for(url: str, base_url: str, ledger: Path, **extra: str) -> dict[str, str]:
    return {
        "OPENAI_API_KEY": "sk-test",
        "OPENAI_BASE_URL": base_url,
        "OPENAI_WEBHOOK_SECRET": SECRET,
        "AGENTFN_STORE_URL": url,
        "EXAMPLE_LEDGER": str(ledger),
        "AGENTFN_LEASE_SECONDS": "2",
        "AGENTFN_RECOVERY_INTERVAL": "0.5",
        **extra,
    }


async def cli(env: Mapping[str, str], *args: str) -> tuple[int, str, str]:
    """``agentfn-asgi ARGS`` in a process of its own, with the app's settings."""
    done = await anyio.run_process(
        [sys.executable, "-m", "agentfn_asgi", *args],
        env={**os.environ, **env},
        check=False,
    )
    return done.returncode, done.stdout.decode(), done.stderr.decode()


async def waiting_record(url: str, session_id: str) -> CallRecord:
    """The session's close_account call once it waits for approval."""
    store = open_store(url)
    try:
        with anyio.fail_after(30):
            while True:
                for record in await store.calls_for_session(session_id):
                    if record.state is CallState.AWAITING_APPROVAL:
                        return record
                await anyio.sleep(0.05)
    finally:
        await store.close()


def ledger_lines(ledger: Path) -> list[dict[str, Any]]:
    if not ledger.exists():
        return []
    return [json.loads(line) for line in ledger.read_text().splitlines() if line]


def close(account_id: str, call_id: str) -> list[list[FakeCall]]:
    return [[FakeCall("close_account", {"account_id": account_id}, call_id=call_id)]]


@pytest.mark.parametrize("backend", DURABLE)
async def test_held_then_approved_denied_and_expired_over_http(
    backend: str, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    port = free_port()
    fake = FakeAgentsAPI(
        webhook_secret=SECRET, webhook_url=f"http://127.0.0.1:{port}/openai/webhooks"
    )
    async with store_url_for(backend, tmp_path) as url, fake, serve_fake(fake) as base_url:
        env = env_for(url, base_url, ledger)
        async with replicas(env, tmp_path, [port]) as running:
            approved_sid = fake.create_session(close("acc_1", "call_ok"))
            denied_sid = fake.create_session(close("acc_2", "call_no"))
            waiting = await waiting_record(url, approved_sid)
            other = await waiting_record(url, denied_sid)
            assert ledger_lines(ledger) == [] and fake.submissions == []
            assert waiting.approval is not None and other.approval is not None

            code, out, err = await cli(env, "approvals", "--json")
            assert code == 0, err
            listed = {item["approval_id"]: item for item in json.loads(out)}
            assert set(listed) == {waiting.approval.approval_id, other.approval.approval_id}
            item = listed[waiting.approval.approval_id]
            assert item["call_id"] == "call_ok" and item["tool_name"] == "close_account"
            assert item["session_id"] == approved_sid and item["turn_id"] == waiting.key.turn_id
            assert item["requested_at"].endswith("Z") and item["expires_at"].endswith("Z")

            code, out, err = await cli(
                env, "approvals", "approve", waiting.approval.approval_id, "--as", "alice"
            )
            assert code == 0, err
            await fake.wait_idle(approved_sid, timeout=30)
            code, _, err = await cli(
                env, "approvals", "approve", waiting.approval.approval_id, "--as", "bob"
            )
            assert code == 1 and "approved by alice" in err

            code, _, err = await cli(
                env,
                "approvals",
                "deny",
                other.approval.approval_id,
                "--reason",
                "the account has an open balance",
                "--as",
                "bob",
            )
            assert code == 0, err
            await fake.wait_idle(denied_sid, timeout=30)
            code, _, err = await cli(env, "approvals", "approve", "apr_unknown")
            assert code == 1
            code, _, err = await cli(env, "approvals", "approve")
            assert code == 2
            code, out, err = await cli(env, "calls", "show", "call_ok", "--session", approved_sid)
            assert code == 0, err
            log = running[0].log()
    results = {s.call_id: s for s in fake.submissions}
    assert set(results) == {"call_ok", "call_no"} and len(fake.submissions) == 2
    assert results["call_ok"].success
    assert json.loads(results["call_ok"].output) == {"closed": True, "account_id": "acc_1"}
    assert not results["call_no"].success
    assert "the account has an open balance" in (results["call_no"].error or "")
    assert ledger_lines(ledger) == [
        {"call_id": "call_ok", "account_id": "acc_1", "tool": "close_account"}
    ]
    assert f"approval  {waiting.approval.approval_id}" in out
    assert "decided   approved by alice via cli" in out
    assert "call waiting for approval" in log


@pytest.mark.parametrize("backend", DURABLE)
async def test_nobody_approving_in_time_fails_the_call(backend: str, tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.jsonl"
    port = free_port()
    fake = FakeAgentsAPI(
        webhook_secret=SECRET, webhook_url=f"http://127.0.0.1:{port}/openai/webhooks"
    )
    async with store_url_for(backend, tmp_path) as url, fake, serve_fake(fake) as base_url:
        env = env_for(url, base_url, ledger, AGENTFN_APPROVAL_TIMEOUT="1")
        async with replicas(env, tmp_path, [port]):
            sid = fake.create_session(close("acc_3", "call_late"))
            await fake.wait_idle(sid, timeout=30)
    [submission] = fake.submissions
    assert not submission.success and "nobody approved it in time" in (submission.error or "")
    assert ledger_lines(ledger) == []


@pytest.mark.parametrize("backend", SHARED)
async def test_the_holder_dies_and_two_approvers_race_one_run(backend: str, tmp_path: Path) -> None:
    """The replica that asked is SIGKILLed while the call waits; then two CLI processes
    approve the same request at once: one decision, and the surviving replica runs the
    call once. Every webhook goes to both replicas."""
    ledger = tmp_path / "ledger.jsonl"
    ports = [free_port(), free_port()]
    fake = FakeAgentsAPI(
        webhook_secret=SECRET,
        webhook_url=[f"http://127.0.0.1:{p}/openai/webhooks" for p in ports],
    )
    async with store_url_for(backend, tmp_path) as url, fake, serve_fake(fake) as base_url:
        env = env_for(url, base_url, ledger)
        async with replicas(env, tmp_path, ports) as running:
            sid = fake.create_session(close("acc_4", "call_kill"))
            waiting = await waiting_record(url, sid)
            assert waiting.approval is not None
            approval_id = waiting.approval.approval_id
            holder = next(r for r in running if f":{r.process.pid}:" in (waiting.owner or ""))
            holder.process.send_signal(signal.SIGKILL)
            await holder.process.wait()
            codes: list[int] = []

            async def approve(name: str) -> None:
                code, _, _ = await cli(env, "approvals", "approve", approval_id, "--as", name)
                codes.append(code)

            async with anyio.create_task_group() as group:
                group.start_soon(approve, "alice")
                group.start_soon(approve, "bob")
            await fake.wait_idle(sid, timeout=30)
        store = open_store(url)
        try:
            record = await store.get_call(waiting.key, history=True)
        finally:
            await store.close()
    assert sorted(codes) == [0, 1]
    assert [s.call_id for s in fake.submissions] == ["call_kill"]
    assert fake.submissions[0].success
    assert ledger_lines(ledger) == [
        {"call_id": "call_kill", "account_id": "acc_4", "tool": "close_account"}
    ]
    assert record is not None and record.state is CallState.SUBMITTED
    kinds = [e.kind for e in record.history]
    assert kinds.count("approved") == 1 and kinds.count("claimed_approved") == 1
    runner = next(e for e in record.history if e.kind == "claimed_approved")
    assert runner.owner != waiting.owner


EXAMPLES = {
    "starlette": "examples.starlette_app:app",
    "fastapi": "examples.fastapi_app:app",
    "django": "examples.django_app.exampleproject.asgi:application",
}


@pytest.mark.parametrize("example", sorted(EXAMPLES))
async def test_every_example_holds_close_account_for_approval(
    example: str, tmp_path: Path, django_db_file: Path
) -> None:
    """The examples' contract: each app serves close_account with approval=True; it writes
    its ledger line only once approved, and answers {"closed": true, ...}."""
    ledger = tmp_path / "ledger.jsonl"
    port = free_port()
    fake = FakeAgentsAPI(
        webhook_secret=SECRET, webhook_url=f"http://127.0.0.1:{port}/openai/webhooks"
    )
    async with store_url_for("sqlite", tmp_path) as url, fake, serve_fake(fake) as base_url:
        env = env_for(url, base_url, ledger, EXAMPLE_DJANGO_DB=str(django_db_file))
        async with replicas(env, tmp_path, [port], target=EXAMPLES[example]):
            sid = fake.create_session(close("acc_ex", "call_ex"))
            waiting = await waiting_record(url, sid)
            assert waiting.approval is not None and ledger_lines(ledger) == []
            code, _, err = await cli(env, "approvals", "approve", waiting.approval.approval_id)
            assert code == 0, err
            await fake.wait_idle(sid, timeout=30)
    [submission] = fake.submissions
    assert json.loads(submission.output) == {"closed": True, "account_id": "acc_ex"}
    assert ledger_lines(ledger) == [
        {"call_id": "call_ex", "account_id": "acc_ex", "tool": "close_account"}
    ]
