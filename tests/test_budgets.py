"""Session budgets (openai 3.63): ``spend_control`` and the status ``budget_reached`` on the
wire, the fake pausing a session on its budget, and stream mode ending on
``agent.session.budget_reached`` as the openai SDK's helper does (once the root turn seen
ended, or at once when none was seen) instead of waiting for the server to close the
stream; a turn's error code as a human reason."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from agentfn_asgi import FunctionTools
from agentfn_asgi.admin import AdminApp
from agentfn_asgi.backoff import Backoff
from agentfn_asgi.cli.calls import format_call
from agentfn_asgi.cli.ops import format_overview
from agentfn_asgi.client import AgentsClient
from agentfn_asgi.operator import PausedSession
from agentfn_asgi.session_events import SessionBudgetReachedEvent, parse_session_event
from agentfn_asgi.stream import follow_session
from agentfn_asgi.testing import Connection, FakeAgentsAPI, FakeCall, serve_fake
from agentfn_asgi.wire import AgentSession, SpendControl, parse_session, turn_error_reason
from tests.admin.conftest import TOKEN, admin_url, host_app
from tests.support.stack import API_KEY, SECRET, running_stack

pytestmark = pytest.mark.anyio

FAST_BACKOFF = Backoff(base=0.01, cap=0.05)


def test_spend_control_and_the_budget_reached_status_parse() -> None:
    """A paused session: status ``budget_reached``, ``spend_control`` read; a missing or
    unlimited one reads as never reached."""
    session = parse_session(
        b'{"id": "sess_1", "status": "budget_reached",'
        b' "spend_control": {"limit": 500, "consumed": 512}}'
    )
    assert session.budget_reached
    assert session.spend_control == SpendControl(limit=500, consumed=512)
    assert session.spend_control is not None and session.spend_control.reached
    assert not SpendControl(limit=None, consumed=900).reached
    assert not SpendControl(limit=500, consumed=None).reached
    older = parse_session(b'{"id": "sess_2", "status": "idle"}')
    assert older.spend_control is None and not older.budget_reached


def test_the_budget_reached_event_parses_with_its_snapshot() -> None:
    event = parse_session_event(
        {
            "type": "agent.session.budget_reached",
            "event_id": "ev_1",
            "session": {"id": "sess_1", "status": "budget_reached"},
        }
    )
    assert isinstance(event, SessionBudgetReachedEvent)
    assert event.session.budget_reached


def test_a_turn_error_code_reads_as_a_reason() -> None:
    """A known code named and in words; an unknown one named (printable, bounded); none:
    the turn failed."""
    assert turn_error_reason("session_budget_exceeded") == (
        "the turn failed (session_budget_exceeded: the session reached its spending limit)"
    )
    assert turn_error_reason("project_spend_limit_exceeded").endswith(
        ": the project reached its spending limit)"
    )
    assert turn_error_reason("new_code") == "the turn failed (new_code)"
    assert turn_error_reason("x\x00y" + "z" * 100) == "the turn failed (xy" + "z" * 61 + ")"
    assert turn_error_reason(None) == turn_error_reason("") == "the turn failed"


async def test_the_fake_pauses_a_session_on_its_budget_without_a_webhook() -> None:
    """Status ``budget_reached``, ``spend_control`` consumed at least the limit, the stream
    event recorded, no webhook (the API has none for it); a pending call stays pending and
    takes its result, but no next step opens while paused."""
    tools = FunctionTools()
    release = asyncio.Event()

    @tools.function
    async def lookup(key: str) -> str:
        """Wait for the test."""
        await release.wait()
        return key

    async with running_stack(tools) as conn:
        session_id = conn.fake.create_session(
            [[FakeCall("lookup", {"key": "a"})], [FakeCall("lookup", {"key": "b"})]]
        )
        await conn.fake.drain_webhooks()
        sent = len(conn.fake.deliveries)
        with pytest.raises(ValueError, match="consumed"):
            conn.fake.pause_on_budget(session_id, limit=100, consumed=99)
        conn.fake.pause_on_budget(session_id, limit=100)
        snapshot = conn.fake.session(session_id)
        assert snapshot["status"] == "budget_reached"
        assert snapshot["spend_control"] == {"limit": 100, "consumed": 100}
        assert conn.fake.events(session_id)[-1]["type"] == "agent.session.budget_reached"
        release.set()
        async with asyncio.timeout(10):
            await conn.fake.wait_for_submissions(1)
        await conn.fake.drain_webhooks()
        assert conn.fake.session(session_id)["status"] == "budget_reached"
        assert conn.fake.required_actions(session_id) == []
        assert [d.event_type for d in conn.fake.deliveries[sent:]] == []


async def stack(tools: FunctionTools) -> AsyncIterator[Connection]:
    # No webhook: only the stream drives the app.
    async with running_stack(tools, webhooks=False, loopback=True) as conn:
        yield conn


async def test_follow_ends_when_the_session_is_paused_on_its_budget() -> None:
    """Paused while its call runs: the follow ends as ``budget_reached`` (before, it waited
    for the server to close the stream: here, for ever), once the call it owes settled."""
    tools = FunctionTools()
    started, release = asyncio.Event(), asyncio.Event()

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
            conn.fake.pause_on_budget(session_id, limit=250, consumed=260)
            release.set()
            summary = await follow
        assert summary.status == "budget_reached"
        assert (summary.calls_owed, summary.results_submitted) == (1, 1)


async def test_follow_of_a_session_already_paused_answers_what_it_owes_and_ends() -> None:
    """The first read finds the session paused with a call still listed: the call is
    answered and the follow ends as ``budget_reached``."""
    tools = FunctionTools()

    @tools.function
    def lookup(key: str) -> str:
        """Look a key up."""
        return key

    async for conn in stack(tools):
        session_id = conn.fake.create_session([[FakeCall("lookup", {"key": "x"})]])
        conn.fake.pause_on_budget(session_id)
        async with asyncio.timeout(20):
            summary = await conn.app.follow(session_id, backoff=FAST_BACKOFF)
        assert summary.status == "budget_reached"
        assert summary.results_submitted == 1


@pytest.mark.parametrize("turn_end", [None, "agent.session.turn.completed"])
async def test_budget_reached_waits_for_the_root_turn_seen_to_end(turn_end: str | None) -> None:
    """As the SDK's helper: once the follower saw the root turn start, ``budget_reached``
    ends the follow only if that turn ended; otherwise it goes on (here until the turn is
    cancelled: ``cancelled``)."""
    async with FakeAgentsAPI(api_key=API_KEY, webhook_secret=SECRET) as fake:
        session_id = fake.create_session([[FakeCall("lookup", {"key": "a"})]])
        session = fake.sessions[session_id]
        reads: list[AgentSession] = []

        async def answer(found: AgentSession) -> None:
            reads.append(found)  # answers nothing: the turn stays open

        async with (
            serve_fake(fake) as base_url,
            AgentsClient(api_key=API_KEY, base_url=base_url) as client,
        ):
            follow = asyncio.create_task(
                follow_session(client, session_id, answer, backoff=FAST_BACKOFF)
            )
            async with asyncio.timeout(20):
                while not reads:
                    await asyncio.sleep(0.01)
                assert session.current is not None
                # The follower sees the root turn start (as if it began while followed).
                session._emit_turn("agent.session.turn.created", session.current)
                if turn_end is not None:
                    session._emit_turn(turn_end, session.current)
                fake.pause_on_budget(session_id)
                if turn_end is None:
                    while len(reads) < 2:  # budget_reached made it read the session
                        await asyncio.sleep(0.01)
                    await asyncio.sleep(0.1)
                    assert not follow.done()
                    fake.cancel_turn(session_id)
                end = await follow
        assert end.status == ("cancelled" if turn_end is None else "budget_reached")


async def test_status_and_the_page_list_sessions_paused_on_their_budget() -> None:
    """The overview reads the project's newest sessions: the paused one is listed with its
    limit and consumption, in ``status`` and on the page; without the API it is unknown.
    ``calls show`` and the page say a counted call's place in its session's budget."""
    tools = FunctionTools()

    @tools.function(max_calls_per_session=2)
    def lookup(key: str) -> str:
        """Look a key up."""
        return key

    async with running_stack(tools) as conn:
        session_id = conn.fake.create_session([[FakeCall("lookup", {"key": "a"}, call_id="a")]])
        other = conn.fake.create_session([[FakeCall("lookup", {"key": "b"})]])
        async with asyncio.timeout(10):
            await conn.fake.wait_for_submissions(2)
        conn.fake.pause_on_budget(session_id, limit=500, consumed=512)
        view = conn.app.operator()
        overview = await view.overview()
        assert overview.paused_on_budget == (
            PausedSession(session_id=session_id, limit=500, consumed=512),
        )
        assert other not in str(overview.paused_on_budget)
        report = format_overview(overview)
        assert "1 sessions on their spending limit" in report
        assert f"  {session_id}  consumed 512 of 500" in report
        detail = await view.call("a", session_id=session_id)
        assert detail.summary.counted == 1
        assert "budget    call 1 counted against its session's budget" in format_call(
            detail, now=time.time()
        )
        assert [e.detail for e in detail.history if e.kind == "counted"] == ["1 of 2"]
        admin = AdminApp(view, tokens=[TOKEN])
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=host_app(admin)), base_url="http://testserver"
        ) as http:
            bearer = {"authorization": f"Bearer {TOKEN}"}
            page = (await http.get(admin_url("/"), headers=bearer)).text
            shown = (
                await http.get(admin_url(f"/call?id=a&session={session_id}"), headers=bearer)
            ).text
        assert "Sessions paused on their spending limit" in page
        assert session_id in page.split("paused on their spending limit")[1]
        assert "<dt>Budget</dt><dd>call 1 of the session" in shown
        # The page refreshes itself: one scan of the API serves every view for a while.
        assert [r.route for r in conn.fake.requests].count("list") == 1
    unknown = format_overview(dataclasses.replace(overview, paused_on_budget=None))
    assert "unknown: sessions paused on their spending limit" in unknown


async def test_stream_mode_ends_on_budget_reached_as_it_does_on_idle(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two follows over real loopback HTTP: one ends on ``idle`` after its call's result,
    the other on ``budget_reached`` while its call runs. Both end on the event itself, not
    on the server closing the stream (the fake never does); the seconds from the event to
    the follow's end are printed side by side."""
    tools = FunctionTools()
    started, release = asyncio.Event(), asyncio.Event()

    @tools.function
    async def slow(key: str) -> str:
        """Wait for the test."""
        started.set()
        await release.wait()
        return key

    ended: dict[str, float] = {}
    async for conn in stack(tools):
        for how in ("idle", "budget_reached"):
            started.clear()
            release.clear()
            session_id = conn.fake.create_session([[FakeCall("slow", {"key": how})]])
            follow = asyncio.create_task(conn.app.follow(session_id, backoff=FAST_BACKOFF))
            async with asyncio.timeout(20):
                await started.wait()
                at = asyncio.get_running_loop().time()
                if how == "budget_reached":
                    conn.fake.pause_on_budget(session_id)
                release.set()
                summary = await follow
            ended[how] = asyncio.get_running_loop().time() - at
            assert summary.status == how and summary.results_submitted == 1
    with capsys.disabled():
        print(
            f"\n[budgets/stream] follow ended {ended['budget_reached']:.3f} s after "
            f"budget_reached, {ended['idle']:.3f} s after the result that made it idle"
        )
