"""FakeAgentsAPI: sessions, validation, idempotency, webhooks, SSE, and every fault.

Requests go through ``httpx.ASGITransport`` (in-process) unless a test needs a socket;
webhooks go to a small recording ASGI receiver, also in-process.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from agentfn_asgi import testing
from agentfn_asgi.signing import WebhookVerifier
from agentfn_asgi.testing import (
    MAX_REQUEST_BYTES,
    FakeAgentsAPI,
    FakeCall,
    FakeConnectionDropped,
    action_required_event,
    serve_app,
    serve_fake,
    signed_delivery,
    webhook_backoff,
)
from agentfn_asgi.testing.control import DEV_WEBHOOK_RETRY_WINDOW
from agentfn_asgi.wire import parse_webhook_event

pytestmark = pytest.mark.anyio

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
OTHER_SECRET = "whsec_dGhlLW90aGVyLXNlY3JldC1rZXktMTIzNDU2Nzg="
HEADERS = {"Authorization": "Bearer sk-test", "OpenAI-Beta": "agents=v1"}


class Receiver:
    """An ASGI webhook endpoint that records deliveries and answers scripted statuses."""

    def __init__(self) -> None:
        self.received: list[tuple[dict[str, str], bytes]] = []
        self.statuses: list[int] = []  # answers for the next deliveries, then 200
        self.fail_each: tuple[int, int] = (0, 500)  # fail each webhook-id's first N tries

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.received.append(({k.decode(): v.decode() for k, v in scope["headers"]}, body))
        status = self.statuses.pop(0) if self.statuses else 200
        tries = sum(
            1 for h, _ in self.received if h["webhook-id"] == self.received[-1][0]["webhook-id"]
        )
        if tries <= self.fail_each[0]:
            status = self.fail_each[1]
        headers = [(b"location", b"/elsewhere")] if 300 <= status < 400 else []
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b""})

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.received]

    def types(self) -> list[str]:
        return [event["type"] for event in self.events()]


@pytest.fixture
def receiver() -> Receiver:
    return Receiver()


@pytest.fixture
async def fake(receiver: Receiver) -> AsyncIterator[FakeAgentsAPI]:
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=receiver))
    async with FakeAgentsAPI(
        webhook_secret=SECRET,
        webhook_url="http://receiver/hooks",
        webhook_client=client,
        webhook_retry_delays=(0.01, 0.01, 0.01),
    ) as api:
        yield api
    await client.aclose()


@pytest.fixture
async def http(fake: FakeAgentsAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=fake), base_url="http://fake/v1", headers=HEADERS
    ) as client:
        yield client


def result(action: dict[str, Any], **changes: Any) -> dict[str, Any]:
    event = {
        "type": "agent.session.input.tool_result",
        "turn_id": action["turn_id"],
        "call_id": action["call_id"],
        "success": True,
        "output": "ok",
    }
    event.update(changes)
    return event


async def submit(
    http: httpx.AsyncClient, sid: str, *events: dict[str, Any], key: str | None = None
) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key else {}
    return await http.post(
        f"/agents/sessions/{sid}/events", json={"events": list(events)}, headers=headers
    )


def test_all_is_complete() -> None:
    """The test kit's ``__all__`` names only things it exports."""
    for name in testing.__all__:
        assert hasattr(testing, name)


# -- sessions ---------------------------------------------------------------------------------


async def test_parallel_calls_then_a_second_step_then_idle(
    fake: FakeAgentsAPI, http: httpx.AsyncClient, receiver: Receiver
) -> None:
    """Parallel calls are pending together; the next step follows; then the session idles."""
    sid = fake.create_session(
        [[FakeCall("a", {"x": 1}), FakeCall("b", call_id="call_b")], [FakeCall("c")]],
        metadata={"user": "u1"},
    )
    body = (await http.get(f"/agents/sessions/{sid}")).json()
    assert body["status"] == "requires_action"
    assert body["metadata"] == {"user": "u1"}
    first = body["required_actions"]
    assert [(a["type"], a["name"], a["arguments"]) for a in first] == [
        ("function_call", "a", {"x": 1}),
        ("function_call", "b", {}),
    ]
    assert first[1]["call_id"] == "call_b"
    assert (await submit(http, sid, result(first[0]))).status_code == 202
    assert [a["name"] for a in fake.required_actions(sid)] == ["b"]
    assert fake.session(sid)["status"] == "requires_action"
    assert (await submit(http, sid, result(first[1]))).status_code == 202
    second = fake.required_actions(sid)
    assert [a["name"] for a in second] == ["c"]
    assert second[0]["turn_id"] == first[0]["turn_id"]
    await submit(http, sid, result(second[0], success=False, output=None, error="broken"))
    await fake.wait_idle(sid)
    assert fake.session(sid)["required_actions"] == []
    assert [s.call_id for s in fake.submissions] == [
        first[0]["call_id"],
        "call_b",
        second[0]["call_id"],
    ]
    assert fake.submissions[2].success is False
    assert fake.submissions[2].error == "broken"
    statuses = [e["type"] for e in fake.events(sid) if "session" in e]
    assert statuses == [
        "agent.session.created",
        "agent.session.in_progress",
        "agent.session.requires_action",
        "agent.session.in_progress",
        "agent.session.requires_action",
        "agent.session.in_progress",
        "agent.session.idle",
    ]
    await fake.drain_webhooks()
    assert receiver.types() == [
        "agent.session.created",
        "agent.session.in_progress",
        "agent.session.action_required",
        "agent.session.in_progress",
        "agent.session.action_required",
        "agent.session.in_progress",
        "agent.session.idle",
    ]
    assert receiver.events()[2]["data"] == {
        "id": sid,
        "required_action": {"type": "function_call"},
    }


