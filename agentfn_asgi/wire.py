"""Pydantic models of the Agents API wire format that agentfn-asgi reads and writes.

Every model is tolerant: unknown fields are kept (``extra="allow"``), and an unknown
``required_actions`` type or streamed event type becomes a generic model instead of a parse
failure, because the beta API grows new members without notice (wire protocol §3.1, §5.2).
Fields the middleware does not need are left loose (``dict[str, Any]``) so parsing a session,
which sits on the hot path of every webhook, stays cheap.

Sources: wire protocol §3 (session), §4 (input events), §5 (stream), §8.1 (webhooks),
§8.5 (webhook endpoints), §10.1 (error body).
"""

from __future__ import annotations

import logging
import re
from typing import Annotated, Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter, ValidationError

from ._lenient import LenientJSONError, Unreadable, find_unreadable, lenient_loads

__all__ = [
    "AGENT_WEBHOOK_EVENT_TYPES",
    "ENVIRONMENT_PREFIX",
    "INPUT_EVENT_TYPES",
    "REQUEST_NAME_PREFIXES",
    "SESSION_BUDGET_REACHED",
    "UNKNOWN_PREFIX",
    "WEBHOOK_EVENT_TYPES",
    "APIErrorDetail",
    "ActionRequiredWebhookData",
    "AgentSession",
    "ComputerUseApprovalRequestAction",
    "ContentPart",
    "EnvironmentConnectionAction",
    "EnvironmentWebhookData",
    "ErrorBody",
    "FunctionCallAction",
    "GenericAction",
    "InputImagePart",
    "InputTextPart",
    "MCPApprovalRequestAction",
    "RequiredAction",
    "RequiredActionRef",
    "SessionList",
    "SessionListItem",
    "SessionTurn",
    "SessionWebhookData",
    "SpendControl",
    "ToolResultEvent",
    "TurnError",
    "WebhookEndpoint",
    "WebhookEndpointDeleted",
    "WebhookEndpointList",
    "WebhookEndpointTestResult",
    "WebhookEndpointWithSecret",
    "WebhookEvent",
    "WebhookEventTypeList",
    "WireModel",
    "parse_session",
    "parse_webhook_event",
    "turn_error_reason",
]

#: ``type`` values of ``POST /agents/sessions/{id}/events`` input events (wire protocol §4).
INPUT_EVENT_TYPES: frozenset[str] = frozenset(
    {
        "agent.session.input.tool_result",
        "agent.session.input.message",
        "agent.session.input.cancel",
        "agent.session.input.mcp_approval_request_result",
        "agent.session.input.computer_use_approval_request_result",
    }
)

#: Every webhook event type the management API takes (``event_types`` of an endpoint,
#: ``event_type`` of a test), as the official SDK lists them (openai 3.63);
#: ``GET /webhook_event_types`` is the live list of a project.
WEBHOOK_EVENT_TYPES: tuple[str, ...] = (
    "health.alert.triggered",
    "health.alert.resolved",
    "batch.completed",
    "batch.failed",
    "batch.expired",
    "batch.cancelled",
    "response.completed",
    "response.failed",
    "response.cancelled",
    "response.incomplete",
    "eval.run.succeeded",
    "eval.run.failed",
    "eval.run.canceled",
    "fine_tuning.job.succeeded",
    "fine_tuning.job.failed",
    "fine_tuning.job.cancelled",
    "realtime.call.incoming",
    "video.completed",
    "video.failed",
    "agent.environment.ready",
    "agent.environment.failed",
    "agent.environment.suspended",
    "agent.environment.expired",
    "agent.session.created",
    "agent.session.action_required",
    "agent.session.in_progress",
    "agent.session.idle",
    "agent.session.failed",
    "safety.alert.created",
)

#: Subscribable ``agent.*`` webhook event types (wire protocol §8.5).
AGENT_WEBHOOK_EVENT_TYPES: frozenset[str] = frozenset(
    kind for kind in WEBHOOK_EVENT_TYPES if kind.startswith("agent.")
)

_logger = logging.getLogger("agentfn_asgi.wire")

#: What a session id may look like (``sess_...``); it is used in request paths.
SESSION_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,256}")


class WireModel(BaseModel):
    """Base of every wire model: keeps unknown fields, immutable once parsed."""

    model_config = ConfigDict(extra="allow", frozen=True)


