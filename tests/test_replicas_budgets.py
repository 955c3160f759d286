"""Call budgets across replicas: three real processes of the Starlette example on one
store, every webhook sent to all three. ``capped_lookup`` (the examples' contract:
``max_calls_per_session=3``, one ledger line ``{"call_id", "tool"}`` per execution) runs
exactly three of a session's calls however the replicas race, and every other call gets a
failure naming the budget; every call is answered once."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import anyio
import pytest

from agentfn_asgi.messages import CALL_BUDGET_MESSAGE
from agentfn_asgi.store import open_store
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall, serve_fake

from .support.backends import DURABLE, store_url_for
from .support.ports import free_port
from .support.replicas import replicas

pytestmark = [pytest.mark.anyio, pytest.mark.slow, pytest.mark.backends]

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
TOOL = "capped_lookup"
BUDGET = 3  # agentfn_asgi.demo.tools.CAPPED_CALLS, restated: the contract
CALLS = 8


@pytest.mark.parametrize("backend", DURABLE)
async def test_three_replicas_run_exactly_the_budget_of_a_session(
    backend: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Eight parallel calls of ``capped_lookup`` in one session, each webhook delivered to
    all three replicas: exactly three run (three ledger lines, three successes returning
    their key), five fail with the budget's message; each call is answered once, and the
    store counted places 1, 2 and 3."""
    ports = [free_port() for _ in range(3)]
    ledger = tmp_path / "ledger.jsonl"
    fake = FakeAgentsAPI(
        webhook_secret=SECRET,
        webhook_url=[f"http://127.0.0.1:{p}/openai/webhooks" for p in ports],
    )
    calls = [FakeCall(TOOL, {"key": f"k{n}"}, call_id=f"c{n}") for n in range(CALLS)]
    async with (
        store_url_for(backend, tmp_path) as url,
        fake,
        serve_fake(fake) as base_url,
    ):
        env = {
            "OPENAI_API_KEY": "sk-test",
            "OPENAI_BASE_URL": base_url,
            "OPENAI_WEBHOOK_SECRET": SECRET,
            "AGENTFN_STORE_URL": url,
            "EXAMPLE_LEDGER": str(ledger),
        }
        async with replicas(env, tmp_path, ports) as running:
            began = time.monotonic()
            session_id = fake.create_session([calls])
            try:
                with anyio.fail_after(60):
                    await fake.wait_idle(session_id, timeout=60)
            except TimeoutError:
                logs = "\n".join(r.log()[-3000:] for r in running)
                pytest.fail(f"not finished: {len(fake.submissions)} results\n{logs}")
            elapsed = time.monotonic() - began
        store = open_store(url)
        try:
            records = await store.calls_for_session(session_id)
        finally:
            await store.close()
    per_call = Counter(s.call_id for s in fake.submissions)
    assert per_call == Counter({call.call_id: 1 for call in calls})
    ran = [json.loads(line) for line in ledger.read_text().splitlines()]
    assert len(ran) == BUDGET
    assert all(set(line) == {"call_id", "tool"} and line["tool"] == TOOL for line in ran)
    succeeded = {s.call_id: s for s in fake.submissions if s.success}
    assert set(succeeded) == {line["call_id"] for line in ran}
    assert all(json.loads(s.output) == {"key": f"k{s.call_id[1:]}"} for s in succeeded.values())
    refused = [s for s in fake.submissions if not s.success]
    assert len(refused) == CALLS - BUDGET
    assert {s.error for s in refused} == {CALL_BUDGET_MESSAGE.format(name=TOOL, budget=BUDGET)}
    assert sorted(r.counted for r in records if r.counted is not None) == [1, 2, 3]
    with capsys.disabled():
        print(
            f"\n[budgets/{backend}] {CALLS} calls to 3 replicas, budget {BUDGET}: "
            f"{len(ran)} ran, {len(refused)} refused, all answered in {elapsed:.2f} s"
        )