async def test_empty_turn_goes_idle_at_once(fake: FakeAgentsAPI) -> None:
    """A session without calls completes its turn immediately."""
    sid = fake.create_session([])
    assert fake.session(sid)["status"] == "idle"
    await fake.wait_idle(sid, timeout=0.1)


async def test_session_snapshot_is_a_full_agent_session(fake: FakeAgentsAPI) -> None:
    """The GET body has the documented top-level fields and lists the tools seen."""
    sid = fake.create_session([[FakeCall("lookup")]], session_id="sess_fixed")
    assert sid == "sess_fixed"
    body = fake.session(sid)
    for name in (
        "id",
        "object",
        "status",
        "required_actions",
        "agent",
        "environment",
        "created_at",
        "last_active_at",
        "metadata",
        "error",
        "usage",
        "vault_ids",
    ):
        assert name in body
    assert [t["name"] for t in body["agent"]["tools"]] == ["lookup"]
    with pytest.raises(ValueError, match="exists"):
        fake.create_session([], session_id="sess_fixed")
    with pytest.raises(KeyError):
        fake.session("sess_nope")


async def test_a_bad_script_creates_nothing(fake: FakeAgentsAPI, receiver: Receiver) -> None:
    """A script that reuses a call id is refused before the session exists: no session,
    no ``agent.session.created`` webhook."""
    with pytest.raises(ValueError, match="call id c1 is already used"):
        fake.create_session([[FakeCall("a", call_id="c1")], [FakeCall("b", call_id="c1")]])
    await fake.drain_webhooks()
    assert fake.sessions == {}
    assert receiver.received == []


async def test_step_delay_shows_in_progress_between_steps(receiver: Receiver) -> None:
    """With ``step_delay`` the session is observably in_progress before the next step."""
    async with FakeAgentsAPI(step_delay=0.05) as api:
        sid = api.create_session([[FakeCall("a")], [FakeCall("b")]])
        action = api.required_actions(sid)[0]
        session = api.sessions[sid]
        session.submit([result(action)], None)
        assert api.session(sid)["status"] == "in_progress"
        await asyncio.sleep(0.1)
        assert [a["name"] for a in api.required_actions(sid)] == ["b"]


async def test_message_starts_queued_turn(fake: FakeAgentsAPI, http: httpx.AsyncClient) -> None:
    """A message on an idle session starts the next scripted turn (new turn id)."""
    sid = fake.create_session([])
    fake.queue_turn(sid, [[FakeCall("later")]])
    message = {
        "type": "agent.session.input.message",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "go"}]}],
    }
    assert (await submit(http, sid, message)).status_code == 202
    assert [a["name"] for a in fake.required_actions(sid)] == ["later"]
    with pytest.raises(ValueError, match="active turn"):
        fake.start_turn(sid, [])


# -- auth, routing, validation ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ({}, 401, "invalid_api_key"),
        ({"Authorization": "Bearer sk-wrong", "OpenAI-Beta": "agents=v1"}, 401, "invalid_api_key"),
        ({"Authorization": "Bearer sk-test"}, 400, "invalid_beta"),
        ({"Authorization": "Bearer sk-test", "OpenAI-Beta": "assistants=v2"}, 400, "invalid_beta"),
    ],
)
async def test_auth_and_beta_header(
    fake: FakeAgentsAPI, headers: dict[str, str], status: int, code: str
) -> None:
    """Missing/wrong bearer → 401; missing/wrong OpenAI-Beta → 400 invalid_beta."""
    sid = fake.create_session([[FakeCall("a")]])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=fake), base_url="http://fake/v1"
    ) as client:
        response = await client.get(f"/agents/sessions/{sid}", headers=headers)
        assert response.status_code == status
        assert response.json()["error"]["code"] == code
        ok = await client.get(
            f"/agents/sessions/{sid}",
            headers={**HEADERS, "OpenAI-Beta": "assistants=v2, agents=v1"},
        )
        assert ok.status_code == 200


async def test_unknown_session_route_and_delete(
    fake: FakeAgentsAPI, http: httpx.AsyncClient
) -> None:
    """Unknown sessions and URLs are 404; a deleted session is 404 afterwards."""
    assert (await http.get("/agents/sessions/sess_missing")).status_code == 404
    assert (await http.get("/agents/nothing")).status_code == 404
    sid = fake.create_session([[FakeCall("a")]])
    deleted = await http.delete(f"/agents/sessions/{sid}")
    assert deleted.json() == {"id": sid, "deleted": True, "object": "agent.session.deleted"}
    assert (await http.get(f"/agents/sessions/{sid}")).status_code == 404
    other = fake.create_session([[FakeCall("a")]])
    fake.delete_session(other)
    assert (await submit(http, other, {"type": "agent.session.input.cancel"})).status_code == 404
    assert [r.status for r in fake.requests][-1] == 404
    assert fake.requests[0].route == "retrieve"
    assert fake.requests[1].route == "unknown"