# ---------------------------------------------------------------------------------------------
# Required actions (wire protocol §3.1)


class FunctionCallAction(WireModel):
    """A pending function call: run ``name`` with ``arguments`` and submit a ``tool_result``.

    It has no id of its own; it is keyed by ``(turn_id, call_id)``. ``arguments`` is normally
    a decoded JSON object, but a JSON string is tolerated (the tool layer decodes it).
    """

    type: Literal["function_call"] = "function_call"
    turn_id: str
    call_id: str
    name: str
    arguments: Any = None
    #: Set by :func:`parse_session` (never sent by the API) when these arguments could not
    #: be read (nested too deeply, a number too large, a lone surrogate...): the call is
    #: answered with a failure saying why, and its sibling calls are answered as usual.
    unreadable: str | None = Field(default=None, exclude=True)
    #: Set (never sent by the API) when this value stands for an approval request seen as a
    #: call (:attr:`AgentSession.calls`): the request's action type. ``call_id`` is then its
    #: ``request_id``, ``name`` its :data:`REQUEST_NAME_PREFIXES` name and ``arguments`` the
    #: whole ``request`` object (what a person approves, and what an approval is bound to).
    request_type: str | None = Field(default=None, exclude=True)


#: The names of approval requests seen as calls, by prefix: a function's name never holds a
#: colon (the API allows ``[A-Za-z0-9_-]``), so these never meet a tool's name.
#: ``mcp:{server_label}/{name}`` (``/{name}`` when the request names its tool),
#: ``computer_use:{origin}`` (origin access) and ``sign_in:{credential_origin}``.
REQUEST_NAME_PREFIXES: tuple[str, ...] = ("mcp:", "computer_use:", "sign_in:")
#: The recorded name (and call id) of an ``environment_connection``, by environment id
#: (:attr:`AgentSession.turnless_calls`).
ENVIRONMENT_PREFIX: Final = "environment:"
#: The recorded name (and call id) of an action of a type this version does not know.
UNKNOWN_PREFIX: Final = "action:"


class EnvironmentConnectionAction(WireModel):
    """Reconnect a self-hosted environment (not handled by agentfn-asgi)."""

    type: Literal["environment_connection"] = "environment_connection"
    environment_id: str


class MCPApprovalRequestAction(WireModel):
    """Approve, deny or cancel an MCP tool call: ``request`` is ``{type: "mcp_tool_call",
    server_label, name?, arguments (may be null), message}``."""

    type: Literal["mcp_approval_request"] = "mcp_approval_request"
    request_id: str
    turn_id: str
    request: dict[str, Any] = Field(default_factory=dict)

    def as_call(self) -> FunctionCallAction:
        """This request as the call the dispatcher answers (``mcp:{label}/{name}``)."""
        label = _text(self.request.get("server_label"))
        name = self.request.get("name")
        suffix = f"/{name}" if isinstance(name, str) and name else ""
        return _request_call(self, f"mcp:{label}{suffix}")


class ComputerUseApprovalRequestAction(WireModel):
    """Respond to a computer-use request: ``request`` is ``browser_origin_access {origin,
    reason?}`` or ``browser_authentication {credential_origin?, fields, options, reason?}``."""

    type: Literal["computer_use_approval_request"] = "computer_use_approval_request"
    request_id: str
    turn_id: str
    request: dict[str, Any] = Field(default_factory=dict)

    def as_call(self) -> FunctionCallAction:
        """This request as the call the dispatcher answers: ``computer_use:{origin}`` for
        origin access, ``sign_in:{credential_origin}`` for a sign-in."""
        if self.request.get("type") == "browser_authentication":
            return _request_call(self, "sign_in:" + _text(self.request.get("credential_origin")))
        return _request_call(self, "computer_use:" + _text(self.request.get("origin")))


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _request_call(
    action: MCPApprovalRequestAction | ComputerUseApprovalRequestAction, name: str
) -> FunctionCallAction:
    return FunctionCallAction(
        turn_id=action.turn_id,
        call_id=action.request_id,
        name=name,
        arguments=action.request,
        request_type=action.type,
    )


class GenericAction(WireModel):
    """Any required action of a type this version does not know; extra fields are kept."""

    type: str


