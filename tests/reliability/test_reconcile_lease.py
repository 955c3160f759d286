"""Two live replicas on one store racing for an in-doubt side-effect call (issue 8).

The crash matrix kills the only process; here a crashed replica's claim is taken over while
*two* replicas are alive, which is where a lease that is not kept alive lets both of them
decide that the call has not run.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentfn_asgi.calls.records import CallKey, CallState
from agentfn_asgi.dispatch import DispatchSettings
from agentfn_asgi.store import open_store
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall
from agentfn_asgi.tools import FunctionTools, NotRun, Ran, ToolContext

from ..support.stack import API_KEY, SECRET, running_stack

pytestmark = [pytest.mark.anyio, pytest.mark.reliability]


def slow_reconcile_tools(ledger: Path, reconcile_seconds: float) -> FunctionTools:
    """A refund whose reconcile hook (a slow downstream lookup) outlasts the lease."""
    tools = FunctionTools()

    def reconcile(ctx: ToolContext, arguments: dict[str, Any]) -> Ran | NotRun:
        # The downstream answers from its state when asked, but the answer is slow to come.
        lines = ledger.read_text().splitlines() if ledger.exists() else []
        time.sleep(reconcile_seconds)
        for entry in map(json.loads, lines):
            if entry["call_id"] == ctx.call_id:
                return Ran(f"refunded {entry['order_id']}")
        return NotRun()

    @tools.function(side_effects=True, reconcile=reconcile)
    def refund(ctx: ToolContext, order_id: str) -> str:
        """Refund an order."""
        with ledger.open("a") as fh:
            fh.write(json.dumps({"call_id": ctx.call_id, "order_id": order_id}) + "\n")
        return f"refunded {order_id}"

    return tools


async def test_a_slow_reconcile_keeps_its_lease(tmp_path: Path) -> None:
    """A dead replica's call is in doubt; two live replicas sweep it. The first to claim it
    reconciles for longer than a lease; the second must see it busy, not take it over: the
    refund happens once."""
    ledger = tmp_path / "ledger.jsonl"
    settings = DispatchSettings(
        lease_seconds=0.3, recovery_interval=0.05, recovery_grace=0.05, retry_base=0.05
    )
    store = open_store("memory://")
    fake = FakeAgentsAPI(api_key=API_KEY, webhook_secret=SECRET)
    async with fake:
        sid = fake.create_session([[FakeCall("refund", {"order_id": "o1"}, call_id="c1")]])
        [action] = fake.required_actions(sid)
        # The replica that died right after claiming (its lease is already over).
        await store.claim_call(
            CallKey(sid, action["turn_id"], "c1"), tool_name="refund", owner="dead", lease_seconds=0
        )
        async with contextlib.AsyncExitStack() as replicas:
            for _ in range(2):
                await replicas.enter_async_context(
                    running_stack(
                        slow_reconcile_tools(ledger, reconcile_seconds=0.8),
                        store=store,
                        settings=settings,
                        fake=fake,
                    )
                )
            await fake.wait_idle(sid, timeout=5)
            await anyio.sleep(1.0)  # the slower replica finishes too
            [record] = await store.calls_for_session(sid)
    lines = ledger.read_text().splitlines() if ledger.exists() else []
    assert len(lines) == 1, lines
    assert len(fake.submissions) == 1
    assert record.state is CallState.SUBMITTED
