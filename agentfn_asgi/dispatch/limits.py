"""Flow control's side of one call: its limit, and its wait for a turn.

A tool with ``concurrency=`` or ``rate=`` gives each call a
:class:`~agentfn_asgi.calls.records.Limit` (:func:`limit_for`), which the claim passes to the
store. A call the limiter refuses is left ``waiting`` in the store, and :class:`Waiter` sees
it through: its task holds no process slot and no thread while it waits.

Waiting costs per admission, not per waiter. The process keeps one line per limiter, in the
store's order (``(created_at, session_id, turn_id, call_id)``), and only its head asks the
store (:meth:`~agentfn_asgi.store.base.Store.admit_call`, which also renews the head's
lease), taking the process slot only for that request and keeping it once admitted, to run
the call as a fresh attempt; then the next call is the head. The head asks at once when a
call of the same limiter ends in this process (:meth:`Waiter.wake`: one request per freed
slot), else after a backoff (50 ms doubling to a second, and never later than a third of
the lease); a rated line's head asks one token interval after the line's last admission
(refused, after a tenth of the interval, doubling up to a quarter of it). The calls behind the
head wait for their turn without a timer: every third of the lease the head renews their
leases in one :meth:`~agentfn_asgi.store.base.Store.keep_places` (a waiter's lease is its
place in the line: one that lapses is adopted by another replica), and at each of its turns
it calls those whose ``max_wait`` passed. A wait past the tool's ``max_wait`` fails the call
with a message the model can act on; a shutdown stops the line (the waiters' leases lapse
and another replica, or the sweep, adopts the calls).

What runs the call once it is its turn stays the executor's
(:mod:`agentfn_asgi.dispatch.execution`): it hands :meth:`Waiter.wait` the function that
runs a :class:`Turn`.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
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
from .alarms import call_fields
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


#: ``(seconds, event)``: sleep that long, or less when ``event`` is set (a slot of the limiter
#: freed here) or the process closes (the executor's, which knows the shutdown).
Nap = Callable[[float, asyncio.Event], Awaitable[None]]


@dataclass(eq=False, slots=True)
class _Place:
    """One waiting call of this process in its limiter's :class:`_Line`.

    ``called`` is set when the call should look again: it became the head of the line,
    its wait passed ``max_wait`` (``expired``), it is not ours any more (``gone``), or the
    process closes. ``sent``: the monotonic time of the last request that renewed its lease
    (its lease counts from it)."""

    order: tuple[float, str, str, str]
    key: CallKey
    attempt: int
    began: float
    max_wait: float | None
    sent: float
    called: asyncio.Event = field(default_factory=asyncio.Event)
    expired: bool = False
    gone: bool = False


@dataclass(eq=False, slots=True)
class _Line:
    """This process's waiting calls of one limiter, in the order they arrived (the store's
    order: ``(created_at, session_id, turn_id, call_id)``).

    Only the head asks the store (:meth:`Waiter.wait`); the others wait for their
    ``called`` event, holding no timer. The head also keeps the others' places (one
    :meth:`~agentfn_asgi.store.base.Store.keep_places` for all of them every third of the
    lease) and calls those whose ``max_wait`` passed."""

    places: list[_Place] = field(default_factory=list)
    #: Slots of the limiter freed here since the head last asked (:meth:`Waiter.wake`).
    freed: int = 0
    #: Set by :meth:`Waiter.wake`: the head's nap ends.
    bell: asyncio.Event = field(default_factory=asyncio.Event)
    #: The head's pause before it asks again (backing off while refused).
    pause: float = _FIRST_POLL
    #: When (monotonic) the last admission here was asked for, and how many asks were
    #: refused since: a rated line's head asks again one token interval after it.
    admitted: float | None = None
    refused: int = 0
    #: When (monotonic) the places behind the head last kept their place, and the
    #: task keeping them (:meth:`Waiter._keep`).
    kept: float = field(default_factory=time.monotonic)
    keeping: asyncio.Task[None] | None = None

    def join(self, place: _Place) -> None:
        bisect.insort(self.places, place, key=lambda p: p.order)
        if self.places[0] is place:
            place.called.set()

    def leave(self, place: _Place) -> None:
        """``place`` leaves the line; the next head, if it changed, is called."""
        if place not in self.places:
            return
        head = self.places[0] is place
        self.places.remove(place)
        if head and self.places:
            self.places[0].called.set()


@dataclass(slots=True, eq=False)
class Waiter:
    """The waits of one executor's calls for their limiters (see the module docstring)."""

    store: Store
    settings: DispatchSettings
    telemetry: Telemetry
    _: KW_ONLY
    owner: str
    clock: Callable[[], float]
    #: limiter name -> its line here (dropped when it empties).
    _lines: dict[str, _Line] = field(default_factory=dict, init=False)

    def wake(self, limiter: str) -> None:
        """A slot of ``limiter`` was freed here: the head of its line here asks now (one
        waiter per freed slot, never the whole line)."""
        line = self._lines.get(limiter)
        if line is not None:
            line.freed += 1
            line.bell.set()

    def close(self) -> None:
        """The process closes: every waiting call here looks once more, and stops."""
        for line in self._lines.values():
            if line.keeping is not None:
                line.keeping.cancel()
            line.bell.set()
            for place in line.places:
                place.called.set()

    async def ask(
        self, key: CallKey, *, attempt: int, limit: Limit
    ) -> tuple[ClaimOutcome, float] | None:
        """One admission request for the call ``(us, attempt)`` holds: its outcome (CLAIMED
        or WAITING, still ours) and the monotonic time it was sent; None when the call is
        not ours any more. Raises StoreError."""
        sent = time.monotonic()
        outcome = await self.store.admit_call(
            key,
            owner=self.owner,
            attempt=attempt,
            limit=limit,
            lease_seconds=self.settings.lease_seconds,
            margin=self.settings.fence_margin,
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
        """Wait in this process's line for ``limit`` with the ``waiting`` call ``record``
        (ours) until its turn comes (``run`` it, inside the process slot its last request
        took, and return what ``run`` returns), it is not ours any more, or ``closing()``.
        Past ``max_wait`` its turn comes with the failure to save. ``sent``: the monotonic
        time of the request that left it waiting (its lease counts from it).

        Only the head of the line asks the store; the calls behind it wait for their turn
        without a timer, their leases renewed by the head (:class:`_Line`)."""
        key = record.key
        line = self._lines.get(limit.name)
        if line is None:
            line = self._lines[limit.name] = _Line()
        place = _Place(
            order=(record.created_at, key.session_id, key.turn_id, key.call_id),
            key=key,
            attempt=record.attempt,
            began=record.next_attempt_at,
            max_wait=max_wait,
            sent=sent,
        )
        _log_waiting(record, limit)
        self.telemetry.add_calls_waiting(record.tool_name, 1)
        waiting = True

        def stop_waiting() -> None:
            nonlocal waiting
            if waiting:
                waiting = False
                self.telemetry.add_calls_waiting(record.tool_name, -1)

        async def fail(waited: float) -> float | None:
            """Its wait passed ``max_wait``: its turn comes with that failure."""
            stop_waiting()
            line.leave(place)
            message = MAX_WAIT_MESSAGE.format(name=record.tool_name, seconds=max_wait)
            failure = failure_result(key, message, "max_wait", source="limit")
            return await run(Turn(record, place.sent, waited, failure))

        line.join(place)
        try:
            while not closing():
                if line.places[0] is not place:
                    await place.called.wait()
                    place.called.clear()
                    if closing() or place.gone:
                        return None
                    if place.expired:
                        async with slots:
                            if closing():
                                return None
                            return await fail(max(0.0, self.clock() - place.began))
                    continue
                # The head of the line: it asks for the line, after a nap.
                await self._nap(line, place, limit, nap)
                if closing():
                    return None
                self._look_behind(line, place)
                waited = max(0.0, self.clock() - place.began)
                async with slots:
                    if closing():
                        return None  # the waiter's lease lapses; another replica adopts it
                    if max_wait is not None and waited >= max_wait:
                        return await fail(waited)
                    try:
                        asked = await self.ask(key, attempt=place.attempt, limit=limit)
                    except StoreError as exc:
                        # The next poll may succeed; past the lease, another replica adopts.
                        logger.warning("call %s: asking its limiter failed: %s", key, exc)
                        continue
                    if asked is None:
                        return None
                    (outcome, place.sent), record = asked, asked[0].record
                    line.refused = 0 if outcome.status is ClaimStatus.CLAIMED else line.refused + 1
                    if outcome.status is ClaimStatus.CLAIMED:
                        line.admitted = place.sent
                        stop_waiting()
                        line.leave(place)  # the next in line here is the head now
                        return await run(Turn(record, place.sent, waited))
            return None
        finally:
            stop_waiting()
            line.leave(place)
            if not line.places and self._lines.get(limit.name) is line:
                del self._lines[limit.name]

    async def _nap(self, line: _Line, head: _Place, limit: Limit, nap: Nap) -> None:
        """The head's pause before it asks: none when a slot was freed here since it last
        asked; else a backoff (50 ms doubling to a second, never more than a third of the
        lease: asking renews its lease) or, for a rated limiter, half a token interval."""
        bell = line.bell
        if limit.concurrency is None:
            # A call ending frees no token: only time does.
            line.freed, bell = 0, asyncio.Event()
        elif line.freed:
            line.freed -= 1
            return
        cap = min(_LONGEST_POLL, self.settings.lease_seconds / 3)
        if limit.rate is not None:
            # A rated line's head must ask as soon as its token exists, or the rate goes
            # unused (a full bucket refills nothing: an ask that comes late loses the time
            # it was late). An admission left at least an empty bucket at the time of its
            # ask (the store's ``now`` is the asker's clock when it asks), so the next
            # token exists at most one interval after that ask: the head asks then (asking
            # earlier was measured to be refused every time: one more request per start,
            # and the retry comes later than the token). Refused (another replica took it,
            # or the line just began), it asks again after a tenth of the interval,
            # doubling up to a quarter of it (another replica's admissions are not seen
            # here: a token may wait that long for the first in line).
            interval = 1.0 / limit.rate
            if line.admitted is not None and not line.refused:
                pause = max(0.0, line.admitted + interval - time.monotonic())
            else:
                backoff = interval / 10 * 2 ** max(0, line.refused - 1)
                pause = max(_FIRST_POLL / 5, min(backoff, interval / 4))
            pause = min(pause, cap)
        else:
            pause = min(line.pause, cap)
            line.pause = min(line.pause * 2, cap)
        if head.max_wait is not None:
            pause = min(pause, max(0.0, head.began + head.max_wait - self.clock()))
        await nap(pause, bell)
        line.bell.clear()
        line.freed = max(0, line.freed - 1)

    def _look_behind(self, line: _Line, head: _Place) -> None:
        """At each turn of ``head``: the places behind it whose ``max_wait`` passed are
        called to fail, and every third of the lease the others are kept (:meth:`_keep`,
        on a task of the line's own: the head asks meanwhile, a batch of a thousand takes
        a PostgreSQL connection for most of a second)."""
        now = self.clock()
        for place in line.places:
            if (
                place is not head
                and place.max_wait is not None
                and now - place.began >= place.max_wait
                and not place.expired
            ):
                place.expired = True
                place.called.set()
        if time.monotonic() - line.kept < self.settings.lease_seconds / 3:
            return
        if line.keeping is not None and not line.keeping.done():
            return
        behind = [p for p in line.places if p is not head and not (p.expired or p.gone)]
        line.kept = time.monotonic()
        if behind:
            line.keeping = asyncio.create_task(self._keep(line, behind))

    async def _keep(self, line: _Line, behind: list[_Place]) -> None:
        """Renew the leases of ``behind`` in one batch; those not ours any more are called
        to stop (settled, stale or adopted)."""
        sent = time.monotonic()
        try:
            kept = await self.store.keep_places(
                [(p.key, p.attempt) for p in behind],
                owner=self.owner,
                lease_seconds=self.settings.lease_seconds,
            )
        except Exception as exc:  # a task of its own: nothing else would see it
            # Tried again at the head's next turn; past the lease, another replica adopts.
            line.kept = 0.0
            logger.warning("keeping %d waiting calls' places failed: %s", len(behind), exc)
            return
        for place, ours in zip(behind, kept, strict=True):
            if ours:
                place.sent = sent
            else:
                place.gone = True
                place.called.set()


def _log_waiting(record: CallRecord, limit: Limit) -> None:
    """One INFO line when a call begins to wait for its limiter (never per poll); its
    reason: ``concurrency`` or ``rate`` (the call's history says which refused it when the
    tool has both)."""
    if limit.rate is None:
        reason = "concurrency"
    else:
        reason = "rate" if limit.concurrency is None else "concurrency or rate"
    limiter = limit.name.replace(LIMITER_KEY_SEPARATOR, ":")
    fields = call_fields(
        record.key, record.tool_name, limiter=limiter, reason=reason, attempt=record.attempt
    )
    logger.info(
        "call waiting for its limit: tool=%(tool)s session=%(session_id)s call=%(call_id)s "
        "limiter=%(limiter)s reason=%(reason)s",
        fields,
        extra={"agentfn": fields},
    )
