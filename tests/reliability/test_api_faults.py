"""API faults (issue 8): each fault has its documented outcome and bounded retries.

The app, client and store are real and in process; the fake injects the fault. "Bounded"
is checked by counting the requests the fake saw: the client gives up after
``max_retries`` (or its total deadline), the call is left to the recovery sweep, and the
sweep retries once per ``recovery_interval``, so a fault lasting ``T`` seconds costs at
most about ``(T / interval + 2) * (max_retries + 1)`` requests: no hot loop.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from agentfn_asgi.calls.records import CallRecord, CallState
from agentfn_asgi.client import AgentsClient, RetryEvent
from agentfn_asgi.dispatch import DispatchSettings
from agentfn_asgi.dispatch.scheduler import RESOLVERS
from agentfn_asgi.errors import InternalServerError
from agentfn_asgi.results import success_event
from agentfn_asgi.store import Store
from agentfn_asgi.testing import (
    Connection,
    FakeAgentsAPI,
    FakeCall,
    RecordedRequest,
    action_required_event,
    signed_delivery,
)
from agentfn_asgi.testing.fake_validation import error_body
from agentfn_asgi.tools import FunctionTools, ToolContext

from ..support.stack import SECRET
from ..support.waiting import until
from .stacks import API_KEY, fault_stack

pytestmark = [pytest.mark.anyio, pytest.mark.reliability]

#: Quick sweeps so a call left for recovery is picked up within a few tenths of a second.
QUICK = DispatchSettings(
    lease_seconds=2.0, recovery_interval=0.1, recovery_grace=0.1, retry_base=0.05
)


class Tools:
    """A plain tool and a gated side-effect tool, counting their runs."""

    def __init__(self) -> None:
        self.runs: dict[str, int] = {}
        self.started = anyio.Event()
        self.release = anyio.Event()
        self.registry = FunctionTools()

        @self.registry.function
        def lookup(order_id: str) -> dict[str, str]:
            """Look an order up."""
            self.runs["lookup"] = self.runs.get("lookup", 0) + 1
            return {"order_id": order_id, "status": "shipped"}

        @self.registry.function(side_effects=True)
        async def refund(ctx: ToolContext, order_id: str) -> str:
            """Refund an order once the test releases it."""
            self.runs["refund"] = self.runs.get("refund", 0) + 1
            self.started.set()
            await self.release.wait()
            return f"refunded {order_id}"

    async def wait_started(self) -> None:
        with anyio.fail_after(5):
            await self.started.wait()


def requests(fake: FakeAgentsAPI, route: str, since: float = 0.0) -> list[RecordedRequest]:
    return [r for r in fake.requests if r.route == route and r.at >= since]


async def record_of(store: Store, session_id: str, call_id: str) -> CallRecord | None:
    for record in await store.calls_for_session(session_id):
        if record.key.call_id == call_id:
            return record
    return None


async def wait_state(
    stack: Connection, session_id: str, call_id: str, state: CallState
) -> CallRecord:
    with anyio.fail_after(5):
        while True:
            record = await record_of(stack.store, session_id, call_id)
            if record is not None and record.state is state:
                return record
            await anyio.sleep(0.02)


async def settle(stack: Connection) -> None:
    """Wait until the dispatcher holds nothing in flight (no task left behind)."""
    with anyio.fail_after(5):
        while stack.app.dispatcher.inflight:
            await anyio.sleep(0.02)


def lookup_session(fake: FakeAgentsAPI, call_id: str = "c1") -> str:
    return fake.create_session([[FakeCall("lookup", {"order_id": "o1"}, call_id=call_id)]])


@pytest.mark.exclusive
async def test_read_timeouts_are_retried_boundedly_then_recovered() -> None:
    """A session read slower than the client timeout: bounded attempts, then success later.

    Over real sockets (``httpx.ASGITransport`` has no timeouts) each read times out after
    0.1 s; the client tries twice and gives up, the delivery stays unresolved and the sweep
    tries again once per interval. When the API is fast again the call runs once.
    """
    tools = Tools()
    options: dict[str, Any] = {"timeout": 0.1, "max_retries": 1, "total_deadline": 2.0}
    async with fault_stack(
        tools.registry, settings=QUICK, loopback=True, client_options=options
    ) as stack:
        stack.fake.set_latency("retrieve", 0.4)
        began = time.time()
        sid = lookup_session(stack.fake)
        await anyio.sleep(1.0)
        stack.fake.set_latency("retrieve", 0)
        await stack.fake.wait_idle(sid, timeout=5)
        await settle(stack)
    # Every request the slow window produced (they are logged when the fake answers).
    slow = [r for r in requests(stack.fake, "retrieve") if r.at < began + 1.0 + 0.4]
    assert 2 <= len(slow) <= 2 * (1.0 / QUICK.recovery_interval + 2)
    assert tools.runs == {"lookup": 1}
    assert [s.call_id for s in stack.fake.submissions] == ["c1"]


async def test_a_submission_whose_answers_time_out_is_accepted_once() -> None:
    """Submissions time out (the API applies the first but its answer is lost): every retry
    and resubmission carries the same Idempotency-Key, so the result counts once."""
    tools = Tools()
    options: dict[str, Any] = {"timeout": 0.1, "max_retries": 1, "total_deadline": 2.0}
    async with fault_stack(
        tools.registry, settings=QUICK, loopback=True, client_options=options
    ) as stack:
        stack.fake.set_latency("submit", 0.3)
        sid = lookup_session(stack.fake)
        await stack.fake.wait_for_submissions(1, timeout=5)
        await anyio.sleep(0.5)
        stack.fake.set_latency("submit", 0)
        await wait_state(stack, sid, "c1", CallState.SUBMITTED)
        await settle(stack)
    submits = requests(stack.fake, "submit")
    assert len({r.idempotency_key for r in submits}) == 1
    assert len(submits) >= 2
    assert tools.runs == {"lookup": 1}
    assert len(stack.fake.submissions) == 1


async def test_connection_drops_are_retried_with_the_same_key() -> None:
    """A dropped read is retried; a submission applied before its connection dropped is
    resent with the same key and answered 202 without a second effect."""
    tools = Tools()
    async with fault_stack(tools.registry, settings=QUICK) as stack:
        stack.fake.drop_next("retrieve", 1)
        stack.fake.drop_next("submit", 2, after_processing=True)
        sid = lookup_session(stack.fake)
        await wait_state(stack, sid, "c1", CallState.SUBMITTED)
        await settle(stack)
    submits = requests(stack.fake, "submit")
    assert [r.status for r in submits] == [None, None, 202]
    assert len({r.idempotency_key for r in submits}) == 1
    assert [r.status for r in requests(stack.fake, "retrieve")][:2] == [None, 200]
    assert tools.runs == {"lookup": 1}
    assert len(stack.fake.submissions) == 1


async def test_429_retry_after_is_honoured() -> None:
    """429 with ``Retry-After: 0.3``: the client waits exactly what was asked, twice, then
    succeeds (real sleeps: the gaps between attempts are measured)."""
    tools = Tools()
    retries: list[RetryEvent] = []
    async with fault_stack(
        tools.registry,
        settings=QUICK,
        client_options={"on_retry": retries.append, "sleep": anyio.sleep},
    ) as stack:
        stack.fake.fail_next("submit", 2, 429, retry_after=0.3)
        sid = lookup_session(stack.fake)
        await wait_state(stack, sid, "c1", CallState.SUBMITTED)
    assert [(e.status, e.delay, e.reason) for e in retries] == [(429, 0.3, "status")] * 2
    times = [r.at for r in requests(stack.fake, "submit")]
    assert len(times) == 3
    assert all(later - earlier >= 0.29 for earlier, later in itertools.pairwise(times))
    assert len(stack.fake.submissions) == 1


async def test_429_asking_for_too_long_gives_up_at_once_and_recovers() -> None:
    """``Retry-After: 3600`` is beyond ``max_retry_after``: no retry and no hour-long sleep;
    the saved result is resubmitted by the sweep (one request per interval at most)."""
    tools = Tools()
    retries: list[RetryEvent] = []
    async with fault_stack(
        tools.registry, settings=QUICK, client_options={"on_retry": retries.append}
    ) as stack:
        stack.fake.fail_next("submit", 1, 429, retry_after=3600)
        sid = lookup_session(stack.fake)
        await wait_state(stack, sid, "c1", CallState.SUBMITTED)
    assert retries == []
    assert [r.status for r in requests(stack.fake, "submit")] == [429, 202]
    assert tools.runs == {"lookup": 1}


async def test_5xx_bursts_within_the_retry_budget_recover_in_one_pass() -> None:
    """502s on the read and 500/503s on the submit, fewer than ``max_retries``: the client
    rides them out; one run, one result."""
    tools = Tools()
    retries: list[RetryEvent] = []
    async with fault_stack(
        tools.registry, settings=QUICK, client_options={"on_retry": retries.append}
    ) as stack:
        stack.fake.fail_next("retrieve", 3, 502)
        stack.fake.fail_next("submit", 2, 500)
        stack.fake.fail_next("submit", 2, 503)
        sid = lookup_session(stack.fake)
        await wait_state(stack, sid, "c1", CallState.SUBMITTED)
    assert [r.status for r in requests(stack.fake, "retrieve")][:4] == [502, 502, 502, 200]
    assert [r.status for r in requests(stack.fake, "submit")] == [500, 500, 503, 503, 202]
    assert sorted(e.status or 0 for e in retries) == [500, 500, 502, 502, 502, 503, 503]
    assert tools.runs == {"lookup": 1}


@pytest.mark.exclusive
async def test_a_long_503_outage_costs_bounded_requests() -> None:
    """Submissions fail for a whole second: each pass makes ``max_retries + 1`` attempts and
    passes come once per sweep interval; the result is sent when the API is back."""
    tools = Tools()
    async with fault_stack(
        tools.registry, settings=QUICK, client_options={"max_retries": 2}
    ) as stack:
        stack.fake.fail_next("submit", 10_000, 503)
        sid = lookup_session(stack.fake)
        await anyio.sleep(1.0)
        during = len(requests(stack.fake, "submit"))
        stack.fake.faults.failures["submit"].clear()
        await wait_state(stack, sid, "c1", CallState.SUBMITTED)
        await settle(stack)
    assert 3 <= during <= (1.0 / QUICK.recovery_interval + 2) * 3
    assert tools.runs == {"lookup": 1}
    assert len(stack.fake.submissions) == 1


@pytest.mark.exclusive
async def test_the_client_gives_up_by_its_total_deadline() -> None:
    """Permanent 503 with generous ``max_retries``: real backoff sleeps stop at the total
    deadline, never past it."""
    fake = FakeAgentsAPI(api_key=API_KEY, webhook_secret=SECRET)
    fake.fail_next("retrieve", 1000, 503)
    transport = httpx.ASGITransport(app=fake)
    async with httpx.AsyncClient(transport=transport) as http:
        client = AgentsClient(
            api_key=API_KEY,
            base_url="http://fake.test/v1",
            http_client=http,
            max_retries=50,
            total_deadline=0.8,
        )
        began = time.monotonic()
        with pytest.raises(InternalServerError):
            await client.retrieve_session("sess_gone")
        elapsed = time.monotonic() - began
    assert elapsed < 1.0
    # Backoff 0.25 s doubling (with jitter): three or four attempts fit in 0.8 s, not 51.
    assert 2 <= len(requests(fake, "retrieve")) <= 5


async def test_the_race_400_outlasting_the_client_is_resubmitted_by_the_sweep() -> None:
    """ "Unknown pending tool call" for a call that *is* pending, four times: the client's
    three race retries run out, a fresh read shows the call still pending, the saved result
    is kept and the sweep resubmits it (same key): accepted once, never re-run."""
    tools = Tools()
    race = error_body("Unknown pending tool call: c1", code="invalid_request_error")
    async with fault_stack(tools.registry, settings=QUICK) as stack:
        stack.fake.fail_next("submit", 4, 400, body=race)
        sid = lookup_session(stack.fake)
        record = await wait_state(stack, sid, "c1", CallState.SUBMITTED)
    submits = requests(stack.fake, "submit")
    assert [r.status for r in submits] == [400, 400, 400, 400, 202]
    assert record.result is not None
    assert {r.idempotency_key for r in submits} == {record.result.idempotency_key}
    assert tools.runs == {"lookup": 1}
    assert len(stack.fake.submissions) == 1


async def test_a_409_for_a_different_answer_leaves_the_call_stale() -> None:
    """Someone else answered the call while our handler ran: our submission gets 409
    ``conflict_error``, which is permanent, so it is not retried; a fresh read shows the call
    is no longer pending, and the call becomes stale. The other answer stands; the handler
    ran once."""
    tools = Tools()
    async with fault_stack(
        tools.registry, settings=QUICK, client_options={"max_retries": 2}
    ) as stack:
        sid = stack.fake.create_session([[FakeCall("refund", {"order_id": "o1"}, call_id="c1")]])
        await tools.wait_started()
        # Unheard: the turn's end reaches the app only through the refused submission (with
        # its idle webhook, the handler could be stopped first: tests/dispatch/test_cancelling).
        stack.fake.webhooks.muted.add(sid)
        [action] = stack.fake.required_actions(sid)
        other = success_event(action["turn_id"], "c1", "answered elsewhere")
        await stack.client.submit_events(sid, [other], idempotency_key="someone-else")
        tools.release.set()
        record = await wait_state(stack, sid, "c1", CallState.STALE)
        await settle(stack)
    ours = [
        r
        for r in requests(stack.fake, "submit")
        if record.result is not None and r.idempotency_key == record.result.idempotency_key
    ]
    assert [r.status for r in ours] == [409]
    assert [(s.output, s.idempotency_key) for s in stack.fake.submissions] == [
        ("answered elsewhere", "someone-else")
    ]
    assert tools.runs == {"refund": 1}


async def test_a_turn_cancelled_mid_call_unheard_leaves_the_call_stale() -> None:
    """The turn is cancelled while a side-effect handler runs and no idle webhook reaches
    the app: the late result is refused, retried only as the registration race (3 times),
    then the call is stale for good."""
    tools = Tools()
    async with fault_stack(tools.registry, settings=QUICK) as stack:
        sid = stack.fake.create_session([[FakeCall("refund", {"order_id": "o1"}, call_id="c1")]])
        await tools.wait_started()
        stack.fake.webhooks.muted.add(sid)
        assert stack.fake.cancel_turn(sid)
        tools.release.set()
        await wait_state(stack, sid, "c1", CallState.STALE)
        await settle(stack)
        stale_at = time.time()
        await anyio.sleep(0.5)  # five sweep intervals: nothing more happens
    assert [r.status for r in requests(stack.fake, "submit")] == [400] * 4
    assert requests(stack.fake, "submit", since=stale_at) == []
    assert len(requests(stack.fake, "retrieve", since=stale_at)) == 0
    assert stack.fake.submissions == []
    assert tools.runs == {"refund": 1}


async def test_a_vanished_session_is_forgotten_without_a_hot_loop() -> None:
    """The session is deleted while its handler runs: the submission's 404 is checked with
    one read of the session (404, past the not-found grace, 0 here) and the call is stale
    (no resubmission). A new delivery for the gone session is read once (404) and resolved.
    Over the next second of 0.1 s sweeps, nobody asks about it again."""
    tools = Tools()
    settings = replace(QUICK, not_found_grace=0.0, not_found_retries=())
    async with fault_stack(tools.registry, settings=settings) as stack:
        sid = stack.fake.create_session([[FakeCall("refund", {"order_id": "o1"}, call_id="c1")]])
        await tools.wait_started()
        stack.fake.delete_session(sid)
        tools.release.set()
        await wait_state(stack, sid, "c1", CallState.STALE)
        body, headers = signed_delivery(SECRET, action_required_event(sid))
        assert (await stack.post_webhook(body, headers)).status_code == 200

        async def new_delivery_settled() -> bool:
            reads = [r for r in stack.fake.requests if sid in r.path and r.route == "retrieve"]
            return len(reads) >= 3 and (await stack.store.stats()).unresolved_deliveries == 0

        await until(new_delivery_settled)
        quiet_from = time.time()
        await anyio.sleep(1.0)
        stats = await stack.store.stats()
    gone = [r for r in stack.fake.requests if sid in r.path]
    assert [(r.route, r.status) for r in gone if r.route == "submit"] == [("submit", 404)]
    assert [r.status for r in gone if r.route == "retrieve"] == [200, 404, 404]
    assert [r for r in gone if r.at >= quiet_from] == []
    assert stats.unresolved_deliveries == 0
    assert tools.runs == {"refund": 1}


async def test_a_session_not_found_at_first_is_read_again_and_answered() -> None:
    """A 404 right after the webhook (the session not readable yet) is read again with
    short pauses, then by the sweep within the not-found grace: the call is answered.
    (Before, the first 404 settled the delivery as deleted and the call was never run.)"""
    tools = Tools()
    tools.release.set()
    settings = replace(QUICK, not_found_retries=(0.05,))
    async with fault_stack(tools.registry, settings=settings) as stack:
        stack.fake.fail_next("retrieve", 3, status=404)
        sid = stack.fake.create_session([[FakeCall("refund", {"order_id": "o1"}, call_id="c1")]])
        await stack.fake.wait_idle(sid, timeout=10)
    assert [s.call_id for s in stack.fake.submissions] == ["c1"]
    retrieves = [r.status for r in stack.fake.requests if r.route == "retrieve"]
    assert retrieves[:3] == [404, 404, 404] and retrieves[3] == 200


@pytest.mark.slow
async def test_failing_session_reads_do_not_hold_up_a_healthy_session() -> None:
    """1,000 sessions whose reads fail (500s over loopback) are queued before a healthy one:
    each failing read is tried once and waits for its retry off the resolvers, behind fresh
    work, so the healthy session is read right after those first tries and answered. (Before,
    each failing read held a resolver through all its retries: about 3 s each, 8 at a time.)
    """
    tools = Tools()
    async with fault_stack(tools.registry, settings=QUICK, loopback=True, webhooks=False) as stack:
        failing = [lookup_session(stack.fake) for _ in range(1000)]
        for sid in failing:
            stack.fake.fail_next("retrieve", 5, 500, session_id=sid)
        healthy = lookup_session(stack.fake)
        dispatcher = stack.app.dispatcher
        for sid in failing:
            dispatcher.schedule(sid)
        began = time.monotonic()
        dispatcher.schedule(healthy)
        # Not a timing bound: only a limit to fail at (before, this took about 6 minutes).
        await stack.fake.wait_for_submissions(1, timeout=20)
        answered = time.monotonic() - began
    print(f"healthy session answered {answered:.2f} s after 1,000 failing ones")
    reads = [r.path.rsplit("/", 1)[1] for r in requests(stack.fake, "retrieve")]
    before = reads[: reads.index(healthy)]
    # Read before it: the failing sessions' first tries, and no retry but those the other
    # resolvers had under way (the fake records a request when it answers).
    assert len(before) - len(set(before)) < 2 * RESOLVERS
    assert len(set(before)) > 1000 - RESOLVERS
    assert [s.session_id for s in stack.fake.submissions][:1] == [healthy]


@pytest.mark.slow
async def test_fresh_work_goes_before_reads_waiting_for_their_retry() -> None:
    """Reads slowed to 20 ms, so that retries of 300 failing sessions pile up on the queue:
    a session scheduled then is read before them."""
    tools = Tools()
    async with fault_stack(tools.registry, settings=QUICK, loopback=True, webhooks=False) as stack:
        stack.fake.set_latency("retrieve", 0.02)
        failing = [lookup_session(stack.fake) for _ in range(300)]
        for sid in failing:
            stack.fake.fail_next("retrieve", 5, 500, session_id=sid)
        dispatcher = stack.app.dispatcher
        for sid in failing:
            dispatcher.schedule(sid)

        async def retries_waiting() -> bool:  # every session tried once, many due again
            tried = len(requests(stack.fake, "retrieve")) >= len(failing)
            return tried and dispatcher._queue is not None and dispatcher._queue.qsize() >= 100

        await until(retries_waiting)
        healthy = lookup_session(stack.fake)
        mark = len(stack.fake.requests)
        dispatcher.schedule(healthy)
        await stack.fake.wait_for_submissions(1, timeout=20)
    seen: set[str] = set()
    retried = 0
    for index, request in enumerate(requests(stack.fake, "retrieve")):
        sid = request.path.rsplit("/", 1)[1]
        if sid == healthy:
            break
        retried += sid in seen and index >= mark
        seen.add(sid)
    # Only reads under way when it came (one per resolver), or begun while its own read was
    # (the other resolvers'), are answered before it: 224 of them without the ranking.
    assert retried < 2 * RESOLVERS


async def test_a_failing_live_read_keeps_its_tries_and_waits() -> None:
    """A session read failing with 503 and ``Retry-After: 0.2`` is tried as the client's own
    loop would (the first try and ``max_retries`` more, each after the wait asked for), while
    another session is read and answered in between, then left to the sweep."""
    tools = Tools()
    retries: list[RetryEvent] = []
    settings = replace(QUICK, recovery_interval=30.0)
    async with fault_stack(
        tools.registry,
        settings=settings,
        webhooks=False,
        client_options={"on_retry": retries.append, "sleep": anyio.sleep, "max_retries": 3},
    ) as stack:
        failing, healthy = lookup_session(stack.fake), lookup_session(stack.fake)
        stack.fake.fail_next("retrieve", 4, 503, retry_after=0.2, session_id=failing)
        stack.app.dispatcher.schedule(failing)
        stack.app.dispatcher.schedule(healthy)
        await stack.fake.wait_for_submissions(1, timeout=5)

        async def four_tries() -> bool:
            return len(requests(stack.fake, "retrieve")) >= 5

        await until(four_tries)
        await anyio.sleep(0.3)  # and no fifth
    reads = [(r.path.rsplit("/", 1)[1], r.status, r.at) for r in requests(stack.fake, "retrieve")]
    tries = [(status, at) for sid, status, at in reads if sid == failing]
    assert [status for status, _ in tries] == [503] * 4
    assert all(later[1] - earlier[1] >= 0.19 for earlier, later in itertools.pairwise(tries))
    assert [(status, at < tries[1][1]) for sid, status, at in reads if sid == healthy] == [
        (200, True)
    ]
    assert [(e.attempt, e.delay, e.status) for e in retries] == [(n, 0.2, 503) for n in (1, 2, 3)]
    assert [s.session_id for s in stack.fake.submissions] == [healthy]


async def test_a_delivery_flood_keeps_the_queue_bounded() -> None:
    """Scheduling far more sessions than ``max_queued_sessions`` does not grow the queue: the
    overflow is dropped from memory (a recorded delivery behind it waits in the store for
    the recovery sweep)."""
    settings = DispatchSettings(
        lease_seconds=2.0, recovery_interval=0.1, recovery_grace=0.1, max_queued_sessions=50
    )
    async with fault_stack(FunctionTools(), settings=settings, webhooks=False) as stack:
        dispatcher = stack.app.dispatcher
        for n in range(5000):
            dispatcher.schedule(f"sess_flood_{n}")
        queued = dispatcher._queue.qsize() if dispatcher._queue is not None else 0
    assert queued <= 50


async def test_an_error_answer_that_is_not_valid_unicode_is_recorded_and_retried(
    tmp_path: Path,
) -> None:
    """The API's error JSON escapes a lone surrogate in its code and message (``\\ud800``):
    the failure is still recorded by a store that writes UTF-8 (SQLite; it refuses such
    text) and the call retried to success."""
    tools = Tools()
    body = b'{"error":{"message":"bad \\ud800","code":"odd_\\ud800"}}'
    async with fault_stack(
        tools.registry,
        settings=QUICK,
        client_options={"max_retries": 0},
        store=f"sqlite:///{tmp_path / 'store.sqlite3'}",
    ) as stack:
        stack.fake.fail_next("submit", 2, 500, body=body)
        stack.fake.fail_next("retrieve", 1, 503, body=body)
        sid = lookup_session(stack.fake)
        record = await wait_state(stack, sid, "c1", CallState.SUBMITTED)
    assert [r.status for r in requests(stack.fake, "submit")] == [500, 500, 202]
    assert tools.runs == {"lookup": 1}
    assert record.result is not None
