"""The session's pending actions beyond function calls, and the host's policy for them.

A session's ``required_actions`` holds four kinds of action, all announced by the same
``agent.session.action_required`` webhook: ``function_call`` (answered by a tool),
``mcp_approval_request`` and ``computer_use_approval_request`` (answered here, by the
policy given as ``AgentWebhookApp(actions=...)``, or by a person it asks), and
``environment_connection`` (the host's ``connect_environment=`` hook starts or wakes the
environment; without one it is left alone, and shown).

An action nobody here answers is recorded ``unanswered`` (shown with its age by ``calls``,
``status`` and the operator page) and left to whoever answers it.

An ``environment_connection`` carries only its ``environment_id``, so it is keyed
``(session, "", "environment:{environment_id}")`` and has *occurrences*: one runs from
the first read that lists it to the first read that no longer does (the environment
connected), which retires the record (a webhook's read, by a replica that saw it listed;
any settling read); the next occurrence runs the hook again. An action
type this version does not know is keyed ``(session, "", "action:{type}")`` the same way.

An approval request is a call like any other (:attr:`agentfn_asgi.wire.AgentSession.calls`):
keyed by ``(session, turn, request_id)``, named ``mcp:{server_label}/{name}``,
``computer_use:{origin}`` or ``sign_in:{credential_origin}`` (a function's name never holds
a colon), and its answer is saved before it is submitted, under a stable idempotency key,
exactly as a tool's result. So it is answered once, across retries, restarts and replicas.

The policy is a plain callable (sync or async) over a typed request value
(:class:`MCPRequest`, :class:`OriginRequest`, :class:`SignInRequest`) that returns one of
:data:`DECISIONS`; :class:`ActionRules` is the declarative form of the common case.

This module sits on :mod:`agentfn_asgi.wire` only.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Literal, TypeAlias
from urllib.parse import urlsplit

from .wire import ENVIRONMENT_PREFIX, UNKNOWN_PREFIX, FunctionCallAction

__all__ = [
    "DECISIONS",
    "ActionPolicy",
    "ActionRequest",
    "ActionRules",
    "ConnectEnvironmentHook",
    "Decision",
    "EnvironmentConnection",
    "MCPRequest",
    "OriginRequest",
    "SignIn",
    "SignInHook",
    "SignInRequest",
    "action_fields",
    "action_kind",
    "answer_event",
    "connect_environment",
    "decide",
    "origin_matches",
    "request_of",
    "sign_in_answer",
]

Decision: TypeAlias = Literal["approve", "deny", "cancel", "ask", "leave"]
"""What the policy answers a request: ``approve``, ``deny`` or ``cancel`` it now (``cancel``
dismisses the request without ending the turn), ``ask`` a person (the durable approval of
``approval=`` tools: the ``approvals`` CLI, the operator page, signed links and
``on_approval_request``), or ``leave`` it to someone else (the host's own front end): it
stays pending and visible, and no warning is logged about it."""

#: Every :data:`Decision`.
DECISIONS: Final = frozenset({"approve", "deny", "cancel", "ask", "leave"})

_MCP_RESULT: Final = "agent.session.input.mcp_approval_request_result"
_COMPUTER_USE_RESULT: Final = "agent.session.input.computer_use_approval_request_result"


@dataclass(frozen=True, slots=True, kw_only=True)
class MCPRequest:
    """An MCP server's tool call waiting for approval. ``arguments`` is None when the
    request does not provide them; ``name`` when it names no tool."""

    kind: ClassVar[str] = "mcp"
    session_id: str
    turn_id: str
    request_id: str
    server_label: str
    name: str | None = None
    arguments: Any = None
    message: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class OriginRequest:
    """A computer-use agent asking to open a page of ``origin`` (``browser_origin_access``)."""

    kind: ClassVar[str] = "computer_use"
    session_id: str
    turn_id: str
    request_id: str
    origin: str
    reason: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SignInRequest:
    """A computer-use agent asking to sign in (``browser_authentication``): the fields and
    options it asks for, never a value. The policy may ``cancel`` it or ``leave`` it."""

    kind: ClassVar[str] = "computer_use"
    session_id: str
    turn_id: str
    request_id: str
    credential_origin: str | None = None
    fields: tuple[Mapping[str, Any], ...] = field(default=())
    options: tuple[Mapping[str, Any], ...] = field(default=())
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class SignIn:
    """What the sign-in hook answers: a value per requested field id (from your own secret
    store) and the chosen option's id, if the request offers options. Never stored,
    logged, traced or shown: the answer is built in memory and submitted at once."""

    values: Mapping[str, str] = field(repr=False)
    option: str | None = None


SignInHook: TypeAlias = Callable[[SignInRequest], "SignIn | Awaitable[SignIn | None] | None"]
"""The host's sign-in hook: the values for a ``browser_authentication`` request, or None to
cancel it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EnvironmentConnection:
    """A session waiting for its self-hosted environment to connect
    (``environment_connection``): what the ``connect_environment=`` hook gets.
    ``environment`` is the session's ``environment`` object as read (None when absent)."""

    session_id: str
    environment_id: str
    environment: Mapping[str, Any] | None = None


ConnectEnvironmentHook: TypeAlias = Callable[[EnvironmentConnection], "Awaitable[None] | None"]
"""The host's hook for ``environment_connection``: start or wake the environment (sync or
async). Run at least once per occurrence of the action, so it must be idempotent; its
return value is ignored, an exception is retried."""


async def connect_environment(hook: ConnectEnvironmentHook, request: EnvironmentConnection) -> None:
    """Run ``hook`` on ``request`` (awaited when it is async); raises what it raises."""
    answer = hook(request)
    if inspect.isawaitable(answer):
        await answer


ActionRequest: TypeAlias = MCPRequest | OriginRequest | SignInRequest
"""A pending approval request, as the policy sees it."""

ActionPolicy: TypeAlias = Callable[[ActionRequest], "Decision | Awaitable[Decision]"]
"""The host's policy: a plain callable, sync or async, from a request to a decision."""


def _decision(value: str, what: str) -> Decision:
    if value not in DECISIONS:
        raise ValueError(f"{what} must be one of {sorted(DECISIONS)}, not {value!r}")
    return value  # type: ignore[return-value]


@dataclass(frozen=True, slots=True, kw_only=True)
class ActionRules:
    """The declarative policy: by MCP server label (and tool name), by origin.

    ``mcp`` maps a server label, or ``label/tool`` for one of its tools (which wins), to a
    decision; ``other_mcp`` decides the rest. ``origins`` maps an origin
    (``https://example.com``) to a decision for it and every subdomain of it (same scheme
    and port); ``other_origins`` decides the rest. ``sign_in`` decides
    ``browser_authentication`` requests (``cancel`` or ``leave``). Everything left out is
    ``leave``: a request nobody here answers stays pending and visible.

    >>> rules = ActionRules(mcp={"docs": "approve", "payments": "ask"}, other_mcp="deny",
    ...                     origins={"https://example.com": "approve"}, other_origins="ask",
    ...                     sign_in="cancel")
    """

    mcp: Mapping[str, Decision] = field(default_factory=dict)
    other_mcp: Decision = "leave"
    origins: Mapping[str, Decision] = field(default_factory=dict)
    other_origins: Decision = "leave"
    sign_in: Decision = "leave"

    def __post_init__(self) -> None:
        for label, value in self.mcp.items():
            _decision(value, f"mcp[{label!r}]")
        for origin, value in self.origins.items():
            _decision(value, f"origins[{origin!r}]")
            parts = urlsplit(origin)
            if not parts.scheme or not parts.hostname or parts.path not in ("", "/"):
                raise ValueError(f"origins: {origin!r} is not an origin like https://example.com")
        _decision(self.other_mcp, "other_mcp")
        _decision(self.other_origins, "other_origins")
        if self.sign_in not in ("cancel", "leave"):
            raise ValueError(f"sign_in must be 'cancel' or 'leave', not {self.sign_in!r}")

    def __call__(self, request: ActionRequest) -> Decision:
        if isinstance(request, MCPRequest):
            if request.name is not None:
                exact = self.mcp.get(f"{request.server_label}/{request.name}")
                if exact is not None:
                    return exact
            return self.mcp.get(request.server_label, self.other_mcp)
        if isinstance(request, OriginRequest):
            for origin, value in self.origins.items():
                if origin_matches(origin, request.origin):
                    return value
            return self.other_origins
        return self.sign_in


def _port(scheme: str, port: int | None) -> int | None:
    return port if port is not None else {"https": 443, "http": 80}.get(scheme)


def origin_matches(rule: str, origin: str) -> bool:
    """Is ``origin`` the origin ``rule`` or a subdomain of it (same scheme and port)?
    ``https://example.com`` matches ``https://docs.example.com``, never
    ``https://example.com.evil.test`` or ``https://badexample.com``."""
    try:
        want, got = urlsplit(rule), urlsplit(origin)
        want_port, got_port = _port(want.scheme, want.port), _port(got.scheme, got.port)
    except ValueError:  # a malformed port
        return False
    host, seen = want.hostname, got.hostname
    if not host or not seen or want.scheme.lower() != got.scheme.lower():
        return False
    return want_port == got_port and (seen == host or seen.endswith("." + host))


def request_of(session_id: str, action: FunctionCallAction) -> ActionRequest:
    """The typed request of an approval request seen as a call
    (:attr:`~agentfn_asgi.wire.FunctionCallAction.request_type` set)."""
    raw = action.arguments if isinstance(action.arguments, dict) else {}
    ids = {"session_id": session_id, "turn_id": action.turn_id, "request_id": action.call_id}
    if action.request_type == "mcp_approval_request":
        name = raw.get("name")
        return MCPRequest(
            **ids,
            server_label=_text(raw.get("server_label")) or "",
            name=name if isinstance(name, str) and name else None,
            arguments=raw.get("arguments"),
            message=_text(raw.get("message")),
        )
    if raw.get("type") == "browser_authentication":
        return SignInRequest(
            **ids,
            credential_origin=_text(raw.get("credential_origin")),
            fields=_objects(raw.get("fields")),
            options=_objects(raw.get("options")),
            reason=_text(raw.get("reason")),
        )
    return OriginRequest(
        **ids, origin=_text(raw.get("origin")) or "", reason=_text(raw.get("reason"))
    )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _objects(value: Any) -> tuple[Mapping[str, Any], ...]:
    if not isinstance(value, list):
        return ()
    return tuple(item for item in value if isinstance(item, dict))


async def decide(policy: ActionPolicy | None, request: ActionRequest) -> Decision:
    """The policy's decision on ``request`` (``leave`` without a policy). Raises what the
    policy raises, and ValueError for an answer that is not a decision; a sign-in may only
    be cancelled or left (its values are not the policy's to give)."""
    if policy is None:
        return "leave"
    answer = policy(request)
    if inspect.isawaitable(answer):
        answer = await answer
    decision = _decision(answer if isinstance(answer, str) else repr(answer), "the decision")
    if isinstance(request, SignInRequest) and decision not in ("cancel", "leave"):
        raise ValueError(f"a sign-in request can only be cancelled or left, not {decision}")
    return decision


def action_kind(
    name: str,
) -> Literal["function", "mcp", "computer_use", "environment_connection", "unknown"]:
    """The kind of a call by its recorded name: ``function``, ``mcp``, ``computer_use``,
    ``environment_connection`` or ``unknown`` (an action type this version does not know)."""
    if name.startswith("mcp:"):
        return "mcp"
    if name.startswith(ENVIRONMENT_PREFIX):
        return "environment_connection"
    if name.startswith(UNKNOWN_PREFIX):
        return "unknown"
    if name.startswith(("computer_use:", "sign_in:")):
        return "computer_use"
    return "function"


def action_fields(name: str) -> dict[str, str | None]:
    """What an operator reads of a call by its recorded name: its ``kind``, and for MCP
    its ``server_label`` and ``name``, for computer use its ``origin`` (``request``:
    ``origin_access`` or ``sign_in``)."""
    kind = action_kind(name)
    if kind == "mcp":
        label, _, tool = name.removeprefix("mcp:").partition("/")
        return {"kind": kind, "server_label": label, "name": tool or None}
    if kind == "computer_use":
        if name.startswith("sign_in:"):
            origin = name.removeprefix("sign_in:")
            return {"kind": kind, "request": "sign_in", "origin": origin or None}
        return {"kind": kind, "request": "origin_access", "origin": name.split(":", 1)[1]}
    if kind == "environment_connection":
        return {"kind": kind, "environment_id": name.removeprefix(ENVIRONMENT_PREFIX)}
    if kind == "unknown":
        return {"kind": kind, "type": name.removeprefix(UNKNOWN_PREFIX)}
    return {"kind": kind}


def answer_event(name: str, request_id: str, decision: Decision) -> dict[str, Any]:
    """The input event answering the request ``request_id`` recorded as ``name`` with
    ``decision`` (``approve``, ``deny`` or ``cancel``; a sign-in is only ever cancelled
    here: a refusal of any kind cancels it)."""
    if decision not in ("approve", "deny", "cancel"):
        raise ValueError(f"{decision!r} is not an answer")
    response: dict[str, str]
    if name.startswith("mcp:"):
        response = {"type": "mcp_tool_call", "decision": decision}
        return {"type": _MCP_RESULT, "request_id": request_id, "response": response}
    if name.startswith("sign_in:"):
        response = {"type": "browser_authentication", "action": "cancel"}
    else:
        response = {"type": "browser_origin_access", "decision": decision}
    return {"type": _COMPUTER_USE_RESULT, "request_id": request_id, "response": response}


#: What a stored sign-in answer holds in place of each value.
NOT_STORED: Final = "[not stored]"


async def sign_in_answer(
    hook: SignInHook, request: SignInRequest
) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """Ask ``hook`` for ``request``'s values: ``(event, redacted)`` where ``event`` is the
    answer to submit (values in memory only) and ``redacted`` the same event with every value
    replaced by :data:`NOT_STORED` (what may be saved); None when the hook cancels. Raises
    what the hook raises, and ValueError when it names a field the request does not ask for
    (the message names field ids, never values)."""
    answer = hook(request)
    if inspect.isawaitable(answer):
        answer = await answer
    if answer is None:
        return None
    if not isinstance(answer, SignIn):
        raise ValueError(f"the sign-in hook must return SignIn or None, not {type(answer)}")
    asked = {str(f.get("id")) for f in request.fields}
    unknown = sorted(set(answer.values) - asked)
    if unknown:
        raise ValueError(f"the sign-in hook gave fields the request does not ask for: {unknown}")

    def event(value: Callable[[str], str]) -> dict[str, Any]:
        response: dict[str, Any] = {
            "type": "browser_authentication",
            "action": "submit",
            "fields": [{"field_id": k, "value": value(v)} for k, v in answer.values.items()],
        }
        if answer.option is not None:
            response["selected_option"] = answer.option
        return {
            "type": _COMPUTER_USE_RESULT,
            "request_id": request.request_id,
            "response": response,
        }

    return event(lambda v: v), event(lambda _: NOT_STORED)
