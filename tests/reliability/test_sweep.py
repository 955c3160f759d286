"""The recovery sweep: records that keep failing wait their turn and never hide the others.

Before the store contract gave every record its own next-attempt time, the sweep took the
oldest 100 unresolved deliveries with no cursor and no backoff: 100 records that always
fail (a session that cannot be read) hid every newer record forever. These tests fail on
that code (the healthy delivery below is the 151st oldest and was never reached).
"""

from __future__ import annotations

import logging

import pytest

from agentfn_asgi.dispatch import DispatchSettings
from agentfn_asgi.testing import FakeCall
from agentfn_asgi.tools import FunctionTools

from .stacks import fault_stack

pytestmark = [pytest.mark.anyio, pytest.mark.reliability]

#: The background sweep never runs by itself here: each test drives its passes, so "within
#: two recovery intervals" is counted in passes, not seconds. A missing session is not
#: "deleted" for an hour (it keeps failing), and is read once per pass.
BY_HAND = DispatchSettings(
    lease_seconds=5.0,
    recovery_interval=3600.0,
    recovery_grace=0.0,
    retry_base=30.0,
    not_found_grace=3600.0,
    not_found_retries=(),
)

FAILING = 150


def registry() -> FunctionTools:
    tools = FunctionTools()

    @tools.function
    def lookup(order_id: str) -> dict[str, str]:
        """Look an order up."""
        return {"order_id": order_id, "status": "shipped"}

    return tools


async def test_150_failing_deliveries_do_not_hide_a_healthy_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """150 recorded deliveries whose sessions always fail to read (404 within the grace),
    all older than one healthy delivery whose process crashed before resolving it: the
    first sweep pass answers the healthy call; each failing delivery is counted, keeps its
    error, and waits out its backoff (the next pass reads none of them again); each is told
    once at INFO (a session not found yet is expected: a webhooks test sample, a webhook
    ahead of its session), not as a warning, and the store's stats count them."""
    async with fault_stack(registry(), settings=BY_HAND, webhooks=False) as stack:
        store, dispatcher = stack.store, stack.app.dispatcher
        for n in range(FAILING):
            await store.record_delivery(f"wh_gone_{n:03}", f"sess_gone_{n:03}")
        healthy = stack.fake.create_session(
            [[FakeCall("lookup", {"order_id": "o1"}, call_id="call_ok")]]
        )
        await store.record_delivery("wh_healthy", healthy)  # recorded, then the process died

        with caplog.at_level(logging.INFO, logger="agentfn_asgi"):
            await dispatcher.sweep()
            await stack.fake.wait_for_submissions(1, timeout=10)
        assert [s.call_id for s in stack.fake.submissions] == ["call_ok"]

        failing = await store.list_deliveries(unresolved_only=True, limit=1000)
        assert len(failing) == FAILING
        assert {d.attempts for d in failing} == {1}
        assert all(d.last_error and "not found" in d.last_error for d in failing)
        assert all(d.next_attempt_at > stack.fake.clock() + 20 for d in failing)
        assert (await store.stats()).failing_deliveries == FAILING
        assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
        told = [r.getMessage() for r in caplog.records if "not found" in r.getMessage()]
        assert len(told) == FAILING  # one line per failing delivery, not one per read
        assert all(r.levelno == logging.INFO for r in caplog.records if "not found" in r.msg)

        reads_before = len([r for r in stack.fake.requests if r.route == "retrieve"])
        await dispatcher.sweep()
        reads_after = len([r for r in stack.fake.requests if r.route == "retrieve"])
        assert reads_after == reads_before  # everything failing waits for its retry time


async def test_a_sweep_reads_sessions_with_bounded_concurrency() -> None:
    """However many sessions are due, at most ``RESOLVERS`` are read at the same time."""
    from agentfn_asgi.dispatch.scheduler import RESOLVERS

    async with fault_stack(registry(), settings=BY_HAND, webhooks=False) as stack:
        for n in range(40):
            await stack.store.record_delivery(f"wh_{n}", f"sess_missing_{n}")
        stack.fake.set_latency("retrieve", 0.05)
        await stack.app.dispatcher.sweep()
        reads = sorted((r.at, r.at + 0.05) for r in stack.fake.requests if r.route == "retrieve")
    assert len(reads) == 40
    most = max(sum(1 for s, e in reads if s <= start < e) for start, _ in reads)
    assert most <= RESOLVERS
