"""Streamed session events (``GET /agents/sessions/{id}/events``, wire protocol §5.2).

Models as tolerant as :mod:`agentfn_asgi.wire`'s: unknown fields are kept, and an event type
this version does not model parses as :class:`GenericSessionEvent`. The stream's transport
(SSE decoding) is :mod:`agentfn_asgi._sse`; following sessions with it,
:mod:`agentfn_asgi.stream`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from pydantic import Discriminator, Tag, TypeAdapter

from .wire import AgentSession, APIErrorDetail, WireModel

__all__ = [
    "ErrorEvent",
    "GenericSessionEvent",
    "SessionBudgetReachedEvent",
    "SessionCreatedEvent",
    "SessionEvent",
    "SessionFailedEvent",
    "SessionIdleEvent",
    "SessionInProgressEvent",
    "SessionRequiresActionEvent",
    "SessionStatusEvent",
    "Turn",
    "TurnCancelledEvent",
    "TurnCompletedEvent",
    "TurnCreatedEvent",
    "TurnEvent",
    "TurnFailedEvent",
    "TurnInProgressEvent",
    "TurnItemAddedEvent",
    "TurnItemDoneEvent",
    "UnreadableEvent",
    "parse_session_event",
]


class Turn(WireModel):
    """A session turn (``agent.session.turn``); ``status`` is kept as a plain string."""

    id: str
    object: str = "agent.session.turn"
    session_id: str | None = None
    status: str
    created_at: int | None = None
    started_at: int | None = None
    completed_at: int | None = None
    error: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    #: Set on a subagent's turn; the root turn has none.
    subagent_id: str | None = None


class _EventBase(WireModel):
    event_id: str
    obfuscation: str | None = None


class _SessionSnapshotEvent(_EventBase):
    session: AgentSession


class SessionCreatedEvent(_SessionSnapshotEvent):
    """``agent.session.created`` with a session snapshot."""

    type: Literal["agent.session.created"] = "agent.session.created"


class SessionInProgressEvent(_SessionSnapshotEvent):
    """``agent.session.in_progress`` with a session snapshot."""

    type: Literal["agent.session.in_progress"] = "agent.session.in_progress"


class SessionRequiresActionEvent(_SessionSnapshotEvent):
    """``agent.session.requires_action``: ``session.required_actions`` lists what is owed."""

    type: Literal["agent.session.requires_action"] = "agent.session.requires_action"


class SessionIdleEvent(_SessionSnapshotEvent):
    """``agent.session.idle`` with a session snapshot."""

    type: Literal["agent.session.idle"] = "agent.session.idle"


class SessionFailedEvent(_SessionSnapshotEvent):
    """``agent.session.failed`` with a session snapshot."""

    type: Literal["agent.session.failed"] = "agent.session.failed"


class SessionBudgetReachedEvent(_SessionSnapshotEvent):
    """``agent.session.budget_reached`` (openai 3.63): the session is paused because its
    spending limit was reached (``session.spend_control``). There is no webhook for it."""

    type: Literal["agent.session.budget_reached"] = "agent.session.budget_reached"


SessionStatusEvent = (
    SessionCreatedEvent
    | SessionInProgressEvent
    | SessionRequiresActionEvent
    | SessionIdleEvent
    | SessionFailedEvent
    | SessionBudgetReachedEvent
)
"""The session-level events, each carrying a full session snapshot."""


class _TurnEventBase(_EventBase):
    session_id: str
    turn_id: str
    turn: Turn


class TurnCreatedEvent(_TurnEventBase):
    """``agent.session.turn.created``."""

    type: Literal["agent.session.turn.created"] = "agent.session.turn.created"


class TurnInProgressEvent(_TurnEventBase):
    """``agent.session.turn.in_progress``."""

    type: Literal["agent.session.turn.in_progress"] = "agent.session.turn.in_progress"


class _TurnEndEventBase(_TurnEventBase):
    usage: dict[str, Any] | None = None


class TurnCompletedEvent(_TurnEndEventBase):
    """``agent.session.turn.completed``."""

    type: Literal["agent.session.turn.completed"] = "agent.session.turn.completed"


class TurnFailedEvent(_TurnEndEventBase):
    """``agent.session.turn.failed``."""

    type: Literal["agent.session.turn.failed"] = "agent.session.turn.failed"


class TurnCancelledEvent(_TurnEndEventBase):
    """``agent.session.turn.cancelled``: its pending calls are no longer owed."""

    type: Literal["agent.session.turn.cancelled"] = "agent.session.turn.cancelled"


TurnEvent = (
    TurnCreatedEvent
    | TurnInProgressEvent
    | TurnCompletedEvent
    | TurnFailedEvent
    | TurnCancelledEvent
)
"""The turn lifecycle events."""


class _TurnItemEventBase(_EventBase):
    session_id: str
    turn_id: str | None = None
    item: dict[str, Any]
    output_index: int | None = None


class TurnItemAddedEvent(_TurnItemEventBase):
    """``agent.session.turn.item.added``; a ``function_call`` item does not prove it is pending."""

    type: Literal["agent.session.turn.item.added"] = "agent.session.turn.item.added"


class TurnItemDoneEvent(_TurnItemEventBase):
    """``agent.session.turn.item.done``."""

    type: Literal["agent.session.turn.item.done"] = "agent.session.turn.item.done"


class ErrorEvent(_EventBase):
    """A streamed ``error`` event: ``error`` carries ``code``, ``message``, ``param``, ``type``."""

    type: Literal["error"] = "error"
    error: APIErrorDetail
    session_id: str | None = None


class GenericSessionEvent(WireModel):
    """Any streamed event of a type this version does not model; extra fields are kept."""

    type: str
    event_id: str | None = None
    obfuscation: str | None = None


@dataclass(frozen=True, slots=True)
class UnreadableEvent:
    """Stands for a streamed event that could not be parsed (not JSON, nested too deeply for
    the parser, a known type with missing fields...), where a follower must not stop.

    :meth:`EventStream.tolerant <agentfn_asgi._sse.EventStream.tolerant>` yields it in the
    event's place. Nothing of the event is kept (it may quote model-written arguments):
    ``reason`` says what was wrong, ``size`` how many characters its data had. Whatever it
    announced is unknown, so the follower re-reads the session. ``event_id`` is always None
    (an unreadable event is never taken for a repeat).
    """

    reason: str
    size: int
    type: Literal["unreadable"] = "unreadable"
    event_id: None = None


_EVENT_TYPES: frozenset[str] = frozenset(
    cls.model_fields["type"].default
    for events in (
        SessionStatusEvent,
        TurnEvent,
        TurnItemAddedEvent | TurnItemDoneEvent | ErrorEvent,
    )
    for cls in get_args(events)
)


def _event_tag(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in _EVENT_TYPES else "generic"


SessionEvent = Annotated[
    Annotated[SessionCreatedEvent, Tag("agent.session.created")]
    | Annotated[SessionInProgressEvent, Tag("agent.session.in_progress")]
    | Annotated[SessionRequiresActionEvent, Tag("agent.session.requires_action")]
    | Annotated[SessionIdleEvent, Tag("agent.session.idle")]
    | Annotated[SessionFailedEvent, Tag("agent.session.failed")]
    | Annotated[SessionBudgetReachedEvent, Tag("agent.session.budget_reached")]
    | Annotated[TurnCreatedEvent, Tag("agent.session.turn.created")]
    | Annotated[TurnInProgressEvent, Tag("agent.session.turn.in_progress")]
    | Annotated[TurnCompletedEvent, Tag("agent.session.turn.completed")]
    | Annotated[TurnFailedEvent, Tag("agent.session.turn.failed")]
    | Annotated[TurnCancelledEvent, Tag("agent.session.turn.cancelled")]
    | Annotated[TurnItemAddedEvent, Tag("agent.session.turn.item.added")]
    | Annotated[TurnItemDoneEvent, Tag("agent.session.turn.item.done")]
    | Annotated[ErrorEvent, Tag("error")]
    | Annotated[GenericSessionEvent, Tag("generic")],
    Discriminator(_event_tag),
]
"""A streamed session event; unknown types parse as :class:`GenericSessionEvent`."""

_SESSION_EVENT_ADAPTER: TypeAdapter[SessionEvent] = TypeAdapter(SessionEvent)


def parse_session_event(obj: dict[str, Any] | str | bytes) -> SessionEvent:
    """Parse one streamed event (a decoded ``data:`` object, or its JSON text).

    Unknown ``type`` values give :class:`GenericSessionEvent`. A known type with missing or
    mistyped fields, or input that is not a JSON object with a string ``type``, raises
    ``ValueError`` (pydantic's ``ValidationError`` is one): a malformed event is a bug to
    surface, not something to guess around.
    """
    if isinstance(obj, str | bytes):
        decoded = json.loads(obj)
        if not isinstance(decoded, dict):
            raise ValueError("a session event must be a JSON object")
        obj = decoded
    return _SESSION_EVENT_ADAPTER.validate_python(obj)
