"""A cancelled turn stops its tools, end to end: the Starlette example as real uvicorn
processes over real HTTP, on SQLite, PostgreSQL and Redis, against the package's fake API.

- ``long_task`` (async) and ``long_task_sync`` (a thread polling ``ctx.cancelled``) both
  write ``cancelled`` to the ledger within 2 s of the turn's idle webhook, and within the
  re-read interval plus 2 s when no webhook comes at all; no result is submitted.
- A call waiting for a person's approval and one waiting for a slot of ``limited_echo`` are
  withdrawn (``cancelled`` in ``agentfn-asgi calls --json``) and never run.
- A replica SIGKILLed while it ran a call of the cancelled turn: the survivor does not run
  it.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentfn_asgi.demo import free_port
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall, serve_fake

from .support.backends import DURABLE, store_url_for
from .support.replicas import replicas
from .test_approvals_e2e import SECRET, cli, env_for, ledger_lines

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.backends]

REREAD = 1.0


async def _phase(ledger: Path, call_id: str, phase: str, within: float) -> float:
    """Wait until the ledger says ``phase`` for ``call_id``; when it did (monotonic)."""
    with anyio.fail_after(within):
        while not any(
            line.get("call_id") == call_id and line.get("phase") == phase
            for line in ledger_lines(ledger)
        ):
            await anyio.sleep(0.02)
    return time.monotonic()


def _long_tasks(prefix: str) -> list[list[FakeCall]]:
    return [
        [
            FakeCall("long_task", {"seconds": 60}, call_id=f"{prefix}_async"),
            FakeCall("long_task_sync", {"seconds": 60}, call_id=f"{prefix}_sync"),
        ]
    ]


async def _calls(env: dict[str, str], session_id: str) -> dict[str, dict[str, Any]]:
    code, out, err = await cli(env, "calls", "--session", session_id, "--json")
    assert code == 0, err
    return {item["call_id"]: item for item in json.loads(out)}


@pytest.mark.parametrize("backend", DURABLE)
async def test_a_cancelled_turn_stops_its_running_and_waiting_calls(
    backend: str, tmp_path: Path
) -> None:
    ledger = tmp_path / "ledger.jsonl"
    port = free_port()
    fake = FakeAgentsAPI(
        webhook_secret=SECRET, webhook_url=f"http://127.0.0.1:{port}/openai/webhooks"
    )
    async with store_url_for(backend, tmp_path) as url, fake, serve_fake(fake) as base_url:
        env = env_for(url, base_url, ledger, AGENTFN_REREAD_INTERVAL=str(REREAD))
        async with replicas(env, tmp_path, [port]) as running:
            # With the idle webhook.
            heard = fake.create_session(_long_tasks("w"))
            await _phase(ledger, "w_async", "start", 30)
            await _phase(ledger, "w_sync", "start", 30)
            fake.cancel_turn(heard)
            cancelled_at = time.monotonic()
            for call_id in ("w_async", "w_sync"):
                assert await _phase(ledger, call_id, "cancelled", 2) - cancelled_at < 2

            # Without any webhook: the periodic re-read of a session with a long call.
            silent = fake.create_session(_long_tasks("q"))
            await _phase(ledger, "q_async", "start", 30)
            await _phase(ledger, "q_sync", "start", 30)
            fake.webhooks.muted.add(silent)
            fake.cancel_turn(silent)
            for call_id in ("q_async", "q_sync"):
                await _phase(ledger, call_id, "cancelled", REREAD * 2 + 2)

            # Waiting for a person, and for a slot of limited_echo (two at once).
            waiting = fake.create_session(
                [
                    [
                        FakeCall("close_account", {"account_id": "acc_9"}, call_id="held"),
                        *(
                            FakeCall("limited_echo", {"text": "x", "delay_ms": 60_000}, f"e{i}")
                            for i in range(3)
                        ),
                    ]
                ]
            )
            wanted = {"awaiting_approval", "claimed", "waiting"}
            with anyio.fail_after(30):
                while True:
                    before = await _calls(env, waiting)
                    if {call["state"] for call in before.values()} == wanted:
                        break
                    await anyio.sleep(0.1)
            # Two of the three hold limited_echo's slots: which one waits is the line's.
            [waiter] = [c for c, call in before.items() if call["state"] == "waiting"]
            fake.cancel_turn(waiting)
            with anyio.fail_after(10):
                while True:
                    calls = await _calls(env, waiting)
                    if {c["state"] for c in calls.values()} == {"cancelled"}:
                        break
                    await anyio.sleep(0.1)
            assert "waited for a person's approval" in calls["held"]["reason"]
            assert "waited for a slot of its limiter" in calls[waiter]["reason"]
            code, out, err = await cli(env, "approvals", "--json")
            assert code == 0 and json.loads(out) == [], err
            await anyio.sleep(0.5)
            log = running[0].log()
    assert fake.submissions == []
    lines = ledger_lines(ledger)
    assert not [line for line in lines if line.get("phase") == "end"]
    assert not [line for line in lines if line.get("tool") == "close_account"]
    assert sorted(line["call_id"] for line in lines if line.get("tool") == "limited_echo") == []
    assert "cancelled: the turn was cancelled; stopped while it ran" in log


@pytest.mark.parametrize("backend", DURABLE)
async def test_a_killed_replicas_cancelled_call_is_not_run_by_the_survivor(
    backend: str, tmp_path: Path
) -> None:
    """The replica running ``long_task`` is SIGKILLed, then the turn is cancelled: the
    survivor hears the idle webhook and cancels the call instead of taking it over once
    the lease lapses; the call starts once only."""
    ledger = tmp_path / "ledger.jsonl"
    ports = [free_port(), free_port()]
    fake = FakeAgentsAPI(webhook_secret=SECRET)
    async with store_url_for(backend, tmp_path) as url, fake, serve_fake(fake) as base_url:
        env = env_for(url, base_url, ledger, AGENTFN_REREAD_INTERVAL=str(REREAD))
        async with replicas(env, tmp_path, ports) as running:
            fake.webhooks.urls.append(f"http://127.0.0.1:{ports[0]}/openai/webhooks")
            sid = fake.create_session([[FakeCall("long_task", {"seconds": 60}, call_id="k")]])
            await _phase(ledger, "k", "start", 30)
            running[0].process.send_signal(signal.SIGKILL)
            await running[0].process.wait()
            fake.webhooks.urls[:] = [f"http://127.0.0.1:{ports[1]}/openai/webhooks"]
            fake.cancel_turn(sid)
            with anyio.fail_after(15):
                while (await _calls(env, sid))["k"]["state"] != "cancelled":
                    await anyio.sleep(0.1)
            await anyio.sleep(2 * 2 + 1)  # past the dead holder's lease and margin
            record = (await _calls(env, sid))["k"]
    assert record["state"] == "cancelled" and record["attempt"] == 1
    assert "the turn was cancelled" in record["reason"]
    starts = [line for line in ledger_lines(ledger) if line.get("phase") == "start"]
    assert len(starts) == 1 and fake.submissions == []