_KNOWN_ACTION_TYPES = frozenset(
    {
        "function_call",
        "environment_connection",
        "mcp_approval_request",
        "computer_use_approval_request",
    }
)


def _action_tag(value: Any) -> str:
    # A callable discriminator sends unknown types to GenericAction in one dict lookup,
    # instead of trying every union member (which would be slow and error-prone).
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return kind if kind in _KNOWN_ACTION_TYPES else "generic"


RequiredAction = Annotated[
    Annotated[FunctionCallAction, Tag("function_call")]
    | Annotated[EnvironmentConnectionAction, Tag("environment_connection")]
    | Annotated[MCPApprovalRequestAction, Tag("mcp_approval_request")]
    | Annotated[ComputerUseApprovalRequestAction, Tag("computer_use_approval_request")]
    | Annotated[GenericAction, Tag("generic")],
    Discriminator(_action_tag),
]
"""One entry of ``AgentSession.required_actions``; unknown types parse as :class:`GenericAction`."""


# ---------------------------------------------------------------------------------------------
# Session (wire protocol §3)


#: The session status of a session paused on its spending limit (openai 3.63).
SESSION_BUDGET_REACHED = "budget_reached"


class SpendControl(WireModel):
    """A session's spending limit (openai 3.63): ``limit`` and ``consumed`` in USD cents;
    ``limit`` None means no limit. A session whose ``consumed`` reached its ``limit`` is
    paused (status ``budget_reached``)."""

    limit: int | None = None
    consumed: int | None = None

    @property
    def reached(self) -> bool:
        """Has the session spent its whole limit?"""
        return self.limit is not None and (self.consumed or 0) >= self.limit


class AgentSession(WireModel):
    """A managed agent session as returned by ``GET /agents/sessions/{id}``.

    ``required_actions`` is the authority on what is still owed. ``status`` stays a plain
    string so a new status value never breaks parsing (openai 3.63 added
    ``budget_reached``: paused on its ``spend_control`` limit). ``agent``, ``environment``
    and ``usage`` are kept as raw dicts: the middleware does not read them.
    """

    id: str
    object: str = "agent.session"
    status: str
    required_actions: list[RequiredAction] = Field(default_factory=list)
    error: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    created_at: int | None = None
    last_active_at: int | None = None
    agent: dict[str, Any] | None = None
    environment: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    vault_ids: list[str] = Field(default_factory=list)
    spend_control: SpendControl | None = None

    @property
    def budget_reached(self) -> bool:
        """Is the session paused because its spending limit was reached?"""
        return self.status == SESSION_BUDGET_REACHED

    @property
    def function_calls(self) -> list[FunctionCallAction]:
        """The pending ``function_call`` actions, in the order the API listed them."""
        return [a for a in self.required_actions if isinstance(a, FunctionCallAction)]

    @property
    def calls(self) -> list[FunctionCallAction]:
        """What the dispatcher answers, in the order the API listed them: the function calls,
        and the MCP and computer-use approval requests seen as calls (keyed by
        ``(turn_id, request_id)``, see :attr:`FunctionCallAction.request_type`)."""
        calls: list[FunctionCallAction] = []
        for action in self.required_actions:
            if isinstance(action, FunctionCallAction):
                calls.append(action)
            elif isinstance(action, MCPApprovalRequestAction | ComputerUseApprovalRequestAction):
                calls.append(action.as_call())
        return calls

    @property
    def turnless_calls(self) -> list[FunctionCallAction]:
        """The pending actions that belong to no turn, seen as calls keyed with turn ``""``:
        each ``environment_connection`` as ``environment:{environment_id}`` (its
        ``arguments`` the session's ``environment``), and each action of a type this version
        does not know as ``action:{type}`` (once per type). ``request_type`` is the action's
        type."""
        calls: dict[str, FunctionCallAction] = {}
        for action in self.required_actions:
            if isinstance(action, EnvironmentConnectionAction):
                name = ENVIRONMENT_PREFIX + action.environment_id
                arguments: Any = self.environment or {}
            elif isinstance(action, GenericAction):
                name, arguments = UNKNOWN_PREFIX + action.type, {}
            else:
                continue
            calls.setdefault(
                name,
                FunctionCallAction(
                    turn_id="",
                    call_id=name,
                    name=name,
                    arguments=arguments,
                    request_type=action.type,
                ),
            )
        return list(calls.values())

    def pending_call(self, turn_id: str, call_id: str) -> FunctionCallAction | None:
        """The pending ``function_call`` (or approval request, by its ``request_id``; or
        turn-less action, turn ``""``, :attr:`turnless_calls`) of that turn and id, or None
        when the session no longer waits for it."""
        for action in self.calls if turn_id else self.turnless_calls:
            if action.turn_id == turn_id and action.call_id == call_id:
                return action
        return None


