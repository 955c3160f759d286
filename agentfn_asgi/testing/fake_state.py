"""Session state machine of :class:`~agentfn_asgi.testing.FakeAgentsAPI`.

One :class:`FakeSession` per session: turns made of steps of parallel calls, the status flow
``in_progress → requires_action → in_progress → … → idle`` (wire protocol §11), the events
streamed to listeners and the webhooks each status change sends. Every method is synchronous,
so each check-then-update is atomic on the event loop.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

from agentfn_asgi.testing.fake_validation import (
    TOOL_RESULT,
    Rejection,
    answer_approves,
    check_answer,
    normalised_result,
)
from agentfn_asgi.testing.fake_webhooks import WebhookSender

__all__ = [
    "STREAM_CUT",
    "FakeCall",
    "FakeRequest",
    "FakeSession",
    "FakeTurn",
    "SessionHost",
    "StreamItem",
    "Submission",
]

_STATUS_EVENTS = {
    "in_progress": "agent.session.in_progress",
    "requires_action": "agent.session.requires_action",
    "idle": "agent.session.idle",
    "failed": "agent.session.failed",
    # No webhook exists for it (openai 3.63): stream only.
    "budget_reached": "agent.session.budget_reached",
}


class _StreamCut:
    """The type of :data:`STREAM_CUT`."""

    def __repr__(self) -> str:
        return "STREAM_CUT"


#: Put on a listener's queue: its SSE connection is dropped (no ``[DONE]``, no clean end).
STREAM_CUT: Final = _StreamCut()

StreamItem = dict[str, Any] | _StreamCut | None
"""What an SSE listener's queue carries: an event, :data:`STREAM_CUT`, or None (end cleanly)."""


@dataclass(frozen=True, slots=True)
class RawJSON:
    """JSON text the fake puts into a session body exactly as written, for testing what
    a client does with values no encoder would produce (an integer of thousands of digits,
    a lone ``\\ud800`` escape, nesting hundreds of levels deep)."""

    text: str


@dataclass(frozen=True, slots=True)
class FakeCall:
    """One scripted function call: ``name`` with ``arguments``; ``call_id`` is generated
    (``call_…``) unless given. ``arguments`` may be :class:`RawJSON` (served as written)."""

    name: str
    arguments: Mapping[str, Any] | RawJSON = field(default_factory=dict)
    call_id: str | None = None


@dataclass(frozen=True, slots=True)
class FakeRequest:
    """One scripted approval request, pending beside a step's calls: ``request`` is its
    ``request`` object as the API lists it (build one with :meth:`mcp`, :meth:`origin` or
    :meth:`sign_in`); ``request_id`` is generated (``req_…``) unless given. Its answer is
    validated as the API does, and recorded as a :class:`Submission` whose ``call_id`` is
    the request id, ``output`` the ``response`` and ``success`` whether it approved."""

    request: Mapping[str, Any]
    request_id: str | None = None

    @property
    def action_type(self) -> str:
        """``mcp_approval_request`` or ``computer_use_approval_request``."""
        if self.request.get("type") == "mcp_tool_call":
            return "mcp_approval_request"
        return "computer_use_approval_request"

    @classmethod
    def mcp(
        cls,
        server_label: str,
        name: str | None = None,
        arguments: Any = None,
        *,
        message: str = "Allow this tool call?",
        request_id: str | None = None,
    ) -> FakeRequest:
        """An MCP tool call waiting for approval (``arguments`` None: not provided)."""
        request: dict[str, Any] = {
            "type": "mcp_tool_call",
            "server_label": server_label,
            "arguments": arguments,
            "message": message,
        }
        if name is not None:
            request["name"] = name
        return cls(request, request_id)

    @classmethod
    def origin(
        cls, origin: str, *, reason: str | None = None, request_id: str | None = None
    ) -> FakeRequest:
        """A computer-use agent asking to open ``origin`` (``browser_origin_access``)."""
        request: dict[str, Any] = {"type": "browser_origin_access", "origin": origin}
        if reason is not None:
            request["reason"] = reason
        return cls(request, request_id)

    @classmethod
    def sign_in(
        cls,
        fields: Sequence[Mapping[str, Any]] = (
            {"id": "username", "label": "Username", "required": True, "type": "text"},
            {"id": "password", "label": "Password", "required": True, "type": "password"},
        ),
        *,
        credential_origin: str | None = None,
        request_id: str | None = None,
    ) -> FakeRequest:
        """A computer-use agent asking to sign in (``browser_authentication``)."""
        request: dict[str, Any] = {
            "type": "browser_authentication",
            "fields": [dict(f) for f in fields],
            "options": [],
        }
        if credential_origin is not None:
            request["credential_origin"] = credential_origin
        return cls(request, request_id)


