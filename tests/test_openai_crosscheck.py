"""Cross-checks against the official ``openai`` package (a dev dependency, the wire oracle).

The official async client, pointed at ``FakeAgentsAPI``, must read the same sessions and
get the same statuses as ``AgentsClient``; the fake's session JSON must validate against
openai's strict models; openai's ``webhooks.unwrap`` must accept the fake's deliveries; and
openai's own race detector must recognise the fake's race answer. ``openai`` talks through
``httpx2``, so the in-process transport comes from there.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import httpx2
import openai
import openai.lib.beta.agents  # imported before lib.streaming to dodge an import cycle
import pytest
from openai.lib.streaming.agents._tools import is_pending_call_race
from openai.types.beta.agent_session import AgentSession as OpenAIAgentSession
from openai.types.webhooks import AgentSessionActionRequiredWebhookEvent
from starlette.types import Receive, Scope, Send

from agentfn_asgi import errors
from agentfn_asgi.client import AgentsClient
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall

pytestmark = pytest.mark.anyio

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
OTHER_SECRET = "whsec_dGhlLW90aGVyLXNlY3JldC1rZXktMTIzNDU2Nzg="


@pytest.fixture
async def fake() -> AsyncIterator[FakeAgentsAPI]:
    async with FakeAgentsAPI() as api:
        yield api


@pytest.fixture
async def official(fake: FakeAgentsAPI) -> AsyncIterator[openai.AsyncOpenAI]:
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=fake))
    client = openai.AsyncOpenAI(
        api_key="sk-test", base_url="http://fake/v1", http_client=http, max_retries=0
    )
    yield client
    await client.close()


@pytest.fixture
async def ours(fake: FakeAgentsAPI) -> AsyncIterator[AgentsClient]:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=fake))
    async with AgentsClient(
        api_key="sk-test", base_url="http://fake/v1", http_client=http, max_retries=0
    ) as client:
        yield client
    await http.aclose()


async def test_official_client_reads_the_same_session(
    fake: FakeAgentsAPI, official: openai.AsyncOpenAI, ours: AgentsClient
) -> None:
    """Both clients see the same status and required actions of a fake session."""
    sid = fake.create_session([[FakeCall("lookup", {"id": "42"}), FakeCall("other")]])
    theirs = await official.beta.agents.sessions.retrieve(sid)
    mine = await ours.retrieve_session(sid)
    assert theirs.status == mine.status == "requires_action"
    their_actions = [
        (a.type, a.turn_id, a.call_id, a.name, a.arguments)
        for a in theirs.required_actions
        if a.type == "function_call"
    ]
    my_actions = [(a.type, a.turn_id, a.call_id, a.name, a.arguments) for a in mine.function_calls]
    assert their_actions == my_actions
    assert len(my_actions) == 2


async def test_fake_session_validates_against_openai_models(fake: FakeAgentsAPI) -> None:
    """The fake's session JSON passes openai's strict (validating) AgentSession model."""
    sid = fake.create_session([[FakeCall("lookup", {"id": "42"})]], metadata={"a": "b"})
    session = OpenAIAgentSession.model_validate(fake.session(sid))
    assert session.required_actions[0].type == "function_call"
    fake.cancel_turn(sid)
    assert OpenAIAgentSession.model_validate(fake.session(sid)).status == "idle"


async def test_official_client_submits_a_tool_result(
    fake: FakeAgentsAPI, official: openai.AsyncOpenAI, ours: AgentsClient
) -> None:
    """openai's events.create is accepted (202) and moves the session like ours does."""
    sid = fake.create_session([[FakeCall("a")], [FakeCall("b")]])
    first = fake.required_actions(sid)[0]
    await official.beta.agents.sessions.events.create(
        sid,
        events=[
            {
                "type": "agent.session.input.tool_result",
                "turn_id": first["turn_id"],
                "call_id": first["call_id"],
                "success": True,
                "output": [{"type": "input_text", "text": "done"}],
            }
        ],
        idempotency_key="their-key",
    )
    assert fake.requests[-1].status == 202
    assert fake.submissions[0].idempotency_key == "their-key"
    second = (await ours.retrieve_session(sid)).function_calls[0]
    await ours.submit_events(
        sid,
        [
            {
                "type": "agent.session.input.tool_result",
                "turn_id": second.turn_id,
                "call_id": second.call_id,
                "success": False,
                "error": "Tool handler failed.",
            }
        ],
    )
    assert fake.requests[-1].status == 202
    assert (await official.beta.agents.sessions.retrieve(sid)).status == "idle"


