"""Shutdown, threads and configuration errors (issue 14).

Each test names what the code did before the fix.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import replace

import anyio
import pytest

from agentfn_asgi import FunctionTools
from agentfn_asgi.messages import THREADS_BUSY_MESSAGE, timeout_message
from agentfn_asgi.testing import FakeCall

from ..support.stack import FAST, running_stack

pytestmark = [pytest.mark.anyio, pytest.mark.reliability]


async def test_hung_sync_handlers_do_not_grow_the_thread_count() -> None:
    """Two threads, two handlers that hang past their timeout, then a third call.

    Before: the timed-out handlers' threads were abandoned and their capacity given back,
    so the third call ran in a third thread (the pool grew with every hung handler). Now:
    the hung handlers keep their threads, the third call waits for one and, none freeing
    up within thread_wait, fails with a message that says so. Never more than two threads
    run handlers at once."""
    release = threading.Event()
    lock = threading.Lock()
    running = 0
    peak = 0
    tools = FunctionTools()

    @tools.function(timeout=0.3)
    def stuck(n: int) -> str:
        """Hangs until released."""
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        try:
            release.wait(10)
        finally:
            with lock:
                running -= 1
        return "late"

    settings = replace(FAST, thread_pool_size=2, thread_wait=0.3)
    try:
        async with running_stack(tools, settings=settings) as stack:
            first = stack.fake.create_session(
                [
                    [
                        FakeCall("stuck", {"n": 1}, call_id="a"),
                        FakeCall("stuck", {"n": 2}, call_id="b"),
                    ]
                ]
            )
            await stack.fake.wait_idle(first, timeout=10)
            second = stack.fake.create_session([[FakeCall("stuck", {"n": 3}, call_id="c")]])
            await stack.fake.wait_idle(second, timeout=10)
    finally:
        release.set()
    by_call = {s.call_id: s.error for s in stack.fake.submissions}
    assert by_call["a"] == by_call["b"] == timeout_message("stuck", 0.3)
    assert by_call["c"] == THREADS_BUSY_MESSAGE.format(name="stuck", seconds=0.3)
    assert peak == 2


async def test_a_tool_timeout_counts_running_time_not_waiting_for_a_thread() -> None:
    """One thread, three 0.2 s handlers with a 0.35 s timeout: the last waits 0.4 s for the
    thread, longer than its timeout would allow if waiting counted, yet all three succeed."""
    tools = FunctionTools()

    @tools.function(timeout=0.35)
    def quick(n: int) -> int:
        """Takes 0.2 s."""
        threading.Event().wait(0.2)
        return n

    settings = replace(FAST, thread_pool_size=1)
    async with running_stack(tools, settings=settings) as stack:
        sid = stack.fake.create_session([[FakeCall("quick", {"n": n}) for n in range(3)]])
        await stack.fake.wait_idle(sid, timeout=10)
    assert sorted(s.output for s in stack.fake.submissions) == ["0", "1", "2"]


async def test_shutdown_claims_nothing_new_and_lets_running_calls_finish() -> None:
    """One concurrency slot: call A runs (0.6 s) when stop() begins; call B waits for the
    slot. Before: B was claimed and started once A's slot freed, then cancelled about a
    second later, left in doubt. Now: A finishes and is submitted within drain_timeout, B
    is never claimed or started and its delivery stays unresolved for the next process."""
    started: list[str] = []
    tools = FunctionTools()

    @tools.function
    async def work(name: str) -> str:
        """Works for a while."""
        started.append(name)
        await anyio.sleep(0.6)
        return name

    settings = replace(FAST, max_concurrency=1)
    async with running_stack(tools, settings=settings) as stack:
        sid_a = stack.fake.create_session([[FakeCall("work", {"name": "A"}, call_id="a")]])
        with anyio.fail_after(5):
            while started != ["A"]:
                await anyio.sleep(0.01)
        # A's turn ending sends an idle webhook, a delivery of its own: not this test's.
        stack.fake.webhooks.muted.add(sid_a)
        sid_b = stack.fake.create_session([[FakeCall("work", {"name": "B"}, call_id="b")]])
        with anyio.fail_after(5):
            while not (await stack.store.unresolved_deliveries(due_before=2e9)):
                await anyio.sleep(0.01)
        await stack.app.dispatcher.stop(drain_timeout=5)
        calls_b = await stack.store.calls_for_session(sid_b)
        unresolved = await stack.store.unresolved_deliveries(due_before=2e9)
    assert started == ["A"]
    assert [s.call_id for s in stack.fake.submissions] == ["a"]
    assert calls_b == []
    assert [d.session_id for d in unresolved] == [sid_b]
    assert sid_a not in [d.session_id for d in unresolved]


@pytest.mark.parametrize("status", [401, 403])
async def test_an_auth_failure_is_logged_once_as_a_configuration_error(
    status: int, caplog: pytest.LogCaptureFixture
) -> None:
    """401/403 on session reads are configuration errors: one ERROR line per cause naming
    the fix, however often the sweep retries; the delivery is kept, and answered once the
    API accepts the key again. Before: a WARNING per attempt, nothing saying what to fix."""
    tools = FunctionTools()

    @tools.function
    def ping() -> str:
        """Answers pong."""
        return "pong"

    caplog.set_level(logging.WARNING, logger="agentfn_asgi")
    async with running_stack(tools) as stack:
        stack.fake.fail_next("retrieve", 6, status=status)
        sid = stack.fake.create_session([[FakeCall("ping", {})]])
        await stack.fake.wait_idle(sid, timeout=15)
    errors = [r for r in caplog.records if r.name == "agentfn_asgi.dispatch.alarms"]
    assert len(errors) == 1 and errors[0].levelno == logging.ERROR
    hint = "OPENAI_API_KEY" if status == 401 else "OPENAI_PROJECT_ID"
    assert hint in errors[0].getMessage()
    assert [s.output for s in stack.fake.submissions] == ["pong"]