@dataclass(frozen=True, slots=True)
class Submission:
    """One ``tool_result`` the fake accepted (``received_at`` from the fake's clock)."""

    session_id: str
    turn_id: str
    call_id: str
    success: bool
    output: Any
    error: str | None
    idempotency_key: str | None
    received_at: float


class SessionHost(Protocol):
    """What a session needs from the fake that owns it (``FakeAgentsAPI``; a protocol, so
    that this module does not import the one that imports it)."""

    webhooks: WebhookSender
    clock: Callable[[], float]
    step_delay: float
    races: set[str]
    submissions: list[Submission]
    duplicate_submissions: list[Submission]

    def notify(self) -> None:
        """Something changed: wake waiters."""


@dataclass(slots=True)
class _Call:
    call_id: str
    turn_id: str
    name: str
    arguments: dict[str, Any] | RawJSON
    state: Literal["waiting", "pending", "answered", "cancelled"] = "waiting"
    result: tuple[bool, str] | None = None
    #: An approval request's ``request`` object (then ``call_id`` is its request id).
    request: dict[str, Any] | None = None

    @property
    def action_type(self) -> str:
        if self.request is None:
            return "function_call"
        return FakeRequest(self.request).action_type

    def action(self) -> dict[str, Any]:
        if self.request is not None:
            return {
                "type": self.action_type,
                "request_id": self.call_id,
                "turn_id": self.turn_id,
                "request": self.request,
            }
        return {
            "type": "function_call",
            "turn_id": self.turn_id,
            "call_id": self.call_id,
            "name": self.name,
            "arguments": self.arguments,
        }


@dataclass(slots=True)
class FakeTurn:
    """One turn of a fake session: its steps (batches of calls) and where it stands."""

    id: str
    session_id: str
    created_at: int
    steps: list[list[_Call]]
    step: int = -1
    status: str = "in_progress"
    completed_at: int | None = None
    #: ``{code, message}`` of a failed turn.
    error: dict[str, str] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "agent.session.turn",
            "agent_id": "agent_fake",
            "session_id": self.session_id,
            "status": self.status,
            "created_at": self.created_at,
            "started_at": self.created_at,
            "completed_at": self.completed_at,
            "error": self.error,
            "usage": None,
        }