@pytest.mark.parametrize(
    ("case", "status", "ours_cls", "theirs_cls"),
    [
        ("missing", 404, errors.NotFoundError, openai.NotFoundError),
        ("race", 400, errors.UnknownPendingToolCallError, openai.BadRequestError),
        ("invalid", 400, errors.BadRequestError, openai.BadRequestError),
        ("conflict", 409, errors.ConflictError, openai.ConflictError),
        ("overloaded", 503, errors.InternalServerError, openai.InternalServerError),
    ],
)
async def test_both_clients_see_the_same_failures(
    fake: FakeAgentsAPI,
    official: openai.AsyncOpenAI,
    ours: AgentsClient,
    case: str,
    status: int,
    ours_cls: type[errors.APIStatusError],
    theirs_cls: type[openai.APIStatusError],
) -> None:
    """Statuses, codes and messages of the fake's errors read the same through both clients."""
    sid = fake.create_session([[FakeCall("a")]])
    action = fake.required_actions(sid)[0]
    event: dict[str, Any] = {
        "type": "agent.session.input.tool_result",
        "turn_id": action["turn_id"],
        "call_id": action["call_id"],
        "success": True,
        "output": "x",
    }
    target = sid
    if case == "missing":
        target = "sess_missing"
    elif case == "race":
        event["call_id"] = "call_ghost"
    elif case == "invalid":
        event["success"] = "yes"
    elif case == "conflict":
        fake.sessions[sid].submit([event], None)
        event = {**event, "output": "different"}

    async def theirs() -> None:
        if case == "overloaded":
            fake.fail_next("submit", 1, 503)
        await official.beta.agents.sessions.events.create(target, events=[event])  # type: ignore[list-item]

    # No retries on either side, so each sees the first answer as it is.
    fast = AgentsClient(
        api_key="sk-test",
        base_url="http://fake/v1",
        http_client=ours._http,
        max_retries=0,
        race_delays=(),
    )

    with pytest.raises(theirs_cls) as their_error:
        await theirs()
    if case == "overloaded":
        fake.fail_next("submit", 1, 503)
    with pytest.raises(ours_cls) as my_error:
        await fast.submit_events(target, [event])
    assert their_error.value.status_code == my_error.value.status == status
    body = their_error.value.body
    assert isinstance(body, dict)
    assert body.get("code") == my_error.value.code
    assert body.get("message") == my_error.value.message
    if case == "race":
        assert is_pending_call_race(their_error.value, "call_ghost")  # type: ignore[arg-type]


async def test_official_stream_reads_the_fake(
    fake: FakeAgentsAPI, official: openai.AsyncOpenAI
) -> None:
    """openai's SSE reader parses the fake's stream (event lines, obfuscation, [DONE])."""
    sid = fake.create_session([[FakeCall("a")]])
    action = fake.required_actions(sid)[0]

    async def read() -> list[str]:
        stream = await official.beta.agents.sessions.events.stream(sid)
        return [event.type async for event in stream]

    reader = asyncio.create_task(read())
    while not fake.sessions[sid].listeners:
        await asyncio.sleep(0.001)
    fake.sessions[sid].submit(
        [
            {
                "type": "agent.session.input.tool_result",
                "turn_id": action["turn_id"],
                "call_id": action["call_id"],
                "success": True,
                "output": "ok",
            }
        ],
        None,
    )
    types = await reader
    assert types[-1] == "agent.session.idle"
    assert "agent.session.turn.completed" in types


class Capture:
    """A tiny ASGI webhook receiver that keeps raw bodies and headers."""

    def __init__(self) -> None:
        self.deliveries: list[tuple[bytes, dict[str, str]]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.deliveries.append((body, {k.decode(): v.decode() for k, v in scope["headers"]}))
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def test_openai_unwrap_accepts_fake_deliveries() -> None:
    """``webhooks.unwrap`` verifies and parses every delivery, under each rotated secret."""
    capture = Capture()
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=capture))
    async with FakeAgentsAPI(
        webhook_secret=[SECRET, OTHER_SECRET], webhook_url="http://hook/", webhook_client=client
    ) as api:
        sid = api.create_session([[FakeCall("a")]])
        api.cancel_turn(sid)
        await api.drain_webhooks()
    await client.aclose()
    assert len(capture.deliveries) == 4
    for secret in (SECRET, OTHER_SECRET):
        official = openai.OpenAI(api_key="unused", webhook_secret=secret)
        types = [
            official.webhooks.unwrap(body, headers).type for body, headers in capture.deliveries
        ]
        assert types == [
            "agent.session.created",
            "agent.session.in_progress",
            "agent.session.action_required",
            "agent.session.idle",
        ]
    body, _ = capture.deliveries[2]
    event = AgentSessionActionRequiredWebhookEvent.model_validate(json.loads(body))
    assert event.data.id == sid
    assert event.data.required_action.type == "function_call"
    with pytest.raises(openai.InvalidWebhookSignatureError):
        openai.OpenAI(api_key="unused", webhook_secret="whsec_" + "A" * 32).webhooks.unwrap(
            body, capture.deliveries[2][1]
        )
