"""Flow control's side of one call: its limit, and its wait for a turn.

A tool with ``concurrency=`` or ``rate=`` gives each call a
:class:`~agentfn_asgi.calls.records.Limit` (:func:`limit_for`), which the claim passes to the
store. A call the limiter refuses is left
``waiting`` in the store, and :class:`Waiter` sees it through: its task holds no process
slot and no thread while it waits, and polls
(:meth:`~agentfn_asgi.store.base.Store.admit_call`), taking the process slot only for each
poll and keeping it once admitted, to run the call as a fresh attempt. A poll comes at once
when a call of the same limiter ends in this process (:meth:`Waiter.wake`), else after a
backoff (50 ms doubling to a second, and never later than a third of the lease: each poll
renews the waiter's lease; for a rated limiter every half token interval, 25 ms at least, so
the first in line takes its token soon after it exists). A wait past the tool's
``max_wait`` fails the call with a message the model can act on; a shutdown stops polling
(the waiter's lease lapses and another replica, or the sweep, adopts the call).

What runs the call once it is its turn stays the executor's
(:mod:`agentfn_asgi.dispatch.execution`): it hands :meth:`Waiter.wait` the function that
runs a :class:`Turn`.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

from ..calls.records import (
    LIMITER_KEY_SEPARATOR,
    CallKey,
    CallRecord,
    ClaimOutcome,
    ClaimStatus,
    Limit,
    SavedResult,
)
from ..errors import ArgumentValidationError, StoreError
from ..messages import LIMIT_KEY_FAILED_MESSAGE, MAX_WAIT_MESSAGE
from ..results import failure_result
from ..store.base import Store
from ..tools import FunctionTool, ToolContext, derive_idempotency_key
from ..tracing import Telemetry
from ..wire import FunctionCallAction
from .settings import DispatchSettings

__all__ = ["NO_LIMIT", "Admission", "Turn", "Waiter", "limit_for"]

# The executor's logger: these lines are part of one call's story (see dispatch/__init__).
logger = logging.getLogger("agentfn_asgi.dispatch.execution")


@dataclass(frozen=True, slots=True)
class Admission:
    """What flow control decides about a call before its claim: the :class:`Limit` its
    claim asks the store for (None: none), or the model-facing failure it gets instead of
    running (its tool's ``concurrency_key`` raised)."""

    limit: Limit | None = None
    failure: SavedResult | None = None


#: A call of a tool without limits: the claim asks for nothing.
NO_LIMIT: Final = Admission()

#: The first pause of a waiting call between two polls of its limiter (doubling per poll).
_FIRST_POLL = 0.05
#: The longest pause between two polls (and never more than a third of the lease).
_LONGEST_POLL = 1.0


async def limit_for(
    key: CallKey, action: FunctionCallAction, tool: FunctionTool, resources: Any
) -> Admission:
    """The :class:`Admission` of a call of a limited tool (``tool.policy.limited``).

    The limiter is the tool's name, plus the ``concurrency_key``'s value when it has one: the
    key function gets the parsed arguments and a :class:`ToolContext` for the call with
    attempt 0 and no deadline (it is asked before the call is claimed). Its value is made a
    string: a short printable one is kept as it is, any other (long, or holding control
    characters or lone surrogates: it comes from the model's arguments) becomes its first
    characters, escaped, and a digest of it, so every store can key and index the name.
    Arguments that do not parse give no limit: the call fails validation without
    running. A key function that raises fails the call (the model is told it did not run);
    the exception is logged."""
    if action.unreadable is not None:
        return NO_LIMIT
    policy, name = tool.policy, tool.name
    if policy.concurrency_key is not None:
        try:
            arguments = tool.parse_arguments(action.arguments)
        except ArgumentValidationError:
            return NO_LIMIT
        context = ToolContext(
            session_id=key.session_id,
            turn_id=key.turn_id,
            call_id=key.call_id,
            tool_name=tool.name,
            attempt=0,
            deadline=None,
            idempotency_key=derive_idempotency_key(key.session_id, key.turn_id, key.call_id),
            resources=resources,
        )
        try:
            value = policy.concurrency_key(context, arguments)
            if inspect.isawaitable(value):
                value = await value
        except Exception:
            logger.exception("the concurrency_key of tool %s failed for call %s", name, key)
            message = LIMIT_KEY_FAILED_MESSAGE.format(name=name)
            return Admission(
                failure=failure_result(key, message, "limit_key_error", source="limit")
            )
        name = _limiter_name(name, str(value))
    limit = Limit(name=name, concurrency=policy.concurrency, rate=policy.rate, burst=policy.burst)
    return Admission(limit=limit)


#: The longest ``concurrency_key`` value kept as it is in a limiter's name.
_KEPT_VALUE = 64
#: How many characters of a longer (or unprintable) value its name shows, before a digest.
_SHOWN_VALUE = 24


def _limiter_name(tool: str, value: str) -> str:
    """The limiter of ``tool``'s calls whose ``concurrency_key`` is ``value``: bounded in
    size and storable (an index row of PostgreSQL holds about 2.7 KB, and no store takes a
    NUL or a lone surrogate everywhere), readable where an operator sees it. A digested
    name has a second separator, which a kept value (printable) never holds: no kept value
    can share a digested value's limiter."""
    if len(value) <= _KEPT_VALUE and value.isprintable():
        return f"{tool}{LIMITER_KEY_SEPARATOR}{value}"
    shown = "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii")
        for c in value[:_SHOWN_VALUE]
    )
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{tool}{LIMITER_KEY_SEPARATOR}{shown}…{LIMITER_KEY_SEPARATOR}{digest}"