async def test_paths_without_v1_prefix_also_work(fake: FakeAgentsAPI) -> None:
    """The fake accepts base URLs with or without ``/v1``."""
    sid = fake.create_session([[FakeCall("a")]])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=fake), base_url="http://fake", headers=HEADERS
    ) as client:
        assert (await client.get(f"/agents/sessions/{sid}")).status_code == 200


def tool_result(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "type": "agent.session.input.tool_result",
        "turn_id": "turn_x",
        "call_id": "call_x",
        "success": True,
    }
    base.update(fields)
    return {k: v for k, v in base.items() if v is not DROP}


DROP = object()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"not json", None),
        (b"[]", None),
        (b"{}", "events"),
        (b'{"events": {}}', "events"),
        (b'{"events": []}', "events"),
        (json.dumps({"events": [1]}).encode(), "events[0]"),
        (json.dumps({"events": [{}]}).encode(), "events[0].type"),
        (json.dumps({"events": [{"type": "agent.session.input.nope"}]}).encode(), "events[0].type"),
        (json.dumps({"events": [tool_result(turn_id=DROP)]}).encode(), "events[0].turn_id"),
        (json.dumps({"events": [tool_result(turn_id=5)]}).encode(), "events[0].turn_id"),
        (json.dumps({"events": [tool_result(call_id=DROP)]}).encode(), "events[0].call_id"),
        (json.dumps({"events": [tool_result(success=DROP)]}).encode(), "events[0].success"),
        (json.dumps({"events": [tool_result(success=1)]}).encode(), "events[0].success"),
        (json.dumps({"events": [tool_result(success="true")]}).encode(), "events[0].success"),
        (json.dumps({"events": [tool_result(output=5)]}).encode(), "events[0].output"),
        (json.dumps({"events": [tool_result(output={"a": 1})]}).encode(), "events[0].output"),
        (json.dumps({"events": [tool_result(output=["x"])]}).encode(), "events[0].output[0]"),
        (
            json.dumps({"events": [tool_result(output=[{"type": "input_file"}])]}).encode(),
            "events[0].output[0].type",
        ),
        (
            json.dumps({"events": [tool_result(output=[{"type": "input_text"}])]}).encode(),
            "events[0].output[0].text",
        ),
        (
            json.dumps(
                {"events": [tool_result(output=[{"type": "input_image", "image_url": 3}])]}
            ).encode(),
            "events[0].output[0].image_url",
        ),
        (json.dumps({"events": [tool_result(error=False)]}).encode(), "events[0].error"),
        (
            json.dumps(
                {
                    "events": [
                        {"type": "agent.session.input.cancel"},
                        {"type": "agent.session.input.message"},
                    ]
                }
            ).encode(),
            "events[1].input",
        ),
    ],
)
async def test_submission_validation(
    fake: FakeAgentsAPI, http: httpx.AsyncClient, body: bytes, param: str | None
) -> None:
    """Each documented field rule answers 400 invalid_request_error naming the field."""
    sid = fake.create_session([[FakeCall("a")]])
    response = await http.post(f"/agents/sessions/{sid}/events", content=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert fake.submissions == []
    assert fake.session(sid)["status"] == "requires_action"


async def test_valid_output_shapes_are_accepted(
    fake: FakeAgentsAPI, http: httpx.AsyncClient
) -> None:
    """Output may be a string, content parts, or null; error may be null."""
    sid = fake.create_session([[FakeCall("a"), FakeCall("b"), FakeCall("c")]])
    a, b, c = fake.required_actions(sid)
    parts = [{"type": "input_text", "text": "t"}, {"type": "input_image", "image_url": "data:,"}]
    response = await submit(
        http,
        sid,
        result(a, output=parts),
        result(b, output=None, error=None),
        result(c, success=False, output=None, error="e"),
    )
    assert response.status_code == 202
    assert response.content == b""
    assert fake.submissions[0].output == parts


async def test_request_over_4_mib_is_too_large(
    fake: FakeAgentsAPI, http: httpx.AsyncClient
) -> None:
    """A body over 4,194,304 bytes answers 400 "too large"; exactly at the limit is fine."""
    sid = fake.create_session([[FakeCall("a")]])
    action = fake.required_actions(sid)[0]
    shell = json.dumps({"events": [result(action, output="")]}).encode()
    fill = MAX_REQUEST_BYTES - len(shell)
    at_limit = json.dumps({"events": [result(action, output="x" * fill)]}).encode()
    assert len(at_limit) == MAX_REQUEST_BYTES
    over = json.dumps({"events": [result(action, output="x" * (fill + 1))]}).encode()
    response = await http.post(f"/agents/sessions/{sid}/events", content=over)
    assert response.status_code == 400
    assert "too large" in response.json()["error"]["message"]
    ok = await http.post(f"/agents/sessions/{sid}/events", content=at_limit)
    assert ok.status_code == 202


# -- pending calls, idempotency and conflicts --------------------------------------------------


async def test_unknown_cancelled_and_wrong_turn_calls(
    fake: FakeAgentsAPI, http: httpx.AsyncClient
) -> None:
    """Never-existing or cancelled calls answer the race message; a wrong turn is 400."""
    sid = fake.create_session([[FakeCall("a")], [FakeCall("b", call_id="call_later")]])
    action = fake.required_actions(sid)[0]
    unknown = await submit(http, sid, result(action, call_id="call_ghost"))
    assert unknown.status_code == 400
    assert unknown.json()["error"] == {
        "message": "Unknown pending tool call: call_ghost",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_request_error",
    }
    not_yet = await submit(http, sid, result(action, call_id="call_later"))
    assert not_yet.json()["error"]["message"] == "Unknown pending tool call: call_later"
    wrong_turn = await submit(http, sid, result(action, turn_id="turn_other"))
    assert wrong_turn.status_code == 400
    assert wrong_turn.json()["error"]["param"] == "events[0].turn_id"
    assert fake.cancel_turn(sid) is True
    assert fake.cancel_turn(sid) is False
    cancelled = await submit(http, sid, result(action))
    assert cancelled.json()["error"]["message"] == f"Unknown pending tool call: {action['call_id']}"
    assert fake.session(sid)["status"] == "idle"
    assert fake.submissions == []
    assert "agent.session.turn.cancelled" in [e["type"] for e in fake.events(sid)]


async def test_cancel_event_over_http(fake: FakeAgentsAPI, http: httpx.AsyncClient) -> None:
    """``agent.session.input.cancel`` cancels the turn like ``cancel_turn``."""
    sid = fake.create_session([[FakeCall("a")]])
    assert (await submit(http, sid, {"type": "agent.session.input.cancel"})).status_code == 202
    assert fake.required_actions(sid) == []
    assert fake.session(sid)["status"] == "idle"


async def test_idempotency_and_conflicts(fake: FakeAgentsAPI, http: httpx.AsyncClient) -> None:
    """Same key+body: 202 no effect; reused key: 409; a different result: 409 conflict."""
    sid = fake.create_session([[FakeCall("a"), FakeCall("b")]])
    a, b = fake.required_actions(sid)
    assert (await submit(http, sid, result(a), key="k1")).status_code == 202
    assert (await submit(http, sid, result(a), key="k1")).status_code == 202
    assert len(fake.submissions) == 1
    reused = await submit(http, sid, result(b), key="k1")
    assert reused.status_code == 409
    assert reused.json()["error"]["code"] == "idempotency_conflict"
    different = await submit(http, sid, result(a, output="other"), key="k2")
    assert different.status_code == 409
    assert different.json()["error"]["code"] == "conflict_error"
    same_again = await submit(http, sid, result(a), key="k3")
    assert same_again.status_code == 202
    assert len(fake.submissions) == 1
    assert [d.call_id for d in fake.duplicate_submissions] == [a["call_id"]]


async def test_batches_are_atomic(fake: FakeAgentsAPI, http: httpx.AsyncClient) -> None:
    """A batch with one bad result applies nothing; a batch of all results applies all."""
    sid = fake.create_session([[FakeCall("a"), FakeCall("b")]])
    a, b = fake.required_actions(sid)
    bad = await submit(http, sid, result(a), result(b, call_id="call_ghost"))
    assert bad.status_code == 400
    assert fake.submissions == []
    assert len(fake.required_actions(sid)) == 2
    good = await submit(http, sid, result(a), result(b))
    assert good.status_code == 202
    assert fake.session(sid)["status"] == "idle"


async def test_concurrent_identical_submissions_take_effect_once(
    fake: FakeAgentsAPI, http: httpx.AsyncClient
) -> None:
    """Replicas racing to submit the same result: exactly one submission takes effect."""
    sid = fake.create_session([[FakeCall("a")]])
    action = fake.required_actions(sid)[0]
    responses = await asyncio.gather(
        *(submit(http, sid, result(action), key=f"k{i}") for i in range(10))
    )
    assert {r.status_code for r in responses} == {202}
    assert len(fake.submissions) == 1
    assert len(fake.duplicate_submissions) == 9


async def test_wait_helpers_time_out(fake: FakeAgentsAPI) -> None:
    """wait_idle and wait_for_submissions raise TimeoutError when nothing happens."""
    sid = fake.create_session([[FakeCall("a")]])
    with pytest.raises(TimeoutError):
        await fake.wait_idle(sid, timeout=0.02)
    with pytest.raises(TimeoutError):
        await fake.wait_for_submissions(1, timeout=0.02)


# -- faults -----------------------------------------------------------------------------------


@pytest.mark.parametrize("route", ["retrieve", "submit", "stream", "delete"])
async def test_fail_next_per_route(
    fake: FakeAgentsAPI, http: httpx.AsyncClient, route: str
) -> None:
    """fail_next answers the next N requests of one route with the status and headers."""
    sid = fake.create_session([[FakeCall("a")]])
    fake.fail_next(route, 2, 503, retry_after=2, retry_after_ms=1500, should_retry=True)  # type: ignore[arg-type]
    requests: dict[str, Callable[[], Awaitable[httpx.Response]]] = {
        "retrieve": lambda: http.get(f"/agents/sessions/{sid}"),
        "submit": lambda: submit(http, sid, {"type": "agent.session.input.message", "input": []}),
        "stream": lambda: http.get(f"/agents/sessions/{sid}/events"),
        "delete": lambda: http.delete(f"/agents/sessions/{sid}"),
    }
    for _ in range(2):
        response = await requests[route]()
        assert response.status_code == 503
        assert response.headers["retry-after"] == "2"
        assert response.headers["retry-after-ms"] == "1500"
        assert response.headers["x-should-retry"] == "true"
        assert response.json()["error"]["type"] == "server_error"
    if route != "stream":
        assert (await requests[route]()).status_code in (200, 202)
    with pytest.raises(ValueError, match="unknown route"):
        fake.fail_next("nope", 1, 500)  # type: ignore[arg-type]


async def test_fail_next_custom_body(fake: FakeAgentsAPI, http: httpx.AsyncClient) -> None:
    """A custom body (bytes sent as is) replaces the default error JSON."""
    sid = fake.create_session([[FakeCall("a")]])
    fake.fail_next("retrieve", 1, 502, body=b"<html>bad gateway</html>")
    response = await http.get(f"/agents/sessions/{sid}")
    assert (response.status_code, response.content) == (502, b"<html>bad gateway</html>")


async def test_latency(fake: FakeAgentsAPI, http: httpx.AsyncClient) -> None:
    """set_latency delays each answer of the route; 0 turns it off."""
    sid = fake.create_session([[FakeCall("a")]])
    fake.set_latency("retrieve", 0.1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    await http.get(f"/agents/sessions/{sid}")
    assert loop.time() - started >= 0.1
    fake.set_latency("retrieve", 0)
    started = loop.time()
    await http.get(f"/agents/sessions/{sid}")
    assert loop.time() - started < 0.1


async def test_drop_in_process(fake: FakeAgentsAPI, http: httpx.AsyncClient) -> None:
    """In-process, a drop surfaces as an httpx transport error; the request is logged."""
    sid = fake.create_session([[FakeCall("a")]])
    fake.drop_next("retrieve")
    with pytest.raises(httpx.TransportError) as caught:
        await http.get(f"/agents/sessions/{sid}")
    assert isinstance(caught.value, FakeConnectionDropped)
    assert fake.requests[-1].status is None
    assert (await http.get(f"/agents/sessions/{sid}")).status_code == 200


async def test_drop_after_processing_applies_the_result(
    fake: FakeAgentsAPI, http: httpx.AsyncClient
) -> None:
    """``after_processing``: the result takes effect but the answer is lost."""
    sid = fake.create_session([[FakeCall("a")]])
    action = fake.required_actions(sid)[0]
    fake.drop_next("submit", after_processing=True)
    with pytest.raises(httpx.TransportError):
        await submit(http, sid, result(action), key="k")
    assert len(fake.submissions) == 1
    assert (await submit(http, sid, result(action), key="k")).status_code == 202
    assert len(fake.submissions) == 1


async def test_fail_after_processing_applies_the_result_then_answers_the_error(
    fake: FakeAgentsAPI, http: httpx.AsyncClient
) -> None:
    """``fail_next(after_processing=True)``: the result takes effect, the answer is the
    error (applied-then-failed); the retry with the same key is an idempotent 202."""
    sid = fake.create_session([[FakeCall("a"), FakeCall("b")]])
    first, second = fake.required_actions(sid)
    fake.fail_next("submit", 1, 503, retry_after=1, after_processing=True)
    failed = await submit(http, sid, result(first), key="k")
    assert failed.status_code == 503
    assert failed.headers["retry-after"] == "1"
    assert [s.call_id for s in fake.submissions] == [first["call_id"]]
    assert (await submit(http, sid, result(first), key="k")).status_code == 202
    assert (await submit(http, sid, result(second), key="k2")).status_code == 202
    assert [s.call_id for s in fake.submissions] == [first["call_id"], second["call_id"]]


async def test_fail_after_processing_waits_behind_plain_failures(
    fake: FakeAgentsAPI, http: httpx.AsyncClient
) -> None:
    """Failures are used in the order they were planned, whichever kind they are."""
    sid = fake.create_session([[FakeCall("a")]])
    action = fake.required_actions(sid)[0]
    fake.fail_next("submit", 1, 500)
    fake.fail_next("submit", 1, 502, after_processing=True)
    assert (await submit(http, sid, result(action), key="k")).status_code == 500
    assert fake.submissions == []
    assert (await submit(http, sid, result(action), key="k")).status_code == 502
    assert len(fake.submissions) == 1
    assert (await submit(http, sid, result(action), key="k")).status_code == 202


async def test_fail_after_processing_refuses_the_stream(fake: FakeAgentsAPI) -> None:
    with pytest.raises(ValueError, match="stream"):
        fake.fail_next("stream", after_processing=True)


async def test_drop_over_loopback_closes_the_connection(fake: FakeAgentsAPI) -> None:
    """Over a real server a drop is a closed connection (RemoteProtocolError), not a 500."""
    sid = fake.create_session([[FakeCall("a")]])
    fake.drop_next("retrieve")
    async with serve_fake(fake) as base_url, httpx.AsyncClient(headers=HEADERS) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.get(f"{base_url}/agents/sessions/{sid}")
        ok = await client.get(f"{base_url}/agents/sessions/{sid}")
        assert ok.status_code == 200


async def test_race_once(fake: FakeAgentsAPI, http: httpx.AsyncClient) -> None:
    """race_once answers the race 400 for a pending call once, then accepts it."""
    sid = fake.create_session([[FakeCall("a")]])
    action = fake.required_actions(sid)[0]
    fake.race_once(action["call_id"])
    first = await submit(http, sid, result(action), key="k")
    assert first.status_code == 400
    assert first.json()["error"]["message"] == f"Unknown pending tool call: {action['call_id']}"
    assert fake.submissions == []
    assert (await submit(http, sid, result(action), key="k")).status_code == 202


# -- webhooks ---------------------------------------------------------------------------------


async def test_webhooks_are_signed_with_every_secret(receiver: Receiver) -> None:
    """Each delivery carries one v1 signature per secret and verifies with either."""
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=receiver))
    async with FakeAgentsAPI(
        webhook_secret=[SECRET, OTHER_SECRET], webhook_url="http://r/h", webhook_client=client
    ) as api:
        sid = api.create_session([[FakeCall("a")]])
        await api.drain_webhooks()
    await client.aclose()
    headers, body = receiver.received[-1]
    assert len(headers["webhook-signature"].split()) == 2
    assert headers["content-type"] == "application/json"
    assert headers["user-agent"].startswith("OpenAI/")
    for secret in (SECRET, OTHER_SECRET):
        WebhookVerifier(secret).verify(body, headers)
    event = parse_webhook_event(body)
    assert event.session_id == sid
    assert event.required_action_type == "function_call"


