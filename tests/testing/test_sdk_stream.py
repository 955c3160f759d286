"""The official SDK's session helper against the fake (issue 34): ``client.beta.agents
.sessions.stream(session_id, input=..., tool_handlers=...)`` subscribes to an idle session,
sends its message, runs the handler on the call the turn asks for, submits its result and
ends with the turn's idle, over real HTTP on loopback."""

from __future__ import annotations

from typing import Any

import pytest

from agentfn_asgi.testing import FakeAgentsAPI, FakeCall, serve_fake

pytestmark = pytest.mark.anyio


async def test_the_sdk_stream_helper_runs_a_handler_against_the_fake() -> None:
    openai = pytest.importorskip("openai")
    ran: list[dict[str, Any]] = []

    async def get_weather(arguments: dict[str, Any]) -> str:
        ran.append(arguments)
        return f"sunny in {arguments['city']}"

    fake = FakeAgentsAPI(api_key="sk-test")
    async with fake, serve_fake(fake) as base_url:
        sid = fake.create_session([])
        fake.queue_turn(sid, [[FakeCall("get_weather", {"city": "Paris"}, call_id="call_w")]])
        client = openai.AsyncOpenAI(api_key="sk-test", base_url=base_url)
        try:
            async with client.beta.agents.sessions.stream(
                sid,
                input="What is the weather in Paris?",
                tool_handlers={"get_weather": get_weather},
            ) as stream:
                types = [event.type async for event in stream]
        finally:
            await client.close()
        state = fake.session(sid)
    assert ran == [{"city": "Paris"}]
    [submission] = fake.submissions
    assert submission.call_id == "call_w" and submission.success
    assert "sunny in Paris" in str(submission.output)
    assert types[-1] == "agent.session.idle" and state["status"] == "idle"
