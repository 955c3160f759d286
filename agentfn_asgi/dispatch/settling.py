"""Operators settling calls: an answer for a held or in-doubt call, or a re-run.

What ``agentfn-asgi calls settle`` and the operator page do, by the app's own rules: the
result is saved (the first saved still wins) and submitted once under its stable key; a
re-run claims the call with the next attempt and runs it like any other. Calls that are
running, saved, submitted or stale are refused with the reason.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Literal

from ..actions import action_kind
from ..calls.records import CallKey, CallRecord, CallState
from ..calls.states import settleable
from ..client import AgentsClient
from ..errors import CallNotFoundError, OperatorInputError
from ..results import encode_result, failure_result
from ..tools import FunctionTool, FunctionTools
from .execution import Executor

__all__ = ["SettleStatus", "Settler"]

#: What :meth:`Dispatcher.settle` did.
SettleStatus = Literal["submitted", "saved", "running", "refused"]


def _not_settleable(record: CallRecord | None, *, now: float, margin: float) -> str | None:
    """Why an operator may not settle ``record`` (None: they may: :func:`settleable`)."""
    if record is None:
        return "the call is gone"
    if settleable(record, now=now, margin=margin):
        return None
    if record.state is CallState.CLAIMED:
        return "it is running (its lease is live): wait, or check again after the lease"
    if record.state.has_result and not record.state.terminal:
        return "a result is already saved: it is being submitted"
    return f"it is {record.state.value}: nothing is owed any more"


@dataclass(slots=True, kw_only=True, eq=False)
class Settler:
    """Settles calls for operators with one dispatcher's parts (``track`` runs a re-run as
    the call's in-flight task; the store, settings, owner and clock are the executor's)."""

    client: AgentsClient
    executor: Executor
    track: Callable[[CallKey, Coroutine[Any, Any, None]], None]

    async def settle(
        self,
        key: CallKey,
        *,
        tools: FunctionTools,
        output: Any = None,
        error: str | None = None,
        rerun: bool = False,
    ) -> tuple[SettleStatus, str]:
        """An operator settles a held (quarantined) or in-doubt call of ``tools``, by the
        app's rules.

        With ``output`` or ``error``, that result is saved (the first result saved still
        wins) and submitted once under its stable key. With ``rerun``, the call is read from
        the live session (it must still be pending), claimed with the next attempt and run.
        A call that is running, saved, submitted or stale is refused, with the reason.
        Returns ``(status, message)``: ``submitted``, ``saved`` (the sweep retries the
        submission), ``running`` or ``refused``.
        """
        record = await self.executor.store.get_call(key)
        if record is None:
            raise CallNotFoundError(f"no call {key} in the store")
        refusal = _not_settleable(
            record, now=self.executor.clock(), margin=self.executor.settings.fence_margin
        )
        if refusal is not None:
            return "refused", refusal
        tool = tools.get(record.tool_name)
        if rerun:
            return await self._rerun(record, tool)
        if (output is None) == (error is None):
            raise OperatorInputError("settle needs exactly one of output, error or rerun")
        if action_kind(record.tool_name) != "function":
            # An approval request takes a decision, not a tool result: its re-run asks the
            # policy (or a person) again.
            return "refused", "an approval request is answered by a re-run, not a result"
        # Encoded like a handler's result (source ``operator``).
        if error is not None:
            result = failure_result(key, error, "operator", source="operator")
        else:
            result = encode_result(
                key,
                output,
                tool_name=record.tool_name,
                truncate=tool is not None and tool.truncate_oversize,
                source="operator",
                limit=self.executor.settings.result_limit,
                margin=self.executor.settings.result_margin,
            )
        saved = await self.executor.store.settle(
            key, result=result, margin=self.executor.settings.fence_margin
        )
        if saved is None:  # it changed since we looked
            latest = await self.executor.store.get_call(key)
            refusal = _not_settleable(latest, now=self.executor.clock(), margin=0.0)
            return "refused", refusal or "it changed meanwhile"
        submitted = await self.executor.submitter.submit(saved)
        if submitted == "submitted":
            return "submitted", f"the result was saved and submitted (attempt {saved.attempt})"
        return "saved", f"the result was saved; its submission {submitted}: the sweep retries it"

    async def _rerun(
        self, record: CallRecord, tool: FunctionTool | None
    ) -> tuple[SettleStatus, str]:
        key = record.key
        session = await self.client.retrieve_session(key.session_id)
        action = session.pending_call(key.turn_id, key.call_id)
        if action is None:
            # Read after the call's claim, so known before it: an in-doubt call is cancelled
            # (a quarantined one is terminal and stays as it is).
            cancelled = await self.executor.store.cancel(
                key,
                owner=self.executor.owner,
                reason="the session no longer waits for it; found by an operator's re-run",
                known_before=self.executor.clock(),
            )
            done = "it is now cancelled" if cancelled else "nothing was changed"
            return "refused", f"the API no longer waits for this call: {done}"
        sent = time.monotonic()
        released = await self.executor.store.release(
            key,
            owner=self.executor.owner,
            lease_seconds=self.executor.settings.lease_seconds,
            margin=self.executor.settings.fence_margin,
        )
        if released is None:
            return "refused", "it changed meanwhile"
        self.track(key, self.executor.rerun(released, action, tool, claimed_at=sent))
        return "running", f"running it again as attempt {released.attempt}"