async def test_default_secret_is_generated() -> None:
    """Without a secret the fake makes a whsec_ one and exposes it."""
    api = FakeAgentsAPI()
    assert api.webhook_secret.startswith("whsec_")
    assert api.webhook_secrets == (api.webhook_secret,)


@pytest.mark.parametrize("failure", [500, 302, 404])
async def test_failed_deliveries_are_retried_with_the_same_id(
    fake: FakeAgentsAPI, receiver: Receiver, failure: int
) -> None:
    """Non-2xx (3xx included) is retried with backoff, keeping the webhook-id."""
    receiver.fail_each = (2, failure)
    fake.create_session([])  # created, in_progress, idle
    await fake.drain_webhooks()
    first = [d for d in fake.deliveries if d.event_type == "agent.session.created"]
    assert [(d.attempt, d.status) for d in first] == [(1, failure), (2, failure), (3, 200)]
    assert len({d.webhook_id for d in first}) == 1
    received = [h for h, body in receiver.received if b"agent.session.created" in body]
    assert {h["webhook-id"] for h in received} == {first[0].webhook_id}
    assert len(received) == 3
    assert first[-1].ok


async def test_attempts_are_bounded(fake: FakeAgentsAPI, receiver: Receiver) -> None:
    """A receiver that always fails gets max_attempts tries per delivery, then no more."""
    receiver.statuses = [500] * 100
    fake.create_session([])
    await fake.drain_webhooks()
    created = [d for d in fake.deliveries if d.event_type == "agent.session.created"]
    assert len(created) == fake.webhooks.max_attempts == 4


