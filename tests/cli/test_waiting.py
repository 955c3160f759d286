"""Flow control in the CLI's reports: a call waiting for its tool's limit is listed in its
own state (``calls --state waiting``), ``calls show`` names its limit and since when it
waits, ``status`` counts the waiting calls per tool. Read through the real
:class:`~agentfn_asgi.operator.Operator` over the memory store."""

from __future__ import annotations

import pytest

from agentfn_asgi.calls.records import LIMITER_KEY_SEPARATOR, CallKey, ClaimStatus, Limit
from agentfn_asgi.cli.calls import format_call, format_calls
from agentfn_asgi.cli.ops import format_overview
from agentfn_asgi.operator import CallFilter, Operator
from agentfn_asgi.store.memory import MemoryStore

from ..support.clock import FakeClock

pytestmark = pytest.mark.anyio

LIMIT = Limit(name=f"report{LIMITER_KEY_SEPARATOR}acme", concurrency=1)


async def one_running_one_waiting(store: MemoryStore) -> tuple[CallKey, CallKey]:
    running, waiting = CallKey("sess", "turn", "c_run"), CallKey("sess", "turn", "c_wait")
    for key, status in ((running, ClaimStatus.CLAIMED), (waiting, ClaimStatus.WAITING)):
        outcome = await store.claim_call(
            key, tool_name="report", owner="replica-a", lease_seconds=30, limit=LIMIT
        )
        assert outcome.status is status
    return running, waiting


async def test_calls_lists_and_filters_the_waiting_state_and_show_names_the_limit() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    _, waiting = await one_running_one_waiting(store)
    began = clock()
    clock.advance(90)
    operator = Operator(store, location="memory://", clock=clock)

    page = await operator.calls(CallFilter(state="waiting"))
    [summary] = page.calls
    assert summary.call_id == waiting.call_id and summary.state == "waiting"
    assert summary.outcome == "waiting" and summary.limiter == "report:acme"
    assert summary.waiting_since == began
    listing = format_calls(list(page.calls), now=clock())
    assert "waiting" in listing and "limit report:acme" in listing

    shown = format_call(await operator.call(waiting.call_id), now=clock())
    assert "limit     report:acme" in shown
    assert "waiting   since" in shown and "(90 s ago)" in shown
    assert ": concurrency" in shown  # the history's waiting event says what refused it


async def test_status_counts_the_waiting_calls_per_tool() -> None:
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    await one_running_one_waiting(store)
    overview = await Operator(store, location="memory://", clock=clock).overview()
    assert overview.calls_waiting == 1 and overview.waiting_by_tool == {"report": 1}
    assert overview.outcomes["waiting"] == 1 and overview.outcomes["running"] == 1
    report = format_overview(overview, now=clock())
    assert "waiting         1 for a tool's limit (report 1)" in report