class FakeSession:
    """The state of one fake session (internal to the test kit; inspect through the fake)."""

    def __init__(self, host: SessionHost, session_id: str, metadata: dict[str, str]) -> None:
        self.host = host
        self.id = session_id
        self.metadata = metadata
        self.created_at = self.last_active_at = int(host.clock())
        self.status = "idle"
        #: The last failed turn's message (the session's ``error``), until a turn starts.
        self.error: str | None = None
        self.turns: list[FakeTurn] = []
        self.current: FakeTurn | None = None
        self.calls: dict[str, _Call] = {}
        self.tool_names: dict[str, None] = {}
        self.queued_turns: list[list[list[FakeCall | FakeRequest]]] = []
        self.history: list[dict[str, Any]] = []
        self.listeners: set[asyncio.Queue[StreamItem]] = set()
        #: Unlimited, consumption unknown (newer API versions always send the object).
        self.spend_control: dict[str, int | None] = {"limit": None, "consumed": None}
        #: The self-hosted environments the session waits to connect (``environment_connection``
        #: actions, listed after the calls), until they connect.
        self.environment_connections: list[str] = []

    # -- views --------------------------------------------------------------------------------

    def pending_calls(self) -> list[_Call]:
        """Calls of the open step that still wait for a result, in order."""
        turn = self.current
        if turn is None or not 0 <= turn.step < len(turn.steps):
            return []
        return [call for call in turn.steps[turn.step] if call.state == "pending"]

    def required_actions(self) -> list[dict[str, Any]]:
        """``required_actions`` as the API lists them."""
        environments = [
            {"type": "environment_connection", "environment_id": environment_id}
            for environment_id in self.environment_connections
        ]
        return [call.action() for call in self.pending_calls()] + environments

    def require_environment(self, environment_id: str) -> None:
        """See :meth:`FakeAgentsAPI.require_environment`."""
        if environment_id not in self.environment_connections:
            self.environment_connections.append(environment_id)
        self.announce_action("environment_connection")

    def announce_action(self, action_type: str) -> str | None:
        """Send an ``agent.session.action_required`` webhook; its webhook-id (or None)."""
        return self.host.webhooks.emit(
            "agent.session.action_required",
            {"id": self.id, "required_action": {"type": action_type}},
            session_id=self.id,
        )

    def environment_connected(self, environment_id: str) -> bool:
        """The environment connected: its action is no longer listed. False if it was not."""
        if environment_id not in self.environment_connections:
            return False
        self.environment_connections.remove(environment_id)
        return True

    def snapshot(self) -> dict[str, Any]:
        """The full ``AgentSession`` JSON, shaped like the real one (wire protocol §3)."""
        return {
            "id": self.id,
            "object": "agent.session",
            "status": self.status,
            "required_actions": self.required_actions(),
            "agent": {
                "id": "agent_fake",
                "model": "gpt-fake",
                "instructions": None,
                "name": None,
                "multi_agent": {"enabled": False, "max_concurrent_subagents": None},
                "reasoning": {"effort": None, "summary": None},
                "service_tier": "auto",
                "text": {"format": {"type": "text"}, "verbosity": "medium"},
                "tools": [
                    {
                        "type": "function",
                        "name": name,
                        "description": "",
                        "parameters": {"type": "object", "properties": {}},
                        "defer_loading": False,
                    }
                    for name in self.tool_names
                ],
            },
            "environment": {"type": "none"},
            "created_at": self.created_at,
            "last_active_at": self.last_active_at,
            "metadata": dict(self.metadata),
            "error": self.error,
            "usage": None,
            "vault_ids": [],
            "spend_control": dict(self.spend_control),
        }

    # -- transitions --------------------------------------------------------------------------

    def announce_created(self) -> None:
        """Emit ``agent.session.created`` (stream and webhook)."""
        self._emit("agent.session.created", session=self.snapshot())
        self._webhook("agent.session.created")

    def start_turn(self, steps: Sequence[Sequence[FakeCall | FakeRequest]]) -> str:
        """Start a turn running ``steps``; the session must be idle."""
        return self.begin_turn(self.plan_turn(steps))

    def plan_turn(self, steps: Sequence[Sequence[FakeCall | FakeRequest]]) -> FakeTurn:
        """Check ``steps`` and build their turn without changing anything (ValueError)."""
        if self.current is not None:
            raise ValueError(f"session {self.id} already has an active turn")
        turn = FakeTurn("turn_" + secrets.token_hex(12), self.id, int(self.host.clock()), [])
        planned: set[str] = set()
        for step in steps:
            batch = []
            for scripted in step:
                if isinstance(scripted, FakeRequest):
                    label, call_id = "id", scripted.request_id or "req_" + secrets.token_hex(12)
                    call = _Call(call_id, turn.id, "", {}, request=dict(scripted.request))
                else:
                    label, call_id = "call id", scripted.call_id or "call_" + secrets.token_hex(12)
                    arguments = scripted.arguments
                    arguments = arguments if isinstance(arguments, RawJSON) else dict(arguments)
                    call = _Call(call_id, turn.id, scripted.name, arguments)
                if call_id in self.calls or call_id in planned:
                    raise ValueError(f"{label} {call_id} is already used in session {self.id}")
                planned.add(call_id)
                batch.append(call)
            turn.steps.append(batch)
        return turn

    def begin_turn(self, turn: FakeTurn) -> str:
        """Start a turn built by :meth:`plan_turn`; return its id."""
        for batch in turn.steps:
            for call in batch:
                self.calls[call.call_id] = call
                if call.request is None:
                    self.tool_names[call.name] = None
        self.turns.append(turn)
        self.current, self.error = turn, None
        self._emit_turn("agent.session.turn.created", turn)
        self._set_status("in_progress")
        self._open_next_step(turn)
        return turn.id

    def turn(self, turn_id: str) -> FakeTurn | None:
        """The turn of that id, or None."""
        return next((turn for turn in self.turns if turn.id == turn_id), None)

    def cancel_turn(self) -> bool:
        """Cancel the active turn; its calls stop being pending. False if none was active."""
        return self._end_turn("cancelled", None)

    def fail_turn(self, code: str, message: str) -> bool:
        """Fail the active turn (:meth:`FakeAgentsAPI.fail_turn`). False if none was active."""
        return self._end_turn("failed", {"code": code, "message": message})

    def _end_turn(self, status: str, error: dict[str, str] | None) -> bool:
        turn = self.current
        if turn is None:
            return False
        for batch in turn.steps:
            for call in batch:
                if call.state in ("waiting", "pending"):
                    call.state = "cancelled"
        turn.status, turn.error = status, error
        self.error = None if error is None else error["message"]
        turn.completed_at = int(self.host.clock())
        self.current = None
        self._emit_turn(f"agent.session.turn.{status}", turn)
        self._set_status("idle" if error is None else "failed")
        return True

    def pause_on_budget(self, *, limit: int, consumed: int | None = None) -> None:
        """See :meth:`FakeAgentsAPI.pause_on_budget`; pending calls still accept results."""
        spent = limit if consumed is None else consumed
        if spent < limit:
            raise ValueError(f"a session paused on its budget has consumed {limit} or more")
        self.spend_control = {"limit": limit, "consumed": spent}
        self._set_status("budget_reached")

    def submit(self, events: list[dict[str, Any]], idempotency_key: str | None) -> list[Submission]:
        """Check then apply a validated batch atomically; return the results that took effect.

        Raises :class:`Rejection` (nothing applied) for the registration race, a call that is
        not pending (400 "Unknown pending tool call: <id>"), a turn mismatch (400) or a
        different result for an answered call (409).
        """
        plan: list[tuple[dict[str, Any], _Call | None, tuple[bool, str], bool]] = []
        seen: dict[str, tuple[bool, str]] = {}
        for index, event in enumerate(events):
            kind = event["type"]
            approval = kind.endswith("approval_request_result")
            if not approval and kind != TOOL_RESULT:
                plan.append((event, None, (False, ""), False))
                continue
            call_id = event["request_id" if approval else "call_id"]
            call = self.calls.get(call_id)
            if approval:
                if call is None or call.request is None or call.state in ("waiting", "cancelled"):
                    raise Rejection(400, f"Unknown pending approval request: {call_id}")
                result = check_answer(call.request, event, f"events[{index}]")
                conflict = f"Approval request {call_id} already has a different answer."
            else:
                if call_id in self.host.races:
                    self.host.races.discard(call_id)
                    raise Rejection(400, f"Unknown pending tool call: {call_id}")
                result = normalised_result(event)
                if call is None or call.state in ("waiting", "cancelled"):
                    raise Rejection(400, f"Unknown pending tool call: {call_id}")
                if event["turn_id"] != call.turn_id:
                    raise Rejection(
                        400,
                        f"Tool call {call_id} does not belong to turn {event['turn_id']}.",
                        param=f"events[{index}].turn_id",
                    )
                conflict = f"Tool call {call_id} already has a different result."
            previous = seen.get(call_id) or (call.result if call.state == "answered" else None)
            if previous is not None and previous != result:
                raise Rejection(409, conflict, code="conflict_error")
            seen[call_id] = result
            plan.append((event, call, result, previous is not None))

        now = self.host.clock()
        applied: list[Submission] = []
        for event, call, result, duplicate in plan:
            if call is None:
                self._apply_input(event)
                continue
            if call.request is not None:
                output, error = event["response"], None
            else:
                output, error = event.get("output"), event.get("error")
            submission = Submission(
                self.id, call.turn_id, call.call_id, result[0], output, error, idempotency_key, now
            )
            if duplicate:
                self.host.duplicate_submissions.append(submission)
                continue
            call.state = "answered"
            call.result = result
            self.host.submissions.append(submission)
            applied.append(submission)
            self._answered(call, event)
        return applied

    def close_streams(self) -> None:
        """End every open SSE stream of this session."""
        for queue in self.listeners:
            queue.put_nowait(None)

    def cut_streams(self) -> int:
        """Drop every open SSE connection of this session now; return how many."""
        for queue in self.listeners:
            queue.put_nowait(STREAM_CUT)
        return len(self.listeners)

    # -- internals ----------------------------------------------------------------------------

    def _apply_input(self, event: dict[str, Any]) -> None:
        if event["type"] == "agent.session.input.cancel":
            self.cancel_turn()
        elif event["type"] == "agent.session.input.message" and self.current is None:
            # A message on an idle session starts the next scripted turn (or an empty one);
            # during a turn it only steers it, which the fake does not model.
            self.start_turn(self.queued_turns.pop(0) if self.queued_turns else [])

    def _answered(self, call: _Call, event: dict[str, Any]) -> None:
        item_id = "item_" + secrets.token_hex(12)
        item = (
            {
                "type": call.action_type.replace("_request", "_response"),
                "id": item_id,
                "request_id": call.call_id,
                "turn_id": call.turn_id,
                # A sign-in's submitted values are never echoed back.
                "approve": answer_approves(event),
            }
            if call.request is not None
            else {
                "type": "function_call_output",
                "id": item_id,
                "call_id": call.call_id,
                "turn_id": call.turn_id,
                "output": event.get("output"),
                "error": event.get("error"),
                "status": "completed" if event["success"] else "failed",
            }
        )
        self._emit_in_turn("agent.session.turn.item.added", call.turn_id, item=item)
        turn = self.current
        if turn is None or self.pending_calls() or self.status == "budget_reached":
            return  # (a session paused on its budget goes no further)
        # The step is complete: the model "thinks" (step_delay), then asks again or finishes.
        turn.status = "in_progress"
        self._set_status("in_progress")
        try:
            loop = asyncio.get_running_loop() if self.host.step_delay > 0 else None
        except RuntimeError:  # called outside a loop: no timer to wait on
            loop = None
        if loop is not None:
            loop.call_later(self.host.step_delay, self._resume, turn)
        else:
            self._open_next_step(turn)

    def _resume(self, turn: FakeTurn) -> None:
        if self.current is turn:
            self._open_next_step(turn)

    def _open_next_step(self, turn: FakeTurn) -> None:
        turn.step += 1
        if turn.step >= len(turn.steps):
            self._end_turn("completed", None)
            return
        for output_index, call in enumerate(turn.steps[turn.step]):
            call.state = "pending"
            item = {"id": "item_" + secrets.token_hex(12), **call.action(), "status": "completed"}
            self._emit_in_turn(
                "agent.session.turn.item.added", turn.id, item=item, output_index=output_index
            )
        turn.status = "waiting"
        self._set_status("requires_action")

    def _set_status(self, status: str) -> None:
        self.status = status
        self.last_active_at = int(self.host.clock())
        self._emit(_STATUS_EVENTS[status], session=self.snapshot())
        if status == "budget_reached":
            return
        if status == "requires_action":
            pending = self.pending_calls()
            self.announce_action(pending[0].action_type if pending else "function_call")
        else:
            self._webhook(_STATUS_EVENTS[status])

    def _webhook(self, event_type: str) -> None:
        self.host.webhooks.emit(
            event_type, {"id": self.id, "environment_type": "none"}, session_id=self.id
        )

    def _emit_turn(self, event_type: str, turn: FakeTurn) -> None:
        self._emit_in_turn(event_type, turn.id, turn=turn.to_json())

    def _emit_in_turn(self, event_type: str, turn_id: str, **fields: Any) -> None:
        self._emit(event_type, session_id=self.id, turn_id=turn_id, **fields)

    def _emit(self, event_type: str, **fields: Any) -> None:
        event = {"event_id": "event_" + secrets.token_hex(12), "type": event_type, **fields}
        self.history.append(event)
        for queue in self.listeners:
            queue.put_nowait(event)
        self.host.notify()