async def test_each_attempt_says_whether_another_follows(
    fake: FakeAgentsAPI, receiver: Receiver
) -> None:
    """``next_retry`` is the delay before the next attempt; the last failed attempt has
    none and says ``gave_up``; a delivered one neither."""
    receiver.fail_each = (4, 500)  # every attempt fails
    fake.create_session([])
    await fake.drain_webhooks()
    created = [d for d in fake.deliveries if d.event_type == "agent.session.created"]
    assert [(d.next_retry, d.gave_up) for d in created] == [
        (0.01, False),
        (0.01, False),
        (0.01, False),
        (None, True),
    ]
    receiver.fail_each = (1, 500)  # the retry succeeds
    fake.create_session([], session_id="sess_second")
    await fake.drain_webhooks()
    second = [d for d in fake.deliveries if d.session_id == "sess_second"]
    assert second and not any(d.gave_up for d in second)
    assert all(d.next_retry is None for d in second if d.ok)
    assert all(d.next_retry == 0.01 for d in second if not d.ok)


def test_webhook_backoff_doubles_up_to_a_cap_and_fills_the_window() -> None:
    """``webhook_backoff`` grows exponentially, caps each delay and adds up to the window:
    ``fake-api``'s five minutes are five minutes (its banner said 243 s); a window shorter
    than the first delay means no retry."""
    assert webhook_backoff(300) == (1, 2, 4, 8, 16, 32, 60, 60, 60, 57)
    assert sum(webhook_backoff(DEV_WEBHOOK_RETRY_WINDOW)) == DEV_WEBHOOK_RETRY_WINDOW == 300
    assert webhook_backoff(1.0, first=0.25, cap=0.5) == (0.25, 0.5, 0.25)
    assert webhook_backoff(0.5) == ()
    with pytest.raises(ValueError, match="first > 0"):
        webhook_backoff(10, first=0)


