"""What a turn's end stops: the calls a session no longer waits for.

A settling read of a session (after an ``agent.session.idle`` or ``agent.session.failed``
webhook, a stream's ``turn.cancelled``/``turn.failed``/``session.idle``, the periodic re-read
of sessions with long-running calls, the recovery sweep) lists what is still owed. Every
call recorded for the session that the read no longer lists, and that was claimed before
the read (:attr:`~agentfn_asgi.calls.states.Guard.KNOWN_BEFORE`), is not owed any more:

- a saved result becomes ``stale``: it is never sent;
- an action nobody here answers (``unanswered``) becomes ``stale`` while its turn goes on
  (someone else answered it), ``cancelled`` once its turn ended;
- a turn-less action (an ``environment_connection``, an unknown type: turn ``""``) has
  occurrences rather than a turn: its record is ``retired`` whatever it was doing (a hook
  still running is stopped, a lapsed claim is never in doubt: nothing is owed any more), so
  its next occurrence runs its hook again;
- a call without a result becomes ``cancelled`` (:meth:`Store.cancel
  <agentfn_asgi.store.base.Store.cancel>`), with why: the turn was cancelled, the turn
  failed (with its error code), the session was deleted; and what it was doing (stopped
  while it ran, "it may have run" for a side-effect tool; withdrawn while it waited for a
  person, a slot or a retry). One INFO line each.

The reason comes from the call's turn (``GET …/turns/{turn_id}``, once per turn). A call that
is running (``claimed``) is cancelled only when that read says its turn has ended, or the
session is gone: a session read that merely lags behind the call's announcement never stops
a running handler.

Work here stops at once (:meth:`Executor.stop <agentfn_asgi.dispatch.execution.Executor.stop>`
and the call's task); a replica holding the call elsewhere hears it at its next lease
renewal, which the store refuses (a third of ``lease_seconds`` at most).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from ..calls.records import CallKey, CallRecord, CallState
from ..calls.states import SAVED, TRANSITIONS
from ..client import AgentsClient
from ..errors import APIError, NotFoundError
from ..store.base import Store
from ..tools import FunctionTools
from ..wire import turn_error_reason
from .alarms import call_fields

__all__ = ["Canceller"]

logger = logging.getLogger("agentfn_asgi.dispatch.cancelling")

#: What a call without a result was doing when its turn ended, by state.
_DOING: Final = {
    CallState.WAITING: "withdrawn while it waited for a slot of its limiter",
    CallState.AWAITING_APPROVAL: "withdrawn while it waited for a person's approval",
    CallState.APPROVED: "withdrawn after its approval, before it ran",
    CallState.RETRY_SCHEDULED: "withdrawn while it waited for a retry",
    CallState.UNANSWERED: "left unanswered here",
}
#: The states of a turn-less action whose occurrence a read that no longer lists it ends.
_OCCURRENCE_ENDS: Final = frozenset().union(*(way.states for way in TRANSITIONS["retire"].ways))
#: Why a call's turn ended, by the turn's status (``failed`` says its error code).
_TURN_ENDED: Final = {
    "cancelled": "the turn was cancelled",
    "completed": "the turn completed without it",
}
#: Why a hook still running is stopped when its occurrence ends.
_ENDED: Final = "the session no longer waits for it (its occurrence ended)"


@dataclass(slots=True, kw_only=True, eq=False)
class Canceller:
    """Settles the calls a session no longer waits for (see the module docstring).

    ``stop(key, reason)`` stops whatever runs or waits for the call in this process.
    """

    store: Store
    client: AgentsClient
    tools: FunctionTools
    owner: str
    stop: Callable[[CallKey, str], None]

    async def settle(
        self,
        session_id: str,
        pending: set[CallKey],
        *,
        read_sent: float,
        margin: float,
        deleted: bool = False,
    ) -> bool:
        """Settle what the session's read, sent at ``read_sent``, no longer lists
        (``pending``: what it lists; ``deleted``: the session is gone). Whether a call was
        left because it may be newer than the read: read the session again ``margin``
        seconds later.

        "Before the read" is judged on the claimant's clock: this process's own claims
        against ``read_sent``, another replica's against ``read_sent - margin`` (the
        clock-skew allowance), so a call another replica claimed just before the read waits
        for the next one."""
        read_at = read_sent - margin
        later = False
        ended: dict[str, str | None] = {}
        for record in await self.store.calls_for_session(session_id):
            key = record.key
            if key in pending:
                continue
            known_before = read_sent if record.owner == self.owner else read_at
            if not key.turn_id:  # a turn-less action: this occurrence is over
                if record.state in _OCCURRENCE_ENDS:
                    ended_here = await self.end_occurrence(key, known_before=known_before)
                    later |= not ended_here and record.created_at > known_before
                continue
            if record.state.terminal:
                continue
            if record.state in SAVED:
                await self.store.mark_stale(key, unchanged_since=read_at)
                continue
            if key.turn_id not in ended:
                ended[key.turn_id] = (
                    "the session was deleted" if deleted else await self._turn_ended(key)
                )
            why = ended[key.turn_id]
            if why is None and record.state is CallState.CLAIMED:
                continue  # its turn goes on: never stop a handler on a read that lags
            if why is None and record.state is CallState.UNANSWERED:
                # Its turn goes on without it: answered elsewhere.
                await self.store.mark_stale(key, unchanged_since=known_before)
                continue
            reason = f"{why or 'the session no longer waits for it'}; {self._doing(record)}"
            cancelled = await self.store.cancel(
                key, owner=self.owner, reason=reason, known_before=known_before
            )
            later |= not cancelled and record.created_at > known_before
            if cancelled:
                fields = call_fields(key, record.tool_name, reason=reason)
                logger.info(
                    "call %s of %s cancelled: %s",
                    key,
                    record.tool_name,
                    reason,
                    extra={"agentfn": fields},
                )
                self.stop(key, reason)
        return later

    async def end_occurrence(self, key: CallKey, *, known_before: float) -> bool:
        """Retire the turn-less action ``key`` that a read sent at ``known_before`` no
        longer lists, and stop its hook if it runs here. Whether it was retired (refused:
        first claimed after that read, or retired already)."""
        retired = await self.store.retire(key, known_before=known_before)
        if retired:
            self.stop(key, _ENDED)
        return retired

    def _doing(self, record: CallRecord) -> str:
        if record.state is not CallState.CLAIMED:
            return _DOING.get(record.state, "withdrawn")
        tool = self.tools.get(record.tool_name)
        if tool is not None and tool.side_effects:
            return "stopped while it ran: it may have run"
        return "stopped while it ran"

    async def _turn_ended(self, key: CallKey) -> str | None:
        """Why the call's turn ended, or None while it goes on (or cannot be read)."""
        try:
            turn = await self.client.retrieve_turn(key.session_id, key.turn_id)
        except NotFoundError:
            return "the session no longer has its turn"
        except (APIError, ValueError) as exc:
            logger.warning("reading turn %s of session %s failed: %s", key.turn_id, key, exc)
            return None
        if turn.status == "failed":
            return turn_error_reason(turn.error.code if turn.error is not None else None)
        return _TURN_ENDED.get(turn.status)
