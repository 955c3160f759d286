"""Self-fencing in one process, and its documented limit: a thread cannot be stopped.

The first attempt's lease renewals fail (its holder is cut off from the store, as in an
outage that only it sees); every other store operation is the real memory store's. The
holder fences itself, the recovery sweep takes the call over as attempt 2, and the
reconcile hook finds no side effect yet. What the first attempt's handler still does then
depends on whether it can be stopped:

- an async handler is cancelled at its next ``await``: the side effect happens once;
- a sync handler runs on in its thread: its result is dropped (never saved or submitted),
  but its side effect happens a second time, under the *same* ``ctx.idempotency_key``, which
  is what a downstream API deduplicates by. docs/guarantees.md states exactly this limit.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest

from agentfn_asgi import FunctionTools, NotRun, Ran, ToolContext
from agentfn_asgi.calls.records import CallKey, CallState
from agentfn_asgi.dispatch import DispatchSettings
from agentfn_asgi.errors import StoreError
from agentfn_asgi.store.memory import MemoryStore
from agentfn_asgi.testing import FakeCall

from .stacks import fault_stack

pytestmark = [pytest.mark.anyio, pytest.mark.reliability]

#: Short leases; the sweep looks often, so the takeover follows the lapse closely.
SETTINGS = DispatchSettings(
    lease_seconds=0.3, recovery_interval=0.05, recovery_grace=0.05, retry_base=0.05
)


class FirstAttemptCutOff(MemoryStore):
    """Attempt 1 can never renew its lease (StoreError); everything else is real."""

    async def renew_lease(
        self, key: CallKey, *, owner: str, attempt: int, lease_seconds: float
    ) -> bool:
        if attempt == 1:
            raise StoreError("connection lost (injected: attempt 1 is cut off)")
        return await super().renew_lease(
            key, owner=owner, attempt=attempt, lease_seconds=lease_seconds
        )


@dataclass
class Refunds:
    """A refund tool whose first attempt waits for the test; ``effects`` is the "payment
    provider": one ``(attempt, idempotency key)`` per execution that got that far."""

    effects: list[tuple[int, str]] = field(default_factory=list)
    release: threading.Event = field(default_factory=threading.Event)
    released: anyio.Event = field(default_factory=anyio.Event)

    def reconcile(self, ctx: ToolContext, arguments: dict[str, Any]) -> Ran | NotRun:
        if any(key == ctx.idempotency_key for _, key in self.effects):
            return Ran({"order_id": arguments["order_id"], "reconciled": True})
        return NotRun()

    def sync_tools(self) -> FunctionTools:
        tools = FunctionTools()

        @tools.function(side_effects=True, reconcile=self.reconcile)
        def refund(ctx: ToolContext, order_id: str) -> dict[str, Any]:
            """Refund an order (sync: runs in the thread pool)."""
            if ctx.attempt == 1:
                self.release.wait(10)
            self.effects.append((ctx.attempt, ctx.idempotency_key))
            return {"order_id": order_id, "attempt": ctx.attempt}

        return tools

    def async_tools(self) -> FunctionTools:
        tools = FunctionTools()

        @tools.function(side_effects=True, reconcile=self.reconcile)
        async def refund(ctx: ToolContext, order_id: str) -> dict[str, Any]:
            """Refund an order (async: cancellable at every await)."""
            if ctx.attempt == 1:
                await self.released.wait()
            self.effects.append((ctx.attempt, ctx.idempotency_key))
            return {"order_id": order_id, "attempt": ctx.attempt}

        return tools


async def _run_lapsed(
    tools: FunctionTools, refunds: Refunds, *, first_runs_on: bool
) -> tuple[Any, Any]:
    """One refund call whose first attempt loses its lease; returns (stack, record) once the
    session is answered and attempt 1's handler was released (and, if ``first_runs_on``,
    has reached its side effect)."""
    async with fault_stack(tools, settings=SETTINGS, store=FirstAttemptCutOff()) as stack:
        sid = stack.fake.create_session([[FakeCall("refund", {"order_id": "o1"}, call_id="c1")]])
        await stack.fake.wait_idle(sid, timeout=10)
        # Attempt 2 answered while attempt 1 was still waiting; now let attempt 1 go on.
        refunds.release.set()
        refunds.released.set()
        with anyio.fail_after(10):
            while first_runs_on and not any(attempt == 1 for attempt, _ in refunds.effects):
                await anyio.sleep(0.01)
        await anyio.sleep(SETTINGS.recovery_interval * 4)  # sweeps run: nothing changes
        [record] = await stack.store.calls_for_session(sid)
    return stack, record


async def test_a_fenced_async_handler_is_cancelled_and_its_side_effect_happens_once() -> None:
    """The holder of attempt 1 cannot renew: its async handler is cancelled before the side
    effect; attempt 2 (reconcile: not run) runs it; one effect, one result. Fails on the
    code before self-fencing (issue 14): a lost lease only stopped the heartbeat, so attempt 1
    kept its handler running and did the side effect a second time."""
    refunds = Refunds()
    stack, record = await _run_lapsed(refunds.async_tools(), refunds, first_runs_on=False)
    assert [attempt for attempt, _ in refunds.effects] == [2]
    [submission] = stack.fake.submissions
    assert '"attempt":2' in str(submission.output)
    assert record.state is CallState.SUBMITTED and record.attempt == 2


async def test_a_fenced_sync_handler_runs_on_but_its_result_is_dropped() -> None:
    """The documented limit: attempt 1's thread cannot be stopped. Its result is dropped
    (the accepted result is attempt 2's, and stays so), but its side effect happens too,
    under the same idempotency key as attempt 2's: only a downstream that deduplicates by
    ``ctx.idempotency_key`` makes it count once."""
    refunds = Refunds()
    stack, record = await _run_lapsed(refunds.sync_tools(), refunds, first_runs_on=True)
    assert [attempt for attempt, _ in refunds.effects] == [2, 1]
    assert len({key for _, key in refunds.effects}) == 1
    [submission] = stack.fake.submissions
    assert '"attempt":2' in str(submission.output)
    assert record.state is CallState.SUBMITTED and record.attempt == 2
    assert record.result is not None
    assert '"attempt":2' in json.loads(record.result.event_json)["output"]