async def test_a_url_with_its_own_client_and_its_removal(receiver: Receiver) -> None:
    """``add_webhook_url(url, client=...)`` reaches that URL through the given client;
    after ``remove_webhook_url`` nothing more is sent there, queued deliveries included."""
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=receiver))
    async with FakeAgentsAPI() as api:
        api.add_webhook_url("http://in-process/hooks", client=client)
        api.create_session([])
        await api.drain_webhooks()
        assert len(receiver.received) == 3  # created, in_progress, idle
        api.create_session([])  # queued...
        api.remove_webhook_url("http://in-process/hooks")  # ...then the endpoint goes away
        await api.drain_webhooks()
    await client.aclose()
    assert len(receiver.received) == 3
    assert len(api.deliveries) == 3
    assert api.webhooks.urls == []


async def test_unreachable_receiver_is_recorded() -> None:
    """A connection error is a failed attempt with ``status`` None and an error text."""
    async with FakeAgentsAPI(
        webhook_url="http://127.0.0.1:9/hook", webhook_retry_delays=(0.01,)
    ) as api:
        api.create_session([])
        await api.drain_webhooks()
    assert api.deliveries
    assert all(d.status is None and d.error for d in api.deliveries)


async def test_several_urls(receiver: Receiver) -> None:
    """Every URL gets every event, under the same webhook-id."""
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=receiver))
    async with FakeAgentsAPI(
        webhook_url=["http://r/one", "http://r/two"], webhook_client=client
    ) as api:
        api.create_session([])
        await api.drain_webhooks()
    await client.aclose()
    urls = [d.url for d in api.deliveries if d.event_type == "agent.session.idle"]
    assert urls == ["http://r/one", "http://r/two"]


