"""Wire models: tolerant parsing of sessions, webhooks, input and streamed events."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentfn_asgi import wire
from agentfn_asgi.wire import (
    AgentSession,
    ComputerUseApprovalRequestAction,
    EnvironmentConnectionAction,
    ErrorBody,
    FunctionCallAction,
    GenericAction,
    InputImagePart,
    InputTextPart,
    MCPApprovalRequestAction,
    ToolResultEvent,
    WebhookEvent,
    parse_webhook_event,
)

FUNCTION_CALL = {
    "type": "function_call",
    "turn_id": "turn_1",
    "call_id": "call_1",
    "name": "get_customer",
    "arguments": {"customer_id": "123"},
}


def session_json(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "sess_1",
        "object": "agent.session",
        "status": "requires_action",
        "required_actions": [FUNCTION_CALL],
        "created_at": 1,
        "last_active_at": 2,
        "metadata": {"k": "v"},
        "error": None,
    }
    body.update(overrides)
    return body


def test_all_is_sorted_and_complete() -> None:
    """``__all__`` names every public model and nothing missing (ruff RUF022 keeps it sorted)."""
    public = {
        name
        for name, value in vars(wire).items()
        if not name.startswith("_") and getattr(value, "__module__", None) == wire.__name__
    }
    assert public <= set(wire.__all__)
    for name in wire.__all__:
        assert hasattr(wire, name)


def test_session_parses_every_action_type() -> None:
    """Each documented required action parses to its model; unknown ones to GenericAction."""
    actions = [
        FUNCTION_CALL,
        {"type": "environment_connection", "environment_id": "env_1"},
        {
            "type": "mcp_approval_request",
            "request_id": "r1",
            "turn_id": "turn_1",
            "request": {"type": "mcp_tool_call", "server_label": "s", "message": "m"},
        },
        {
            "type": "computer_use_approval_request",
            "request_id": "r2",
            "turn_id": "turn_1",
            "request": {"type": "browser_origin_access", "origin": "https://x"},
        },
        {"type": "shiny_new_action", "whatever": [1, 2]},
    ]
    session = AgentSession.model_validate(session_json(required_actions=actions))
    kinds = [type(a) for a in session.required_actions]
    assert kinds == [
        FunctionCallAction,
        EnvironmentConnectionAction,
        MCPApprovalRequestAction,
        ComputerUseApprovalRequestAction,
        GenericAction,
    ]
    generic = session.required_actions[4]
    assert generic.type == "shiny_new_action"
    assert generic.model_extra == {"whatever": [1, 2]}
    assert session.function_calls == [FunctionCallAction.model_validate(FUNCTION_CALL)]


def test_session_tolerates_unknown_fields_and_statuses() -> None:
    """Unknown top-level fields are kept and a new status value is not an error."""
    session = AgentSession.model_validate_json(
        json.dumps(session_json(status="paused", brand_new={"x": 1}))
    )
    assert session.status == "paused"
    assert session.model_extra == {"brand_new": {"x": 1}}


def test_session_minimal_and_empty_actions() -> None:
    """Only id and status are needed; required_actions defaults to empty."""
    session = AgentSession.model_validate({"id": "s", "status": "idle"})
    assert session.required_actions == []
    assert session.function_calls == []


def test_function_call_arguments_stay_as_sent() -> None:
    """``arguments`` may be an object or a JSON string; it is kept as sent for the tool layer."""
    as_string = {**FUNCTION_CALL, "arguments": '{"customer_id":"123"}'}
    action = AgentSession.model_validate(session_json(required_actions=[as_string]))
    assert action.function_calls[0].arguments == '{"customer_id":"123"}'


def test_malformed_function_call_is_an_error() -> None:
    """A known action type missing its key fields is a parse failure, not silently generic."""
    bad = {"type": "function_call", "turn_id": "t"}
    with pytest.raises(ValueError, match="call_id"):
        AgentSession.model_validate(session_json(required_actions=[bad]))


def test_models_are_frozen() -> None:
    """Parsed values cannot be changed by accident."""
    session = AgentSession.model_validate(session_json())
    with pytest.raises(ValueError, match="frozen"):
        session.status = "idle"  # type: ignore[misc]


def test_webhook_event_session_id_and_action_type() -> None:
    """``session_id`` and ``required_action_type`` read an action_required envelope."""
    body = json.dumps(
        {
            "id": "evt_1",
            "object": "event",
            "created_at": 1700000000,
            "type": "agent.session.action_required",
            "data": {"id": "sess_9", "required_action": {"type": "function_call"}},
        }
    ).encode()
    event = parse_webhook_event(body)
    assert event.session_id == "sess_9"
    assert event.required_action_type == "function_call"
    data = event.typed_data()
    assert isinstance(data, wire.ActionRequiredWebhookData)
    assert data.required_action.type == "function_call"


@pytest.mark.parametrize(
    ("event_type", "data", "session_id", "typed"),
    [
        ("agent.session.idle", {"id": "s1", "environment_type": "none"}, "s1", "session"),
        ("agent.session.in_progress", {"id": "s1"}, "s1", "session"),
        ("agent.environment.ready", {"id": "env_1"}, None, "environment"),
        ("batch.completed", {"id": "batch_1"}, None, None),
        ("agent.session.idle", {"id": 5}, None, "error"),
    ],
)
def test_webhook_event_other_types(
    event_type: str, data: dict[str, Any], session_id: str | None, typed: str | None
) -> None:
    """Non-session events have no session id; unknown types parse; typed_data matches."""
    event = WebhookEvent(id="evt", created_at=1, type=event_type, data=data)
    assert event.session_id == session_id
    assert event.required_action_type is None
    if typed == "error":
        with pytest.raises(ValueError, match="id"):
            event.typed_data()
    elif typed == "session":
        assert isinstance(event.typed_data(), wire.SessionWebhookData)
    elif typed == "environment":
        assert isinstance(event.typed_data(), wire.EnvironmentWebhookData)
    else:
        assert event.typed_data() is None


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"not json",
        b"[]",
        b'"text"',
        b"\xff\xfe",
        b'{"id":"e","object":"event","created_at":1,"data":{}}',
        b'{"id":"e","object":"event","created_at":1,"type":"x","data":[]}',
        b'{"id":"e","object":"event","created_at":1,"type":"\\ud800","data":{}}',
        b'{"id":"e","created_at":1,"type":"x","data":{"id":"s"}} trailing',
    ],
)
def test_parse_webhook_event_rejects_malformed(body: bytes) -> None:
    """Anything without a string ``type`` and an object ``data`` raises ValueError (never
    another exception)."""
    with pytest.raises(ValueError):  # noqa: PT011 - any ValueError subclass is the contract
        parse_webhook_event(body)


@pytest.mark.parametrize(
    "body",
    [
        b'{"object":"event","created_at":1,"type":"t","data":{"id":"s"}}',
        b'{"id":"e","object":"event","type":"t","data":{"id":"s"}}',
        b'{"id":"e","created_at":"soon","type":"t","data":{"id":"s"}}',
        b'{"id":7,"created_at":1.5,"type":"t","data":{"id":"s"}}',
        b'{"id":"e","created_at":1,"type":"t","data":{"id":"s","note":"\\ud800"}}',
        b'{"id":"e","created_at":1,"type":"t","data":{"id":"s","deep":'
        + b"[" * 5000
        + b"]" * 5000
        + b"}}",
        b'{"id":"e","created_at":1,"type":"t","data":{"id":"s","n":' + b"9" * 5000 + b"}}",
    ],
)
def test_parse_webhook_event_reads_an_odd_envelope_for_what_the_app_uses(body: bytes) -> None:
    """An authentic body whose unused fields are odd is still read for ``type`` and
    ``data.id``: refusing it would lose the delivery (the sender retries the same bytes)."""
    event = parse_webhook_event(body)
    assert (event.type, event.data.get("id")) == ("t", "s")


def test_tool_result_event_round_trip() -> None:
    """A tool result serialises to the documented wire shape, with content parts."""
    event = ToolResultEvent(
        turn_id="t",
        call_id="c",
        success=True,
        output=[InputTextPart(text="hi"), InputImagePart(image_url="data:image/png;base64,AA")],
    )
    assert event.model_dump(mode="json") == {
        "type": "agent.session.input.tool_result",
        "turn_id": "t",
        "call_id": "c",
        "success": True,
        "output": [
            {"type": "input_text", "text": "hi"},
            {"type": "input_image", "image_url": "data:image/png;base64,AA"},
        ],
        "error": None,
    }
    parsed = ToolResultEvent.model_validate(event.model_dump(mode="json"))
    assert parsed == event
    with pytest.raises(ValueError, match="input_text"):
        ToolResultEvent.model_validate(
            {"turn_id": "t", "call_id": "c", "success": True, "output": [{"type": "input_file"}]}
        )


def test_error_body() -> None:
    """The error envelope parses with optional param and code."""
    raw = b'{"error":{"message":"m","type":"invalid_request_error"}}'
    body = ErrorBody.model_validate_json(raw)
    assert body.error.message == "m"
    assert body.error.param is None
    assert body.error.code is None


SESSION = {"id": "sess_1", "status": "idle"}
