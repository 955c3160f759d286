"""Streamed session events (``agentfn_asgi.session_events``): every type parses to its
model, unknown types to the generic one, malformed events raise."""

from __future__ import annotations

from typing import Any

import pytest

from agentfn_asgi import session_events
from agentfn_asgi.session_events import (
    ErrorEvent,
    GenericSessionEvent,
    SessionCreatedEvent,
    SessionFailedEvent,
    SessionIdleEvent,
    SessionInProgressEvent,
    SessionRequiresActionEvent,
    TurnCancelledEvent,
    TurnCompletedEvent,
    TurnCreatedEvent,
    TurnFailedEvent,
    TurnInProgressEvent,
    TurnItemAddedEvent,
    TurnItemDoneEvent,
    parse_session_event,
)

from .test_wire import FUNCTION_CALL, SESSION, session_json


def test_all_is_sorted_and_complete() -> None:
    """``__all__`` names every public model of the module and nothing missing."""
    public = {
        name
        for name, value in vars(session_events).items()
        if not name.startswith("_")
        and getattr(value, "__module__", None) == session_events.__name__
    }
    assert public <= set(session_events.__all__)
    for name in session_events.__all__:
        assert hasattr(session_events, name)


TURN = {"id": "turn_1", "status": "completed", "object": "agent.session.turn"}


@pytest.mark.parametrize(
    ("payload", "cls"),
    [
        ({"type": "agent.session.created", "session": SESSION}, SessionCreatedEvent),
        ({"type": "agent.session.in_progress", "session": SESSION}, SessionInProgressEvent),
        (
            {"type": "agent.session.requires_action", "session": session_json()},
            SessionRequiresActionEvent,
        ),
        ({"type": "agent.session.idle", "session": SESSION}, SessionIdleEvent),
        ({"type": "agent.session.failed", "session": SESSION}, SessionFailedEvent),
        (
            {"type": "agent.session.turn.created", "session_id": "s", "turn_id": "t", "turn": TURN},
            TurnCreatedEvent,
        ),
        (
            {
                "type": "agent.session.turn.in_progress",
                "session_id": "s",
                "turn_id": "t",
                "turn": TURN,
            },
            TurnInProgressEvent,
        ),
        (
            {
                "type": "agent.session.turn.completed",
                "session_id": "s",
                "turn_id": "t",
                "turn": TURN,
            },
            TurnCompletedEvent,
        ),
        (
            {"type": "agent.session.turn.failed", "session_id": "s", "turn_id": "t", "turn": TURN},
            TurnFailedEvent,
        ),
        (
            {
                "type": "agent.session.turn.cancelled",
                "session_id": "s",
                "turn_id": "t",
                "turn": TURN,
            },
            TurnCancelledEvent,
        ),
        (
            {"type": "agent.session.turn.item.added", "session_id": "s", "item": FUNCTION_CALL},
            TurnItemAddedEvent,
        ),
        (
            {
                "type": "agent.session.turn.item.done",
                "session_id": "s",
                "item": {"type": "message"},
                "output_index": 0,
            },
            TurnItemDoneEvent,
        ),
        (
            {"type": "error", "session_id": "s", "error": {"message": "boom", "code": "x"}},
            ErrorEvent,
        ),
        ({"type": "agent.session.turn.output_text.delta", "delta": "hi"}, GenericSessionEvent),
    ],
)
def test_parse_session_event_types(payload: dict[str, Any], cls: type[Any]) -> None:
    """Every modelled streamed type parses to its class; unknown ones to the generic model."""
    event = parse_session_event({"event_id": "ev_1", "obfuscation": "xyz", **payload})
    assert type(event) is cls
    assert event.type == payload["type"]
    assert event.obfuscation == "xyz"


def test_parse_session_event_from_text_and_errors() -> None:
    """JSON text or bytes are accepted; non-objects and malformed known types raise."""
    event = parse_session_event('{"type":"error","event_id":"e","error":{"message":"m"}}')
    assert isinstance(event, ErrorEvent)
    assert event.error.message == "m"
    with pytest.raises(ValueError, match="JSON object"):
        parse_session_event(b"[1]")
    with pytest.raises(ValueError, match="session"):
        parse_session_event({"type": "agent.session.idle", "event_id": "e"})
    with pytest.raises(ValueError):  # noqa: PT011 - json's own error is a ValueError
        parse_session_event("{not json")
