"""Webhook endpoints: ``AgentsClient``'s methods against FakeAgentsAPI, with the official
``openai`` SDK as the oracle (the requests both clients send, the fake's answers validated
by the SDK's models, the test deliveries verified by the SDK's ``verify_signature``).

The SDK talks through ``httpx2``; requests go in-process to the fake through a recorder
that keeps each request's method, path, query and JSON body.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

import httpx
import httpx2
import openai
import pytest
from openai.types.webhooks import (
    DeletedWebhookEndpoint,
    WebhookEndpoint,
    WebhookEndpointList,
    WebhookEndpointTestResult,
    WebhookEndpointWithSecret,
    WebhookEventTypeList,
)
from pydantic import BaseModel
from starlette.types import Message, Receive, Scope, Send

from agentfn_asgi import wire
from agentfn_asgi.client import AgentsClient
from agentfn_asgi.errors import BadRequestError, NotFoundError, WebhookSignatureError
from agentfn_asgi.signing import WebhookVerifier
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall
from agentfn_asgi.testing.fake_endpoints import KEEP_OLD_SECRET_SECONDS

from ..support.clock import FakeClock
from ..support.ports import free_port

pytestmark = pytest.mark.anyio

RECEIVER = "http://receiver.test/hooks"


class Recorder:
    """An ASGI wrapper keeping ``(method, path, query, json body, headers)`` of each request."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[tuple[str, str, str, Any, dict[str, str]]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = b"".join(chunks)
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        self.seen.append(
            (
                scope["method"],
                scope["path"],
                scope["query_string"].decode(),
                json.loads(body) if body else None,
                headers,
            )
        )
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


class Receiver:
    """A webhook endpoint answering ``status``, keeping each delivery's headers and body."""

    def __init__(self) -> None:
        self.status = 200
        self.received: list[tuple[dict[str, str], bytes]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.received.append(({k.decode(): v.decode() for k, v in scope["headers"]}, body))
        await send({"type": "http.response.start", "status": self.status, "headers": []})
        await send({"type": "http.response.body", "body": b""})


@pytest.fixture
def receiver() -> Receiver:
    return Receiver()


@pytest.fixture
def clock() -> FakeClock:
    """The fake's clock, moved by hand (it starts at the real time: the SDK checks it)."""
    return FakeClock(time.time())


@pytest.fixture
async def fake(receiver: Receiver, clock: FakeClock) -> AsyncIterator[FakeAgentsAPI]:
    hooks = httpx.AsyncClient(transport=httpx.ASGITransport(app=receiver))
    async with FakeAgentsAPI(webhook_client=hooks, clock=clock) as api:
        yield api
    await hooks.aclose()


@pytest.fixture
def recorder(fake: FakeAgentsAPI) -> Recorder:
    return Recorder(fake)


@pytest.fixture
async def official(recorder: Recorder) -> AsyncIterator[openai.AsyncOpenAI]:
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=recorder))
    client = openai.AsyncOpenAI(
        api_key="sk-test", base_url="http://fake/v1", http_client=http, max_retries=0
    )
    yield client
    await client.close()


@pytest.fixture
async def ours(recorder: Recorder) -> AsyncIterator[AgentsClient]:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=recorder))
    async with AgentsClient(
        api_key="sk-test", base_url="http://fake/v1", http_client=http, max_retries=0
    ) as client:
        yield client
    await http.aclose()


def _strict(model: type[BaseModel], document: dict[str, Any]) -> BaseModel:
    """Validate with the SDK's model (its client only constructs, without validating)."""
    return model.model_validate(document)


def _last(recorder: Recorder) -> tuple[str, str, dict[str, list[str]], Any]:
    method, path, query, body, _ = recorder.seen[-1]
    return method, path, parse_qs(query), body


