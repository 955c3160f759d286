"""Answering the session's approval requests, and telling of the actions nobody answers.

An MCP or computer-use approval request is dispatched as a call
(:attr:`agentfn_asgi.wire.AgentSession.calls`): before its claim, the host's policy
(:mod:`agentfn_asgi.actions`) is asked once. ``approve``, ``deny`` and ``cancel`` become the
call's answer, saved and submitted exactly as a tool's result (:func:`saved_answer`);
``ask`` holds the call for a person (the ``request_approval`` row, as for an
``approval=`` tool); ``leave`` records it ``unanswered`` (claimed, then left: the ``leave``
row), so that it is seen with its age. A policy that raises is logged and the request
denied (a sign-in cancelled): an error never approves anything.

An ``environment_connection`` is answered by the host's ``connect_environment=`` hook, run
as a call (claimed, retried, its span, metric and log line), whose answer is recorded and
never POSTed (the API learns of the connection from the environment itself).

A pending action this app has no answer for (no policy, an ``environment_connection``
without a hook, a type this version does not know) is recorded ``unanswered`` too, and one
WARNING per session and kind says so (:meth:`RequestAnswers.unanswered`); a ``leave``
decision logs none.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Final

from ..actions import (
    ActionPolicy,
    ConnectEnvironmentHook,
    Decision,
    SignInHook,
    SignInRequest,
    answer_event,
    decide,
    request_of,
)
from ..calls.records import CallKey, SavedResult
from ..results import answer_result
from ..wire import AgentSession, FunctionCallAction
from .limits import NO_LIMIT, Admission

__all__ = ["RequestAnswers", "saved_answer"]

logger = logging.getLogger("agentfn_asgi.dispatch.actions")

#: ``error_type`` of an answer that refuses: what ``calls`` and the metrics show.
_REFUSALS: Final = {"deny": "request_denied", "cancel": "request_cancelled"}
#: Why nobody here answers an action, by its type (the ``unanswered`` event's detail).
_WHY_UNANSWERED: Final = {
    "mcp_approval_request": "no actions= policy",
    "computer_use_approval_request": "no actions= policy",
    "environment_connection": "no connect_environment hook",
}
_UNKNOWN_TYPE: Final = "an action type this version does not know"
#: Sessions remembered as warned about (per kind): bounded, oldest forgotten first.
_WARNED_LIMIT: Final = 10_000


def saved_answer(key: CallKey, name: str, decision: Decision, *, source: str) -> SavedResult:
    """The answer ``decision`` to the request ``key`` (recorded as ``name``), ready to save:
    ``source`` says who decided (``policy``, or ``approval``: a person or the expiry)."""
    event = answer_event(name, key.call_id, decision)
    return answer_result(key, event, error_type=_REFUSALS.get(decision), source=source)


@dataclass(slots=True, eq=False)
class RequestAnswers:
    """The policy of one dispatcher, and the warnings about actions nobody answers."""

    policy: ActionPolicy | None
    #: The host's sign-in hook: asked for a ``browser_authentication`` request's values
    #: when its answer is due (:meth:`Executor._sign_in`), the policy is not asked.
    sign_in: SignInHook | None = None
    #: The host's hook for ``environment_connection`` (:meth:`Executor._connect`).
    connect_environment: ConnectEnvironmentHook | None = None
    _warned: OrderedDict[tuple[str, str], None] = field(default_factory=OrderedDict, init=False)

    def answers(self, action: FunctionCallAction) -> bool:
        """Is the action ``action`` (a request, an environment connection, an unknown
        type) answered here at all (a policy, a sign-in hook, a connect hook)?"""
        if action.request_type == "environment_connection":
            return self.connect_environment is not None
        if action.request_type not in ("mcp_approval_request", "computer_use_approval_request"):
            return False  # a type this version does not know
        if self.policy is not None:
            return True
        return self.sign_in is not None and action.name.startswith("sign_in:")

    async def admission(self, key: CallKey, action: FunctionCallAction) -> Admission | str:
        """The word on the action ``action`` before its claim: its answer (saved and
        submitted as it is, nothing runs), :data:`NO_LIMIT` (ask a person, run a hook), or
        why nobody here answers it (recorded ``unanswered``)."""
        if not self.answers(action):
            kind = action.request_type or "function_call"
            return _WHY_UNANSWERED.get(kind, _UNKNOWN_TYPE)
        if action.request_type == "environment_connection":
            return NO_LIMIT
        request = request_of(key.session_id, action)
        if isinstance(request, SignInRequest) and self.sign_in is not None:
            return NO_LIMIT  # the hook is asked when the answer is due, never stored
        try:
            decision = await decide(self.policy, request)
        except Exception:
            logger.exception(
                "the action policy failed on request %s (%s); refusing it", key, action.name
            )
            decision = "deny"
        if decision == "leave":
            return "left by the actions= policy"
        if decision == "ask":
            return NO_LIMIT
        # Its log line is the call's ("call finished ... outcome=request_denied
        # source=policy"), written once it is submitted.
        return Admission(failure=saved_answer(key, action.name, decision, source="policy"))

    def unanswered(self, session: AgentSession) -> None:
        """Warn once per session and kind about its pending actions nobody here answers
        (:meth:`answers`: the same decision as the claims')."""
        kinds = [
            action.request_type
            for action in (*session.calls, *session.turnless_calls)
            if action.request_type is not None and not self.answers(action)
        ]
        for kind in dict.fromkeys(kinds):
            if (session.id, kind) in self._warned:
                continue
            self._warned[(session.id, kind)] = None
            if len(self._warned) > _WARNED_LIMIT:
                self._warned.popitem(last=False)
            logger.warning(
                "session %s waits for a %s that this app does not answer (%s); it stays "
                "pending until something else answers it",
                session.id,
                kind,
                _WHY_UNANSWERED.get(kind, _UNKNOWN_TYPE),
                extra={"agentfn": {"session_id": session.id, "action": kind}},
            )
