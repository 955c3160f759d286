"""Answering the session's approval requests, and telling of the actions nobody answers.

An MCP or computer-use approval request is dispatched as a call
(:attr:`agentfn_asgi.wire.AgentSession.calls`): before its claim, the host's policy
(:mod:`agentfn_asgi.actions`) is asked once. ``approve``, ``deny`` and ``cancel`` become the
call's answer, saved and submitted exactly as a tool's result (:func:`saved_answer`);
``ask`` holds the call for a person (the ``request_approval`` row, as for an
``approval=`` tool); ``leave`` claims nothing. A policy that raises is logged and the
request denied (a sign-in cancelled): an error never approves anything.

A pending action this app has no answer for (no policy, an ``environment_connection``, a
type this version does not know) is left alone, and one WARNING per session and kind says
so (:meth:`RequestAnswers.unanswered`).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Final

from ..actions import (
    ActionPolicy,
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
#: Sessions remembered as warned about (per kind): bounded, oldest forgotten first.
_WARNED_LIMIT: Final = 10_000


def saved_answer(key: CallKey, name: str, decision: Decision, *, source: str) -> SavedResult:
    """The answer ``decision`` to the request ``key`` (recorded as ``name``), ready to save:
    ``source`` says who decided (``policy``, or ``approval``: a person or the expiry)."""
    event = answer_event(name, key.call_id, decision)
    return answer_result(key, event, error_type=_REFUSALS.get(decision), source=source)


class RequestAnswers:
    """The policy of one dispatcher, and the warnings about actions nobody answers."""

    def __init__(self, policy: ActionPolicy | None, sign_in: SignInHook | None = None) -> None:
        self.policy = policy
        #: The host's sign-in hook: asked for a ``browser_authentication`` request's values
        #: when its answer is due (:meth:`Executor._sign_in`), the policy is not asked.
        self.sign_in = sign_in
        self._warned: OrderedDict[tuple[str, str], None] = OrderedDict()

    def answers(self, action: FunctionCallAction) -> bool:
        """Is the request ``action`` answered here at all (a policy, or a sign-in hook)?"""
        if self.policy is not None:
            return True
        return self.sign_in is not None and action.name.startswith("sign_in:")

    async def admission(self, key: CallKey, action: FunctionCallAction) -> Admission | None:
        """The policy's word on the request ``action`` before its claim: its answer (saved
        and submitted as it is, nothing runs), :data:`NO_LIMIT` (ask a person), or None
        (``leave``: not claimed)."""
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
            return None
        if decision == "ask":
            return NO_LIMIT
        # Its log line is the call's ("call finished ... outcome=request_denied
        # source=policy"), written once it is submitted.
        return Admission(failure=saved_answer(key, action.name, decision, source="policy"))

    def unanswered(self, session: AgentSession) -> None:
        """Warn once per session and kind about its pending actions nobody here answers."""
        kinds: list[str] = []
        for action in session.required_actions:
            kind = action.type
            if kind == "function_call":
                continue
            requested = kind in ("mcp_approval_request", "computer_use_approval_request")
            if requested and self.policy is not None:
                continue
            kinds.append(kind)
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
                "no environment_connection hook"
                if kind == "environment_connection"
                else "no actions= policy"
                if kind.endswith("approval_request")
                else "an action type this version does not know",
                extra={"agentfn": {"session_id": session.id, "action": kind}},
            )
