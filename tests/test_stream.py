"""Stream mode (``agentfn_asgi.stream``, ``AgentWebhookApp.follow``) over real loopback HTTP
against ``FakeAgentsAPI``: no webhook reaches the app; the session's event stream drives it
through the same store and dispatcher."""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from agentfn_asgi import FunctionTools
from agentfn_asgi.backoff import Backoff
from agentfn_asgi.calls.records import CallState
from agentfn_asgi.client import AgentsClient
from agentfn_asgi.errors import AuthenticationError
from agentfn_asgi.stream import FollowSummary, follow_session, stream_delivery_id
from agentfn_asgi.testing import Connection, FakeAgentsAPI, FakeCall, RawJSON, serve_fake
from agentfn_asgi.wire import AgentSession
from tests.support.stack import API_KEY, FAST, SECRET, running_stack

pytestmark = pytest.mark.anyio

FAST_BACKOFF = Backoff(base=0.01, cap=0.05)
TWO_STEPS = [
    [FakeCall("lookup", {"key": "a"}), FakeCall("lookup", {"key": "b"})],
    [FakeCall("lookup", {"key": "c"})],
]
#: Arguments a model could write: nested 100,000 levels deep (Python's json parser raises
#: RecursionError on them, not ValueError).
DEEP = RawJSON('{"key": ' + "[" * 100_000 + "]" * 100_000 + "}")
#: Step 2's calls are pending only after the follower subscribed: the deep arguments reach
#: it in the streamed snapshots (``requires_action``, the turn's items), not in its first read.
DEEP_SECOND_STEP = [
    [FakeCall("lookup", {"key": "a"})],
    [FakeCall("lookup", DEEP, call_id="deep"), FakeCall("lookup", {"key": "c"})],
]


def counting_tools() -> tuple[FunctionTools, collections.Counter[str]]:
    """A registry whose one tool counts how often it ran per argument."""
    tools = FunctionTools()
    runs: collections.Counter[str] = collections.Counter()

    @tools.function
    def lookup(key: str) -> str:
        """Look a key up."""
        runs[key] += 1
        return f"value of {key}"

    return tools, runs


async def stack(tools: FunctionTools) -> AsyncIterator[Connection]:
    # The fake sends no webhook: only the stream can drive the app.
    async with running_stack(tools, webhooks=False, loopback=True) as conn:
        yield conn


async def test_follow_drives_a_session_to_idle_and_returns_its_summary() -> None:
    """``follow`` runs every call of both steps once, through the store (deliveries
    recorded, calls submitted), and returns when the session is idle."""
    tools, runs = counting_tools()
    async for conn in stack(tools):
        session_id = conn.fake.create_session(TWO_STEPS)
        async with asyncio.timeout(20):
            summary = await conn.app.follow(session_id, backoff=FAST_BACKOFF)
        assert summary == FollowSummary(
            session_id=session_id,
            status="idle",
            calls_owed=3,
            calls_run=3,
            results_submitted=3,
            deliveries=2,
            reconnects=0,
        )
        assert runs == {"a": 1, "b": 1, "c": 1}
        assert [s.output for s in conn.fake.submissions][-1] == "value of c"
        records = await conn.store.calls_for_session(session_id)
        assert {r.state for r in records} == {CallState.SUBMITTED}
        deliveries = await conn.store.list_deliveries(limit=10)
        assert {d.session_id for d in deliveries} == {session_id}
        assert len(deliveries) == 2


async def test_a_stream_dropped_mid_turn_is_reconnected_and_nothing_runs_twice() -> None:
    """The stream is cut instead of sending step 2's ``requires_action``: that event is
    lost, so only the re-read after reconnecting shows call ``c``; it still runs once."""
    tools, runs = counting_tools()
    async for conn in stack(tools):
        session_id = conn.fake.create_session(TWO_STEPS)
        conn.fake.cut_streams(session_id, before="agent.session.requires_action")
        async with asyncio.timeout(20):
            summary = await conn.app.follow(session_id, backoff=FAST_BACKOFF)
        assert summary.status == "idle"
        assert summary.reconnects >= 1
        assert (summary.calls_run, summary.results_submitted) == (3, 3)
        assert runs == {"a": 1, "b": 1, "c": 1}
        assert len(conn.fake.submissions) == 3
        assert conn.fake.duplicate_submissions == []
        assert not conn.fake.faults.stream_cuts  # the planned cut happened