async def test_duplicate_webhooks(fake: FakeAgentsAPI, receiver: Receiver) -> None:
    """duplicate_webhooks sends each delivery twice with the same webhook-id."""
    fake.duplicate_webhooks(True)
    fake.create_session([[FakeCall("a")]])
    await fake.drain_webhooks()
    ids = [h["webhook-id"] for h, _ in receiver.received]
    assert len(ids) == 6
    assert ids[0] == ids[1]
    assert ids[2] == ids[3]
    assert receiver.types()[4:] == ["agent.session.action_required"] * 2


async def test_reorder_webhooks(fake: FakeAgentsAPI, receiver: Receiver) -> None:
    """reorder_webhooks delivers each event after its successor."""
    fake.reorder_webhooks(True)
    fake.create_session([[FakeCall("a")]])
    await fake.drain_webhooks()
    assert receiver.types() == [
        "agent.session.in_progress",
        "agent.session.created",
        "agent.session.action_required",
    ]


async def test_redeliver(fake: FakeAgentsAPI, receiver: Receiver) -> None:
    """redeliver sends a fresh action_required (new id) only while calls are pending."""
    sid = fake.create_session([[FakeCall("a")]])
    await fake.drain_webhooks()
    original = receiver.received[-1][0]["webhook-id"]
    new_id = fake.redeliver(sid)
    await fake.drain_webhooks()
    assert new_id is not None
    assert new_id != original
    assert receiver.received[-1][0]["webhook-id"] == new_id
    assert receiver.types()[-1] == "agent.session.action_required"
    fake.cancel_turn(sid)
    assert fake.redeliver(sid) is None


# -- SSE --------------------------------------------------------------------------------------


async def test_sse_stream_format(fake: FakeAgentsAPI, http: httpx.AsyncClient) -> None:
    """The stream has a comment, ``event:`` lines, obfuscated data, and ends with [DONE]."""
    sid = fake.create_session([[FakeCall("a")]])
    action = fake.required_actions(sid)[0]
    stream = asyncio.create_task(http.get(f"/agents/sessions/{sid}/events"))
    while not fake.sessions[sid].listeners:
        await asyncio.sleep(0.001)
    await submit(http, sid, result(action))
    response = await stream
    assert response.headers["content-type"].startswith("text/event-stream")
    text = response.text
    assert text.startswith(": connected\n\n")
    assert text.endswith("data: [DONE]\n\n")
    blocks = [b for b in text.split("\n\n") if b.startswith("event:")]
    events = [json.loads(b.split("\ndata: ", 1)[1]) for b in blocks]
    assert [b.split("\n")[0] for b in blocks] == [f"event: {e['type']}" for e in events]
    assert events[-1]["type"] == "agent.session.idle"
    assert all(e["obfuscation"].isalnum() for e in events)


async def test_sse_keepalive_and_no_obfuscation(http: httpx.AsyncClient) -> None:
    """Keepalive comments flow while waiting; include_obfuscation=false removes padding."""
    async with FakeAgentsAPI(sse_keepalive=0.01) as api:
        sid = api.create_session([[FakeCall("a")]])
        action = api.required_actions(sid)[0]
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=api), base_url="http://f/v1", headers=HEADERS
        ) as client:
            stream = asyncio.create_task(
                client.get(f"/agents/sessions/{sid}/events?include_obfuscation=false")
            )
            await asyncio.sleep(0.05)
            await submit(client, sid, result(action))
            text = (await stream).text
    assert ": keepalive\n\n" in text
    assert "obfuscation" not in text