#: What a turn's error ``code`` (openai 3.63 ``session_turn_error``) means, for the people
#: who read why a call was cancelled: the page, the CLI, the log and the span.
_TURN_ERROR_REASONS = {
    "session_budget_exceeded": "the session reached its spending limit",
    "usage_limit_exceeded": "a usage limit was reached",
    "project_spend_limit_exceeded": "the project reached its spending limit",
    "organization_spend_limit_exceeded": "the organization reached its spending limit",
    "credit_balance_exhausted": "the credit balance is exhausted",
    "billing_not_active": "billing is not active",
    "sandbox_error": "the sandbox failed",
    "context_length_exceeded": "the conversation exceeded the model's context length",
    "max_output_tokens": "the model reached its output token limit",
    "resource_not_found": "a resource the turn needed was not found",
}


def turn_error_reason(code: str | None) -> str:
    """Why a turn failed, for the people who read why its calls were cancelled: its error
    ``code`` (printable characters only, at most 64) and, for a code openai 3.63 documents,
    what it means: ``"the turn failed (session_budget_exceeded: the session reached its
    spending limit)"``; ``"the turn failed"`` without a code."""
    if not code:
        return "the turn failed"
    shown = "".join(c for c in code[:64] if c.isprintable())
    meaning = _TURN_ERROR_REASONS.get(code)
    return f"the turn failed ({shown}: {meaning})" if meaning else f"the turn failed ({shown})"


class SessionListItem(WireModel):
    """One session of ``GET /agents/sessions``, as far as a listener reads it: its id and
    status (a follower re-reads the session itself before acting)."""

    id: str
    status: str
    created_at: int | None = None
    last_active_at: int | None = None
    spend_control: SpendControl | None = None


class SessionList(WireModel):
    """A page of ``GET /agents/sessions`` (``data`` in the order asked for, ``has_more``)."""

    data: list[SessionListItem] = Field(default_factory=list)
    has_more: bool = False


class TurnError(WireModel):
    """Why a turn failed: ``code`` from a closed list (``session_budget_exceeded``,
    ``rate_limit_exceeded``, ``internal_error``...) and a message."""

    code: str | None = None
    message: str = ""


class SessionTurn(WireModel):
    """``GET /agents/sessions/{id}/turns/{turn_id}``, as far as the app reads it: how the
    turn stands (``queued``, ``in_progress``, ``waiting``, ``completed``, ``failed``,
    ``cancelled``; a plain string, so a new status never breaks parsing) and its error."""

    id: str
    status: str
    error: TurnError | None = None


# ---------------------------------------------------------------------------------------------
# Input events (wire protocol §4)


class InputTextPart(WireModel):
    """A text content part of a tool result: ``{"type": "input_text", "text": ...}``."""

    type: Literal["input_text"] = "input_text"
    text: str


class InputImagePart(WireModel):
    """An image content part: ``{"type": "input_image", "image_url": ...}`` (URL or data URL)."""

    type: Literal["input_image"] = "input_image"
    image_url: str


ContentPart = Annotated[InputTextPart | InputImagePart, Field(discriminator="type")]
"""A content part of a ``tool_result`` output array."""


class ToolResultEvent(WireModel):
    """``agent.session.input.tool_result``: the answer to one pending function call.

    ``success`` with ``output`` (a string or content parts); or ``success=False`` with an
    ``error`` message the model can act on. Serialise with
    ``model_dump(mode="json")``; ``name`` is never sent.
    """

    type: Literal["agent.session.input.tool_result"] = "agent.session.input.tool_result"
    turn_id: str
    call_id: str
    success: bool
    output: str | list[ContentPart] | None = None
    error: str | None = None


# ---------------------------------------------------------------------------------------------
# Errors (wire protocol §10.1)


class APIErrorDetail(WireModel):
    """The ``error`` object of an error response or of a streamed ``error`` event."""

    message: str = ""
    type: str | None = None
    param: str | None = None
    code: str | None = None