async def test_a_stream_cut_while_a_call_runs_does_not_run_it_again() -> None:
    """Cutting every open stream while step 1's handler runs: the reconnect re-reads the
    session, still sees the call pending (it is in flight), and does not start it again."""
    tools = FunctionTools()
    started = asyncio.Event()
    release = asyncio.Event()
    runs: collections.Counter[str] = collections.Counter()

    @tools.function
    async def slow(key: str) -> str:
        """Wait for the test."""
        runs[key] += 1
        started.set()
        await release.wait()
        return key

    async for conn in stack(tools):
        session_id = conn.fake.create_session([[FakeCall("slow", {"key": "x"})]])
        follow = asyncio.create_task(conn.app.follow(session_id, backoff=FAST_BACKOFF))
        async with asyncio.timeout(20):
            await started.wait()
            listeners = conn.fake.sessions[session_id].listeners
            cut = set(map(id, listeners))
            assert conn.fake.cut_streams(session_id) == 1
            while not set(map(id, listeners)) - cut:
                await asyncio.sleep(0.01)  # until the follower has subscribed again
            release.set()
            summary = await follow
        assert summary.reconnects >= 1
        assert runs == {"x": 1}
        assert len(conn.fake.submissions) == 1


async def test_an_event_too_deeply_nested_to_parse_is_skipped_and_the_session_read() -> None:
    """Issue 22: step 2's snapshot quotes arguments nested 100,000 levels deep. Before, the
    stream's parser raised RecursionError out of ``follow`` (and ``listen``'s watcher, for
    every session it followed). Now the event is logged and skipped, the session is read
    again instead, and the turn completes: the deep call fails saying why, its sibling runs."""
    tools, runs = counting_tools()
    async for conn in stack(tools):
        session_id = conn.fake.create_session(DEEP_SECOND_STEP)
        async with asyncio.timeout(20):
            summary = await conn.app.follow(session_id, backoff=FAST_BACKOFF)
        assert summary.status == "idle"
        assert (summary.calls_owed, summary.results_submitted) == (3, 3)
        assert summary.reconnects == 0  # skipped in place: the stream was never dropped
    assert runs == {"a": 1, "c": 1}
    by_call = {s.call_id: s for s in conn.fake.submissions}
    assert by_call["deep"].success is False
    assert "could not be read" in (by_call["deep"].error or "")