@dataclass(frozen=True, slots=True)
class Turn:
    """A waiting call's turn: ``record`` as the store admitted it (claimed, holding a slot),
    or, with ``failure``, as it stood when its wait passed ``max_wait`` (still waiting:
    ``failure`` is what its holder saves). ``sent``: the monotonic time of the request
    whose answer the record is (its lease counts from it); ``waited``: seconds since it
    began to wait."""

    record: CallRecord
    sent: float
    waited: float
    failure: SavedResult | None = None


#: ``(seconds, limiter)``: sleep that long, or less when a slot of the limiter is freed
#: here, or the process closes (the executor's, which knows the shutdown).
Nap = Callable[[float, str], Awaitable[None]]


class Waiter:
    """The waits of one executor's calls for their limiters (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        settings: DispatchSettings,
        telemetry: Telemetry,
        *,
        owner: str,
        clock: Callable[[], float],
    ) -> None:
        self._store = store
        self._settings = settings
        self._telemetry = telemetry
        self._owner = owner
        self._clock = clock
        #: limiter name -> set (and dropped) when a call holding one of its slots ends
        #: here: the calls waiting for it here poll at once.
        self._freed: dict[str, asyncio.Event] = {}

    def freed(self, limiter: str) -> asyncio.Event:
        """The event :meth:`wake` sets next for ``limiter``."""
        return self._freed.setdefault(limiter, asyncio.Event())

    def wake(self, limiter: str) -> None:
        """A slot of ``limiter`` was freed here: its waiters here poll now."""
        event = self._freed.pop(limiter, None)
        if event is not None:
            event.set()

    async def ask(
        self, key: CallKey, *, attempt: int, limit: Limit
    ) -> tuple[ClaimOutcome, float] | None:
        """One admission request for the call ``(us, attempt)`` holds: its outcome (CLAIMED
        or WAITING, still ours) and the monotonic time it was sent; None when the call is
        not ours any more. Raises StoreError."""
        sent = time.monotonic()
        outcome = await self._store.admit_call(
            key,
            owner=self._owner,
            attempt=attempt,
            limit=limit,
            lease_seconds=self._settings.lease_seconds,
            margin=self._settings.fence_margin,
        )
        if outcome is None or outcome.status not in (ClaimStatus.CLAIMED, ClaimStatus.WAITING):
            return None  # not ours any more: settled, stale or adopted
        return outcome, sent

    async def wait(
        self,
        record: CallRecord,
        limit: Limit,
        *,
        sent: float,
        max_wait: float | None,
        slots: asyncio.Semaphore,
        closing: Callable[[], bool],
        nap: Nap,
        run: Callable[[Turn], Awaitable[float | None]],
    ) -> float | None:
        """Poll ``limit`` for the ``waiting`` call ``record`` (ours) until its turn comes
        (``run`` it, inside the process slot the poll took, and return what ``run``
        returns), it is not ours any more, or ``closing()``. Past ``max_wait`` its turn
        comes with the failure to save. ``sent``: the monotonic time of the request that
        left it waiting (its lease counts from it)."""
        key, number, began = record.key, record.attempt, record.next_attempt_at
        cap = min(_LONGEST_POLL, self._settings.lease_seconds / 3)
        # A rated limiter's first waiter must ask soon after its token exists, or the rate
        # goes unused (a backoff to a second gave 5/s about 1.5 calls a second): its waiters
        # poll every half token interval instead of backing off.
        rated = None if limit.rate is None else min(max(0.5 / limit.rate, _FIRST_POLL / 2), cap)
        pause = _FIRST_POLL
        _log_waiting(record, limit)
        self._telemetry.add_calls_waiting(record.tool_name, 1)
        waiting = True

        def stop_waiting() -> None:
            nonlocal waiting
            if waiting:
                waiting = False
                self._telemetry.add_calls_waiting(record.tool_name, -1)

        try:
            while not closing():
                pause_now = min(pause, cap) if rated is None else rated
                if max_wait is not None:
                    pause_now = min(pause_now, max(0.0, began + max_wait - self._clock()))
                await nap(pause_now, limit.name)
                pause = min(pause * 2, cap)
                async with slots:
                    if closing():
                        return None  # the waiter's lease lapses; another replica adopts it
                    waited = max(0.0, self._clock() - began)
                    if max_wait is not None and waited >= max_wait:
                        stop_waiting()
                        self.wake(limit.name)  # the next in line here may go
                        message = MAX_WAIT_MESSAGE.format(name=record.tool_name, seconds=max_wait)
                        failure = failure_result(key, message, "max_wait", source="limit")
                        return await run(Turn(record, sent, waited, failure))
                    try:
                        asked = await self.ask(key, attempt=number, limit=limit)
                    except StoreError as exc:
                        # The next poll may succeed; past the lease, another replica adopts.
                        logger.warning("call %s: asking its limiter failed: %s", key, exc)
                        continue
                    if asked is None:
                        return None
                    (outcome, sent), record = asked, asked[0].record
                    if outcome.status is ClaimStatus.CLAIMED:
                        stop_waiting()
                        return await run(Turn(record, sent, waited))
            return None
        finally:
            stop_waiting()


def _wait_reason(limit: Limit) -> str:
    """Why a call of ``limit`` waits, for the log line: ``concurrency`` or ``rate`` (the
    call's history says which refused it when the tool has both)."""
    if limit.rate is None:
        return "concurrency"
    return "rate" if limit.concurrency is None else "concurrency or rate"


def _log_waiting(record: CallRecord, limit: Limit) -> None:
    """One INFO line when a call begins to wait for its limiter (never per poll)."""
    key, reason = record.key, _wait_reason(limit)
    limiter = limit.name.replace(LIMITER_KEY_SEPARATOR, ":")
    fields = {
        "tool": record.tool_name,
        "session_id": key.session_id,
        "turn_id": key.turn_id,
        "call_id": key.call_id,
        "limiter": limiter,
        "reason": reason,
        "attempt": record.attempt,
    }
    logger.info(
        "call waiting for its limit: tool=%s session=%s call=%s limiter=%s reason=%s",
        record.tool_name,
        key.session_id,
        key.call_id,
        limiter,
        reason,
        extra={"agentfn": fields},
    )