class ErrorBody(WireModel):
    """An error response body: ``{"error": {"message", "type", "param", "code"}}``."""

    error: APIErrorDetail


# ---------------------------------------------------------------------------------------------
# Webhooks (wire protocol §8.1)


class RequiredActionRef(WireModel):
    """The ``required_action`` of an ``action_required`` webhook: the type only."""

    type: str


class SessionWebhookData(WireModel):
    """``data`` of ``agent.session.created/in_progress/idle/failed`` webhooks."""

    id: str
    environment_type: str | None = None
    environment_id: str | None = None


class ActionRequiredWebhookData(WireModel):
    """``data`` of ``agent.session.action_required``: the session id and one action type."""

    id: str
    required_action: RequiredActionRef


class EnvironmentWebhookData(WireModel):
    """``data`` of ``agent.environment.*`` webhooks: the environment id."""

    id: str


class WebhookEvent(WireModel):
    """The webhook envelope ``{id, object: "event", created_at, type, data}``.

    ``data`` stays a dict so that any event type parses; :meth:`typed_data` gives the
    model of a known ``agent.*`` type. The body's ``id`` (``evt_…``) differs from the
    ``webhook-id`` header, which is the delivery's idempotency key.
    """

    id: str
    object: str = "event"
    created_at: int
    type: str
    data: dict[str, Any] = Field(default_factory=dict)

    @property
    def session_id(self) -> str | None:
        """The session id of an ``agent.session.*`` event (``data.id``), else None.

        Only ids made of letters, digits, ``_`` and ``-`` (at most 256) count: the id becomes
        part of a request path, so anything else (``/``, ``..``, ``?``, ``#``) is refused
        here, before it is recorded.
        """
        if not self.type.startswith("agent.session."):
            return None
        value = self.data.get("id")
        if isinstance(value, str) and SESSION_ID_RE.fullmatch(value):
            return value
        return None

    @property
    def required_action_type(self) -> str | None:
        """``data.required_action.type`` of an ``action_required`` event, else None."""
        action = self.data.get("required_action")
        if isinstance(action, dict):
            kind = action.get("type")
            if isinstance(kind, str):
                return kind
        return None

    def typed_data(
        self,
    ) -> ActionRequiredWebhookData | SessionWebhookData | EnvironmentWebhookData | None:
        """Validate ``data`` against the model of this event type; None for other types.

        Raises pydantic's ``ValidationError`` (a ``ValueError``) if a known type's data is
        malformed.
        """
        if self.type == "agent.session.action_required":
            return ActionRequiredWebhookData.model_validate(self.data)
        if self.type.startswith("agent.session."):
            return SessionWebhookData.model_validate(self.data)
        if self.type.startswith("agent.environment."):
            return EnvironmentWebhookData.model_validate(self.data)
        return None


# ---------------------------------------------------------------------------------------------
# Webhook endpoints (wire protocol §8.5)


class WebhookEndpoint(WireModel):
    """A webhook endpoint of the project (``GET /webhook_endpoints/{id}``).

    ``event_types`` stays a list of plain strings: the API adds event types without notice.
    The signing secret itself is never here (see :class:`WebhookEndpointWithSecret`);
    ``signing_secret_hint`` is a masked hint of it.
    """

    id: str
    object: str = "webhook_endpoint"
    created_at: int
    event_types: list[str] = Field(default_factory=list)
    name: str
    url: str
    signing_secret_hint: str | None = None
    updated_at: int | None = None


class WebhookEndpointWithSecret(WebhookEndpoint):
    """The answer to creating an endpoint or rotating its secret: the only time the API
    shows ``signing_secret`` (a ``whsec_`` secret); the repr hides it."""

    signing_secret: str = Field(repr=False)


class WebhookEndpointList(WireModel):
    """A page of ``GET /webhook_endpoints``; ``last_id`` is the ``after`` of the next page."""

    object: str = "list"
    data: list[WebhookEndpoint] = Field(default_factory=list)
    first_id: str | None = None
    last_id: str | None = None
    has_more: bool = False


class WebhookEndpointDeleted(WireModel):
    """The answer to ``DELETE /webhook_endpoints/{id}``."""

    id: str
    object: str = "webhook_endpoint.deleted"
    deleted: bool