async def test_both_clients_send_the_same_requests(
    official: openai.AsyncOpenAI, ours: AgentsClient, recorder: Recorder
) -> None:
    """Every management call of ``AgentsClient`` sends what the SDK's ``client.webhooks``
    sends for the same arguments: method, path, query and JSON body; neither sends
    ``OpenAI-Beta`` (the management API takes none)."""
    created = await official.webhooks.create(
        url=RECEIVER, name="mine", event_types=["agent.session.action_required"]
    )
    theirs = _last(recorder)
    mine = await ours.create_webhook_endpoint(
        url=RECEIVER, name="mine", event_types=["agent.session.action_required"]
    )
    assert _last(recorder) == theirs
    assert (
        mine.signing_secret.startswith("whsec_") and created.signing_secret != mine.signing_secret
    )

    pairs: list[tuple[Callable[[], Awaitable[Any]], Callable[[], Awaitable[Any]]]] = [
        (
            lambda: official.webhooks.retrieve(mine.id),
            lambda: ours.retrieve_webhook_endpoint(mine.id),
        ),
        (lambda: official.webhooks.list(limit=5), lambda: ours.list_webhook_endpoints(limit=5)),
        (
            lambda: official.webhooks.list(limit=5, after=created.id),
            lambda: ours.list_webhook_endpoints(limit=5, after=created.id),
        ),
        (
            lambda: official.webhooks.update(mine.id, name="renamed"),
            lambda: ours.update_webhook_endpoint(mine.id, name="renamed"),
        ),
        (
            lambda: official.webhooks.update(
                mine.id, url=RECEIVER + "/2", event_types=["agent.session.idle"]
            ),
            lambda: ours.update_webhook_endpoint(
                mine.id, url=RECEIVER + "/2", event_types=["agent.session.idle"]
            ),
        ),
        (
            lambda: official.webhooks.rotate_secret(
                mine.id, keep_old_secret_active_for_24_hours=True
            ),
            lambda: ours.rotate_webhook_secret(mine.id, keep_old_secret_active_for_24_hours=True),
        ),
        (
            lambda: official.webhooks.rotate_secret(
                mine.id, keep_old_secret_active_for_24_hours=False
            ),
            lambda: ours.rotate_webhook_secret(mine.id),
        ),
        (
            lambda: official.webhooks.test(mine.id, event_type="agent.session.created"),
            lambda: ours.test_webhook_endpoint(mine.id, event_type="agent.session.created"),
        ),
        (lambda: official.webhooks.event_types.list(), lambda: ours.list_webhook_event_types()),
        (
            lambda: official.webhooks.delete(created.id),
            lambda: ours.delete_webhook_endpoint(mine.id),
        ),
    ]
    for sdk_call, our_call in pairs:
        await sdk_call()
        method, path, query, body = _last(recorder)
        await our_call()
        mine_sent = _last(recorder)
        if method == "DELETE":  # each deletes its own endpoint
            path = path.replace(created.id, mine.id)
        assert mine_sent == (method, path, query, body)
    for *_, headers in recorder.seen:
        assert "openai-beta" not in headers
        assert headers["authorization"] == "Bearer sk-test"


async def test_the_fakes_answers_validate_against_the_sdk_models(
    ours: AgentsClient, fake: FakeAgentsAPI, recorder: Recorder
) -> None:
    """Each answer of the fake is a valid SDK model, and ours parses it to the same
    values."""
    created = await ours.create_webhook_endpoint(
        url=RECEIVER, name="n", event_types=["agent.session.action_required"]
    )
    assert created.object == "webhook_endpoint"
    documents: list[tuple[type[BaseModel], BaseModel]] = [
        (WebhookEndpointWithSecret, created),
        (WebhookEndpoint, await ours.retrieve_webhook_endpoint(created.id)),
        (WebhookEndpointList, await ours.list_webhook_endpoints()),
        (WebhookEndpoint, await ours.update_webhook_endpoint(created.id, name="m")),
        (WebhookEndpointWithSecret, await ours.rotate_webhook_secret(created.id)),
        (
            WebhookEndpointTestResult,
            await ours.test_webhook_endpoint(created.id, event_type="batch.completed"),
        ),
        (WebhookEventTypeList, await ours.list_webhook_event_types()),
        (DeletedWebhookEndpoint, await ours.delete_webhook_endpoint(created.id)),
    ]
    for sdk_model, mine in documents:
        theirs = _strict(sdk_model, mine.model_dump())
        assert theirs.model_dump() == {
            k: v for k, v in mine.model_dump().items() if k in sdk_model.model_fields
        }
    event_types = await ours.list_webhook_event_types()
    assert set(event_types.data) == set(wire.WEBHOOK_EVENT_TYPES)
    assert "agent.session.action_required" in event_types.data