async def test_an_unreadable_event_is_logged_without_its_content(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The skipped event is one WARNING on ``agentfn_asgi.stream`` naming the session and
    why, never the event's text (it quotes model-written arguments)."""
    tools, _ = counting_tools()
    async for conn in stack(tools):
        session_id = conn.fake.create_session(DEEP_SECOND_STEP)
        with caplog.at_level("WARNING", logger="agentfn_asgi.stream"):
            async with asyncio.timeout(20):
                await conn.app.follow(session_id, backoff=FAST_BACKOFF)
    skipped = [r for r in caplog.records if r.name == "agentfn_asgi.stream"]
    assert skipped, "the unreadable event was not logged"
    message = skipped[0].getMessage()
    assert session_id in message and "nested too deeply" in message
    assert "[[[" not in message


async def test_repeated_events_are_dropped_by_event_id() -> None:
    """With every streamed event sent twice, each is handled once: the follower reads the
    session once per distinct ``requires_action`` (plus once after subscribing)."""
    async with FakeAgentsAPI(api_key=API_KEY, webhook_secret=SECRET) as fake:
        fake.duplicate_stream_events()
        session_id = fake.create_session(TWO_STEPS)
        reads: list[AgentSession] = []

        async def answer(session: AgentSession) -> None:
            reads.append(session)
            for call in session.function_calls:
                await client.submit_events(
                    session.id,
                    [
                        {
                            "type": "agent.session.input.tool_result",
                            "turn_id": call.turn_id,
                            "call_id": call.call_id,
                            "success": True,
                            "output": "ok",
                        }
                    ],
                )

        async with (
            serve_fake(fake) as base_url,
            AgentsClient(api_key=API_KEY, base_url=base_url) as client,
        ):
            async with asyncio.timeout(20):
                end = await follow_session(client, session_id, answer, backoff=FAST_BACKOFF)
        assert end.status == "idle"
        # Every event came twice; the follow returned on ``idle`` before its repeat.
        assert end.duplicates == end.events - 1 > 0
        assert len(reads) == 2  # after subscribing (step 1), then step 2's requires_action
        assert len(fake.submissions) == 3
        assert fake.duplicate_submissions == []


async def test_follow_reports_a_cancelled_turn() -> None:
    """A turn cancelled while its call runs ends the follow as ``cancelled``; the late
    result is not owed any more, so nothing is submitted."""
    tools = FunctionTools()
    started = asyncio.Event()
    release = asyncio.Event()

    @tools.function
    async def slow(key: str) -> str:
        """Wait for the test."""
        started.set()
        await release.wait()
        return key

    async for conn in stack(tools):
        session_id = conn.fake.create_session([[FakeCall("slow", {"key": "x"})]])
        follow = asyncio.create_task(conn.app.follow(session_id, backoff=FAST_BACKOFF))
        async with asyncio.timeout(20):
            await started.wait()
            conn.fake.cancel_turn(session_id)
            release.set()
            summary = await follow
        assert summary.status == "cancelled"
        assert (summary.calls_owed, summary.results_submitted) == (1, 0)
        assert conn.fake.submissions == []


async def test_follow_stops_the_handler_of_a_cancelled_turn() -> None:
    """Stream mode hears the turn end: the follow stops the handler still running for it
    (before, it waited for the handler, however long) and reports the call cancelled."""
    tools = FunctionTools()
    started = asyncio.Event()
    stopped = asyncio.Event()

    @tools.function
    async def slow(key: str) -> str:
        """Wait a long time."""
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            stopped.set()
            raise
        return key

    async for conn in stack(tools):
        session_id = conn.fake.create_session([[FakeCall("slow", {"key": "x"}, "c")]])
        follow = asyncio.create_task(conn.app.follow(session_id, backoff=FAST_BACKOFF))
        async with asyncio.timeout(20):
            await started.wait()
            conn.fake.cancel_turn(session_id)
            summary = await follow
        assert stopped.is_set() and summary.status == "cancelled"
        (record,) = await conn.store.calls_for_session(session_id)
        assert record.state is CallState.CANCELLED
        assert conn.fake.submissions == []


async def test_follow_ends_when_the_session_is_deleted() -> None:
    """A session that disappears (404) ends the follow as ``deleted``. Its call is another
    service's (ignored), so the follow is still listening when the session goes."""
    tools, _ = counting_tools()
    ignoring = replace(FAST, unknown_tools="ignore")
    async with running_stack(tools, webhooks=False, loopback=True, settings=ignoring) as conn:
        session_id = conn.fake.create_session([[FakeCall("other_tool")]])
        follow = asyncio.create_task(conn.app.follow(session_id, backoff=FAST_BACKOFF))
        async with asyncio.timeout(20):
            while not conn.fake.sessions[session_id].listeners:
                await asyncio.sleep(0.01)
            conn.fake.delete_session(session_id)
            summary = await follow
        assert summary.status == "deleted"


async def test_an_idle_session_returns_at_once() -> None:
    """Following a session with nothing to do returns ``idle`` without recording anything."""
    tools, runs = counting_tools()
    async for conn in stack(tools):
        session_id = conn.fake.create_session([])
        summary = await conn.app.follow(session_id)
        assert (summary.status, summary.calls_owed, summary.deliveries) == ("idle", 0, 0)
        assert not runs


async def test_a_wrong_key_is_raised_not_retried() -> None:
    """401 cannot heal by reconnecting: ``follow_session`` raises it."""
    async with FakeAgentsAPI(api_key=API_KEY, webhook_secret=SECRET) as fake:
        session_id = fake.create_session([[FakeCall("lookup")]])

        async def never(_: AgentSession) -> None:
            raise AssertionError("no action without a session read")

        async with (
            serve_fake(fake) as base_url,
            AgentsClient(api_key="sk-wrong", base_url=base_url, max_retries=0) as client,
        ):
            with pytest.raises(AuthenticationError):
                await follow_session(client, session_id, never)


async def test_the_fake_lists_sessions_newest_first_with_pages() -> None:
    """``GET /agents/sessions`` (list) pages newest first by default, ``after`` continues."""
    async with FakeAgentsAPI(api_key=API_KEY, webhook_secret=SECRET) as fake:
        ids = [fake.create_session([]) for _ in range(3)]
        busy = fake.create_session([[FakeCall("lookup")]])
        async with (
            serve_fake(fake) as base_url,
            AgentsClient(api_key=API_KEY, base_url=base_url) as client,
        ):
            first = await client.list_sessions(limit=2)
            assert [s.id for s in first.data] == [busy, ids[2]]
            assert first.has_more
            assert first.data[0].status == "requires_action"
            rest = await client.list_sessions(limit=2, after=first.data[-1].id)
            assert [s.id for s in rest.data] == [ids[1], ids[0]]
            assert not rest.has_more
            oldest = await client.list_sessions(limit=1, order="asc")
            assert [s.id for s in oldest.data] == [ids[0]]


def test_the_delivery_id_names_what_is_pending() -> None:
    """Two reads of the same pending calls name one delivery; other calls another."""

    def session(*calls: tuple[str, str]) -> AgentSession:
        return AgentSession.model_validate(
            {
                "id": "sess_1",
                "status": "requires_action",
                "required_actions": [
                    {
                        "type": "function_call",
                        "turn_id": t,
                        "call_id": c,
                        "name": "f",
                        "arguments": {},
                    }
                    for t, c in calls
                ],
            }
        )

    one = stream_delivery_id(session(("t1", "c1"), ("t1", "c2")))
    assert one == stream_delivery_id(session(("t1", "c2"), ("t1", "c1")))
    assert one != stream_delivery_id(session(("t1", "c3")))
    assert one.startswith("wh_") and len(one) == 35
