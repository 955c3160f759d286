"""Three replicas of the Starlette example on one Redis or PostgreSQL store (issue 7).

The worst a load balancer plus retries can do: ``FakeAgentsAPI`` posts every webhook to all
three replicas at once. One replica is SIGKILLed mid-run; the other two finish its calls
once its leases expire, following the in-doubt rules (``create_refund`` reconciles from the
ledger, the others run again). Asserted: every call gets exactly one accepted result, and no
refund appears twice in the ledger.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from pathlib import Path

import anyio
import pytest

from agentfn_asgi.calls.records import CallQuery
from agentfn_asgi.store import open_store
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall, serve_fake

from .support.backends import SHARED, store_url_for
from .support.ports import free_port
from .support.replicas import replicas, taken_over_calls

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.backends]

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SESSIONS = 50
LEASE_SECONDS = 2.0


async def _wait_for_claim_by(url: str, pid: int) -> None:
    """Return once a slow call is claimed (handler running) by the replica with that pid.

    One listing per look (not one read per session): slow calls run 1.5 s, and a look that
    took longer than that under load could miss every one of them."""
    marker = f":{pid}:"  # Dispatcher owners are "host:pid:random"
    store = open_store(url)
    try:
        while True:
            # slow_echo (first step only) runs 1.5 s: still running when the SIGKILL lands.
            running = await store.list_calls(
                CallQuery(state="claimed", tool_name="slow_echo", limit=500)
            )
            if any(marker in (record.owner or "") for record in running):
                return
            await anyio.sleep(0.001)
    finally:
        await store.close()


def _sessions() -> list[list[list[FakeCall]]]:
    """Each session: a turn of four parallel calls (one refund), then a second step."""
    plans = []
    for i in range(SESSIONS):
        plans.append(
            [
                [
                    FakeCall("get_customer", {"customer_id": "123"}, call_id=f"c{i}_customer"),
                    FakeCall(
                        "create_refund",
                        {"order_id": f"ord_{i}", "amount_cents": 100 + i},
                        call_id=f"c{i}_refund",
                    ),
                    FakeCall("slow_echo", {"text": f"a{i}", "delay_ms": 1500}, call_id=f"c{i}_a"),
                    FakeCall("slow_echo", {"text": f"b{i}", "delay_ms": 1500}, call_id=f"c{i}_b"),
                ],
                [FakeCall("get_customer", {"customer_id": f"{i}"}, call_id=f"c{i}_z")],
            ]
        )
    return plans


@pytest.mark.parametrize("backend", SHARED)
async def test_three_replicas_one_store_one_result_per_call(
    backend: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """≥200 calls across 50 sessions, every webhook to all three replicas, one SIGKILLed."""
    ledger = tmp_path / "ledger.jsonl"
    ports = [free_port() for _ in range(3)]
    fake = FakeAgentsAPI(
        webhook_secret=SECRET,
        webhook_url=[f"http://127.0.0.1:{p}/openai/webhooks" for p in ports],
        webhook_concurrency=48,
    )
    plans = _sessions()
    expected = {call.call_id for plan in plans for step in plan for call in step}
    async with store_url_for(backend, tmp_path) as url, fake, serve_fake(fake) as base_url:
        env = {
            "OPENAI_API_KEY": "sk-test",
            "OPENAI_BASE_URL": base_url,
            "OPENAI_WEBHOOK_SECRET": SECRET,
            "AGENTFN_STORE_URL": url,
            "EXAMPLE_LEDGER": str(ledger),
            "AGENTFN_LEASE_SECONDS": str(LEASE_SECONDS),
            "AGENTFN_RECOVERY_INTERVAL": "0.5",
        }
        async with replicas(env, tmp_path, ports) as running:
            began = time.monotonic()
            session_ids = [fake.create_session(plan) for plan in plans]
            victim = running[0]
            # Kill it while it holds a live claim, so the takeover path is always taken.
            with anyio.fail_after(30):
                await _wait_for_claim_by(url, victim.process.pid)
            victim.process.send_signal(signal.SIGKILL)
            await victim.process.wait()
            killed_at = len(fake.submissions)
            try:
                with anyio.fail_after(60):
                    for session_id in session_ids:
                        await fake.wait_idle(session_id, timeout=60)
            except TimeoutError:
                logs = "\n".join(r.log()[-3000:] for r in running)
                pytest.fail(f"not finished: {len(fake.submissions)} results\n{logs}")
            elapsed = time.monotonic() - began
        taken_over = await taken_over_calls(url, session_ids)
    per_call = Counter(s.call_id for s in fake.submissions)
    assert set(per_call) == expected
    assert set(per_call.values()) == {1}, [c for c, n in per_call.items() if n > 1]
    refunds = Counter(json.loads(line)["call_id"] for line in ledger.read_text().splitlines())
    assert set(refunds.values()) == {1}
    assert set(refunds) == {f"c{i}_refund" for i in range(SESSIONS)}
    with capsys.disabled():
        print(
            f"\n[replicas/{backend}] {len(expected)} calls in {elapsed:.2f} s "
            f"({len(expected) / elapsed:.0f} calls/s), replica 0 killed after {killed_at} "
            f"results, {taken_over} of its calls taken over after the lease, "
            f"{len(fake.duplicate_submissions)} identical resubmissions absorbed"
        )
    # The killed replica had calls in flight: the others finished them (in-doubt rules).
    assert taken_over >= 1
    assert os.environ.get("AGENTFN_CRASH_AT") is None