def test_our_models_keep_unknown_fields_and_hide_the_secret() -> None:
    """A field the API adds later is kept, not refused; the secret is not in the repr."""
    document = {
        "id": "we_1",
        "object": "webhook_endpoint",
        "created_at": 1,
        "event_types": ["agent.session.idle", "some.future.type"],
        "name": "n",
        "url": "https://x.test/h",
        "signing_secret": "whsec_c2VjcmV0",
        "disabled": False,
    }
    parsed = wire.WebhookEndpointWithSecret.model_validate(document)
    assert parsed.model_extra == {"disabled": False}
    assert "whsec_" not in repr(parsed)
    _strict(WebhookEndpointWithSecret, document)


async def test_a_test_delivery_is_signed_with_the_endpoints_secret(
    ours: AgentsClient, fake: FakeAgentsAPI, receiver: Receiver
) -> None:
    """``test`` posts one signed sample of the type asked for and answers the status the
    endpoint gave; the SDK's ``verify_signature`` accepts it with the endpoint's secret,
    and ``unwrap`` parses an agent sample as its typed event."""
    created = await ours.create_webhook_endpoint(
        url=RECEIVER, name="n", event_types=["agent.session.action_required"]
    )
    sdk = openai.OpenAI(api_key="x", webhook_secret=created.signing_secret)
    for event_type in ("agent.session.action_required", "agent.environment.ready"):
        result = await ours.test_webhook_endpoint(created.id, event_type=event_type)
        assert (result.status_code, result.event_type, result.webhook_endpoint_id) == (
            200,
            event_type,
            created.id,
        )
        headers, body = receiver.received[-1]
        event = sdk.webhooks.unwrap(body, headers)
        assert event.type == event_type
    receiver.status = 503
    result = await ours.test_webhook_endpoint(created.id, event_type="agent.session.idle")
    assert result.status_code == 503
    assert len(receiver.received) == 3  # once each: a test is never retried
    assert [d.status for d in fake.deliveries] == [200, 200, 503]


async def test_keep_old_rotation_signs_with_both_secrets_for_24_hours(
    ours: AgentsClient, fake: FakeAgentsAPI, receiver: Receiver, clock: FakeClock
) -> None:
    """After ``keep_old_secret_active_for_24_hours`` a delivery carries two ``v1,``
    signatures (new and old, space-separated): an app with either secret accepts it; after
    24 hours only the new one signs. A plain rotation drops the old one at once."""
    created = await ours.create_webhook_endpoint(
        url=RECEIVER, name="n", event_types=["agent.session.action_required"]
    )
    old = created.signing_secret
    rotated = await ours.rotate_webhook_secret(created.id, keep_old_secret_active_for_24_hours=True)
    new = rotated.signing_secret
    assert new != old and new.startswith("whsec_")

    async def signatures() -> list[str]:
        await ours.test_webhook_endpoint(created.id, event_type="agent.session.idle")
        headers, body = receiver.received[-1]
        WebhookVerifier(new, clock=clock).verify(body, headers)
        return headers["webhook-signature"].split(" ")

    both = await signatures()
    assert len(both) == 2 and all(s.startswith("v1,") for s in both)
    headers, body = receiver.received[-1]
    WebhookVerifier(old, clock=clock).verify(body, headers)
    WebhookVerifier(f"{new},{old}", clock=clock).verify(body, headers)

    clock.now += KEEP_OLD_SECRET_SECONDS + 1
    assert len(await signatures()) == 1
    headers, body = receiver.received[-1]
    with pytest.raises(WebhookSignatureError):
        WebhookVerifier(old, clock=clock).verify(body, headers)

    new = (await ours.rotate_webhook_secret(created.id)).signing_secret
    assert len(await signatures()) == 1