class WebhookEndpointTestResult(WireModel):
    """The answer to ``POST /webhook_endpoints/{id}/test``: ``status_code`` is what the
    endpoint answered the sample (``success`` is always true; it says the test ran)."""

    object: str = "webhook_endpoint.test"
    event_type: str
    status_code: int
    success: bool = True
    webhook_endpoint_id: str


class WebhookEventTypeList(WireModel):
    """``GET /webhook_event_types``: the event types the project can subscribe to."""

    object: str = "list"
    data: list[str] = Field(default_factory=list)


_ACTION_ADAPTER: TypeAdapter[Any] = TypeAdapter(RequiredAction)


def parse_session(body: bytes) -> AgentSession:
    """Parse a ``GET /agents/sessions/{id}`` body, tolerating one strange action.

    The fast path is one pydantic parse. If it refuses the body (a call's arguments nested
    hundreds of levels deep, an integer of thousands of digits, a lone surrogate escape...),
    the body is read again leniently: a function call whose arguments cannot be read keeps
    its ids with ``unreadable`` set, an action that cannot be validated at all is dropped
    (logged), and the other actions are parsed as usual. Raises ``ValueError`` when the body
    is not a session at all.
    """
    try:
        return AgentSession.model_validate_json(body)
    except ValidationError as refused:
        data = _lenient_document(body, refused)
    raw_actions = data.pop("required_actions", [])
    session = AgentSession.model_validate(_without_unreadable(data))
    actions: list[Any] = []
    for index, item in enumerate(raw_actions if isinstance(raw_actions, list) else []):
        if isinstance(item, dict) and item.get("type") == "function_call":
            bad = find_unreadable(item.get("arguments"))
            if bad is not None:
                item = {**item, "arguments": None, "unreadable": bad.reason}
        try:
            actions.append(_ACTION_ADAPTER.validate_python(_without_unreadable(item)))
        except ValidationError as exc:
            _logger.warning(
                "session %s: required action %d cannot be read and is skipped: %s",
                session.id,
                index,
                exc.errors(include_url=False, include_input=False)[:3],
            )
    return session.model_copy(update={"required_actions": actions})


def _lenient_document(body: bytes, refused: ValidationError) -> dict[str, Any]:
    try:
        data = lenient_loads(body)
    except LenientJSONError as exc:
        raise ValueError(f"malformed session body: {exc}") from refused
    if not isinstance(data, dict):
        raise ValueError("malformed session body: not a JSON object") from refused
    return data


def _without_unreadable(value: Any) -> Any:
    """``value`` with every Unreadable marker replaced by None (outside function arguments,
    strange values are not ours to judge)."""
    if isinstance(value, Unreadable):
        return None
    if isinstance(value, dict):
        return {key: _without_unreadable(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_without_unreadable(item) for item in value]
    return value


def parse_webhook_event(body: bytes) -> WebhookEvent:
    """Parse a webhook body (the raw bytes that were verified).

    The body is authentic, and refusing it loses the delivery (the sender retries the same
    bytes for days), so only what the app acts on must be right: a JSON object with a string
    ``type`` and an object ``data``. An envelope whose other fields are odd (``id`` or
    ``created_at`` missing or of another type, a field of ``data`` nested too deeply or
    holding a lone surrogate) is read for ``type`` and ``data.id`` alone. Raises
    ``ValueError`` for anything else, including bytes that are not UTF-8.
    """
    try:
        return WebhookEvent.model_validate_json(body)
    except ValidationError:
        pass
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError("the webhook body is not UTF-8") from exc
    document = lenient_loads(body)  # LenientJSONError (a ValueError): not JSON at all
    if not isinstance(document, dict):
        raise ValueError("the webhook body is not a JSON object")
    event_type, data = document.get("type"), document.get("data")
    if not isinstance(event_type, str) or not isinstance(data, dict):
        raise ValueError("the webhook body has no string 'type' and object 'data'")
    event_id, created_at, session_id = (
        document.get("id"),
        document.get("created_at"),
        data.get("id"),
    )
    return WebhookEvent.model_construct(
        id=event_id if isinstance(event_id, str) else "",
        created_at=created_at if type(created_at) is int else 0,
        type=event_type,
        data={"id": session_id} if isinstance(session_id, str) else {},
    )