async def test_sse_on_idle_session_stays_open_for_the_next_turn(fake: FakeAgentsAPI) -> None:
    """Streaming an idle session stays open, as the API's does (it used to end at once,
    which broke the SDK's ``sessions.stream`` helper: it subscribes, then sends input): the
    turn a message starts streams on it, and the stream ends with that turn's idle."""
    sid = fake.create_session([])
    fake.queue_turn(sid, [])
    message = {"type": "agent.session.input.message", "input": [{"type": "input_text"}]}
    async with serve_fake(fake) as base_url, httpx.AsyncClient(headers=HEADERS) as client:
        url = f"{base_url}/agents/sessions/{sid}/events"
        async with client.stream("GET", url) as response:
            lines = response.aiter_lines()
            assert await anext(lines) == ": connected"
            await submit_direct(client, base_url, sid, message)
            seen = [line async for line in lines if line.startswith("event: ")]
    assert seen[0] == "event: agent.session.turn.created"
    assert seen[-1] == "event: agent.session.idle"


async def test_sse_over_loopback_is_live(fake: FakeAgentsAPI) -> None:
    """Over a socket events arrive as they happen; delete_session ends the stream."""
    sid = fake.create_session([[FakeCall("a"), FakeCall("b")]])
    a = fake.required_actions(sid)[0]
    async with serve_fake(fake) as base_url, httpx.AsyncClient(headers=HEADERS) as client:
        url = f"{base_url}/agents/sessions/{sid}/events"
        async with client.stream("GET", url) as response:
            lines = response.aiter_lines()
            assert await anext(lines) == ": connected"
            await submit_direct(client, base_url, sid, result(a))
            seen = []
            async for line in lines:
                seen.append(line)
                if line.startswith("data:"):
                    break
            assert json.loads(seen[-1][6:])["type"] == "agent.session.turn.item.added"
            fake.delete_session(sid)
            rest = [line async for line in lines]
            assert "data: [DONE]" in rest


async def submit_direct(
    client: httpx.AsyncClient, base_url: str, sid: str, event: dict[str, Any]
) -> None:
    response = await client.post(
        f"{base_url}/agents/sessions/{sid}/events", json={"events": [event]}
    )
    assert response.status_code == 202


# -- lifecycle and helpers --------------------------------------------------------------------


async def test_lifespan_and_serve_app(receiver: Receiver) -> None:
    """Under uvicorn the lifespan starts the sender; serve_app serves any ASGI app."""
    async with serve_app(receiver) as hook_root:
        api = FakeAgentsAPI(webhook_url=f"{hook_root}/hooks")
        async with serve_fake(api) as base_url, httpx.AsyncClient(headers=HEADERS) as client:
            assert base_url.startswith("http://127.0.0.1:")
            assert base_url.endswith("/v1")
            sid = api.create_session([[FakeCall("a")]])
            assert (await client.get(f"{base_url}/agents/sessions/{sid}")).status_code == 200
            await api.drain_webhooks()
    assert "agent.session.action_required" in receiver.types()


async def test_signed_delivery_helpers() -> None:
    """signed_delivery signs a dict or exact bytes; action_required_event has the §8.1 shape."""
    event = action_required_event("sess_1", event_id="evt_1", created_at=5)
    assert event == {
        "id": "evt_1",
        "object": "event",
        "created_at": 5,
        "type": "agent.session.action_required",
        "data": {"id": "sess_1", "required_action": {"type": "function_call"}},
    }
    body, headers = signed_delivery(SECRET, event, msg_id="wh_1", timestamp=1_700_000_000)
    assert headers["webhook-id"] == "wh_1"
    verifier = WebhookVerifier(SECRET, clock=lambda: 1_700_000_000)
    assert verifier.verify(body, headers).msg_id == "wh_1"
    raw = b'{"id":"evt_2" }'
    body2, headers2 = signed_delivery([SECRET, OTHER_SECRET], raw)
    assert body2 == raw
    assert len(headers2["webhook-signature"].split()) == 2
    assert headers2["webhook-id"].startswith("wh_")


async def test_websocket_scope_is_closed() -> None:
    """A websocket connection is closed politely (the fake has none)."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: Any) -> None:
        sent.append(message)

    await FakeAgentsAPI()({"type": "websocket"}, receive, send)
    assert sent == [{"type": "websocket.close", "code": 1000}]


async def test_a_batch_over_loopback_is_applied_once_under_its_key(fake: FakeAgentsAPI) -> None:
    """Several results in one POST over a real server: all applied at once; the same body
    under the same key again (a resubmission after a crash, another replica) is a replay with
    no effect; a batch naming a call that is not pending is refused whole, naming it."""
    sid = fake.create_session([[FakeCall("a"), FakeCall("b"), FakeCall("c")]])
    first, second, third = fake.required_actions(sid)
    batch = {"events": [result(first), result(second)]}
    async with serve_fake(fake) as base_url, httpx.AsyncClient(headers=HEADERS) as client:
        url = f"{base_url}/agents/sessions/{sid}/events"
        sent = [await client.post(url, json=batch, headers={"Idempotency-Key": "b1"}) for _ in "ab"]
        assert [r.status_code for r in sent] == [202, 202]
        assert sorted(s.call_id for s in fake.submissions) == sorted(
            [first["call_id"], second["call_id"]]
        )
        assert fake.duplicate_submissions == []
        unknown = {**result(third), "call_id": "call_unknown"}
        refused = await client.post(url, json={"events": [result(third), unknown]})
        assert refused.status_code == 400
        assert refused.json()["error"]["message"] == "Unknown pending tool call: call_unknown"
        assert len(fake.submissions) == 2  # the batch was refused whole