async def test_subscribed_endpoints_get_the_fakes_events_with_their_secret(
    ours: AgentsClient, fake: FakeAgentsAPI, receiver: Receiver, clock: FakeClock
) -> None:
    """An endpoint created through the API receives the events it subscribes to (only
    those), signed with its own secret; deleted, it receives nothing more."""
    created = await ours.create_webhook_endpoint(
        url=RECEIVER, name="n", event_types=["agent.session.action_required"]
    )
    session_id = fake.create_session([[FakeCall("lookup")]])
    await fake.drain_webhooks()
    assert [d.event_type for d in fake.deliveries] == ["agent.session.action_required"]
    headers, body = receiver.received[-1]
    delivery = WebhookVerifier(created.signing_secret, clock=clock).verify(body, headers)
    assert json.loads(body)["data"]["id"] == session_id
    assert delivery.msg_id == fake.deliveries[0].webhook_id

    await ours.delete_webhook_endpoint(created.id)
    fake.redeliver(session_id)
    await fake.drain_webhooks()
    assert len(receiver.received) == 1


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"name": "n", "url": RECEIVER}, "Missing required parameter: 'event_types'"),
        ({"name": "n", "url": "ftp://x", "event_types": ["batch.failed"]}, "Invalid url"),
        ({"name": "", "url": RECEIVER, "event_types": ["batch.failed"]}, "name must be"),
        ({"name": "n", "url": RECEIVER, "event_types": ["agent.nope"]}, "Invalid event type"),
        ({"name": "n", "url": RECEIVER, "event_types": []}, "non-empty array"),
    ],
)
async def test_bad_requests_are_400_with_the_parameter(
    fake: FakeAgentsAPI, body: dict[str, Any], message: str
) -> None:
    """A create the API would refuse is refused with a message and ``param``."""
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=fake), base_url="http://fake/v1"
    ) as http:
        answer = await http.post(
            "/webhook_endpoints", json=body, headers={"Authorization": "Bearer sk-test"}
        )
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert message in error["message"]
        assert error["param"] in ("event_types", "name", "url")
        unauthorised = await http.get("/webhook_endpoints")
        assert unauthorised.status_code == 401
    assert fake.endpoints.by_id == {}


async def test_unknown_endpoints_are_404_and_a_test_needs_a_known_type(
    ours: AgentsClient, receiver: Receiver
) -> None:
    """Every call on an unknown id is a 404; ``test`` of an unknown type is a 400; a bad
    id never reaches the URL."""
    for call in (
        ours.retrieve_webhook_endpoint("we_missing"),
        ours.update_webhook_endpoint("we_missing", name="x"),
        ours.delete_webhook_endpoint("we_missing"),
        ours.rotate_webhook_secret("we_missing"),
        ours.test_webhook_endpoint("we_missing", event_type="batch.failed"),
    ):
        with pytest.raises(NotFoundError):
            await call
    created = await ours.create_webhook_endpoint(
        url=RECEIVER, name="n", event_types=["batch.failed"]
    )
    with pytest.raises(BadRequestError, match="Invalid event_type"):
        await ours.test_webhook_endpoint(created.id, event_type="batch.nope")
    assert receiver.received == []
    with pytest.raises(ValueError, match="invalid webhook endpoint id"):
        await ours.retrieve_webhook_endpoint("../agents/sessions")


async def test_a_test_without_an_answer_is_a_400_naming_the_error() -> None:
    """A test delivery that gets no answer (nothing listens there) is refused with the
    cause, over the network as ``fake-api`` sends it."""
    dead = f"http://127.0.0.1:{free_port()}/hooks"
    async with FakeAgentsAPI() as fake:
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=fake))
        async with AgentsClient(
            api_key="sk-test", base_url="http://fake/v1", http_client=http, max_retries=0
        ) as client:
            created = await client.create_webhook_endpoint(
                url=dead, name="n", event_types=["batch.failed"]
            )
            with pytest.raises(BadRequestError, match="Could not deliver the test event") as no:
                await client.test_webhook_endpoint(created.id, event_type="batch.failed")
        await http.aclose()
    assert "ConnectError" in str(no.value)
    assert fake.deliveries[-1].status is None


async def test_listing_pages_with_after(ours: AgentsClient) -> None:
    """``limit`` and ``after`` page through the endpoints in creation order."""
    ids = [
        (
            await ours.create_webhook_endpoint(
                url=RECEIVER, name=f"n{i}", event_types=["batch.failed"]
            )
        ).id
        for i in range(3)
    ]
    first = await ours.list_webhook_endpoints(limit=2)
    assert [e.id for e in first.data] == ids[:2] and first.has_more
    assert first.last_id == ids[1]
    rest = await ours.list_webhook_endpoints(limit=2, after=first.last_id)
    assert [e.id for e in rest.data] == ids[2:] and not rest.has_more
