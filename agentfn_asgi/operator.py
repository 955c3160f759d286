"""What an operator sees and does: an overview, the calls, one call's history, settling one.

The CLI (``agentfn-asgi status``, ``calls``, ``deliveries``) and the operator page
(:mod:`agentfn_asgi.admin`) both read through :class:`OperatorView`, so a terminal and a
browser always show the same facts. Content (a call's arguments and output) is only read
when asked for (``content=True``): it may hold personal data.

Display states of a call (``CallSummary.state``) are the store's states plus ``in_doubt``
(claimed, but its lease expired with no saved result: the handler may or may not have run).
A ``waiting`` call waits for its tool's concurrency or rate limit (flow control): its
summary names the limiter and since when it waits.

:class:`Operator` is the real view over an app's dispatcher (its store, its API client and
its settling rules): ``AgentWebhookApp.operator()`` builds one, and the CLI builds one over
a dispatcher of its own.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args, runtime_checkable

from .actions import action_kind
from .calls.records import (
    LIMITER_KEY_SEPARATOR,
    CallEvent,
    CallKey,
    CallQuery,
    CallRecord,
    CallState,
    DeliveryRecord,
)
from .calls.states import in_doubt, settleable
from .client import AgentsClient
from .dispatch import Dispatcher
from .dispatch.approvals import ApprovalView, approval_view
from .errors import (
    APIError,
    CallNotFoundError,
    ConfigurationError,
    OperatorInputError,
    StoreError,
)
from .store.base import Store
from .wire import SESSION_BUDGET_REACHED

__all__ = [
    "BUDGET_SCAN_LIMIT",
    "OUTCOMES",
    "ApprovalView",
    "ApprovalsView",
    "CallDetail",
    "CallEventView",
    "CallFilter",
    "CallPage",
    "CallSummary",
    "DeliveryView",
    "Operator",
    "OperatorView",
    "Outcome",
    "Overview",
    "PausedSession",
    "SettleOutcome",
    "json_or_text",
    "limiter_label",
    "outcome_of",
    "parse_duration",
]

#: Display states, in the order an operator reads them.
DisplayState = Literal[
    "claimed",
    "in_doubt",
    "succeeded",
    "failed",
    "submitted",
    "stale",
    "quarantined",
    "awaiting_approval",
    "approved",
    "retry_scheduled",
    "waiting",
    "cancelled",
    "unanswered",
    "retired",
]

#: What became of a call, in an operator's words (the page's badges and counts): ``running``
#: (claimed, lease live), ``in_doubt`` (claimed, lease ran out), ``submitting`` (a result is
#: saved, not yet accepted), ``succeeded`` / ``failed`` (the API accepted a success / a
#: failure), ``stale`` (the API stopped waiting), ``held`` (quarantined for an operator),
#: ``awaiting_approval`` (waiting for a person), ``approved`` (approved, about to run),
#: ``retrying`` (an attempt failed; the next one is scheduled, see ``next_attempt_at``),
#: ``waiting`` (waiting for its tool's concurrency or rate limit; nothing ran yet),
#: ``cancelled`` (its turn ended before it had a result; ``reason`` says why),
#: ``unanswered`` (a pending action nobody here answers, left to whoever does; ``reason``
#: says why), ``retired`` (a turn-less action, an environment connection, that its session
#: no longer lists).
Outcome = Literal[
    "running",
    "in_doubt",
    "submitting",
    "succeeded",
    "failed",
    "stale",
    "held",
    "awaiting_approval",
    "approved",
    "retrying",
    "waiting",
    "cancelled",
    "unanswered",
    "retired",
]
OUTCOMES: tuple[str, ...] = get_args(Outcome)


#: What a stored state's calls come out as, but for claimed (running or in doubt) and
#: submitted (succeeded or failed) ones.
_STATE_OUTCOME: dict[CallState, Outcome] = {
    CallState.QUARANTINED: "held",
    CallState.SUCCEEDED: "submitting",
    CallState.FAILED: "submitting",
    CallState.STALE: "stale",
    CallState.AWAITING_APPROVAL: "awaiting_approval",
    CallState.APPROVED: "approved",
    CallState.RETRY_SCHEDULED: "retrying",
    CallState.WAITING: "waiting",
    CallState.CANCELLED: "cancelled",
    CallState.UNANSWERED: "unanswered",
    CallState.RETIRED: "retired",
}


def outcome_of(record: CallRecord, now: float, margin: float = 0.0) -> Outcome:
    """The :data:`Outcome` of ``record`` at ``now`` (in doubt past the fencing ``margin``, as
    a settle or a takeover sees it)."""
    state = record.state
    if state is CallState.CLAIMED:
        return "in_doubt" if in_doubt(record, now=now, margin=margin) else "running"
    if state is CallState.SUBMITTED:
        return "succeeded" if record.result is not None and record.result.success else "failed"
    return _STATE_OUTCOME[state]


#: The display states an outcome's calls are in (a list by outcome reads them, then keeps
#: the calls of that outcome: what the overview counted).
_OUTCOME_STATES: dict[str, tuple[str, ...]] = {
    "running": ("claimed",),
    "in_doubt": ("in_doubt",),
    "succeeded": ("submitted",),
    "failed": ("submitted",),
} | {
    outcome: tuple(s.value for s, of in _STATE_OUTCOME.items() if of == outcome)
    for outcome in _STATE_OUTCOME.values()
}


@dataclass(frozen=True, slots=True, kw_only=True)
class CallFilter:
    """Which calls to list, newest first. ``since`` is a Unix time (calls first seen at or
    after it); ``cursor`` is the ``next_cursor`` of the previous page (opaque); ``outcome``
    (an :data:`Outcome`) lists exactly the calls the overview counts under it."""

    state: str | None = None
    outcome: str | None = None
    session_id: str | None = None
    tool_name: str | None = None
    since: float | None = None
    limit: int = 50
    cursor: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CallSummary:
    """One line of a call list."""

    session_id: str
    turn_id: str
    call_id: str
    tool_name: str
    state: str
    attempt: int
    created_at: float
    updated_at: float
    error_type: str | None = None
    #: Why it is quarantined (held for an operator), cancelled or unanswered, if it is.
    reason: str | None = None
    #: What kind of action it answers: ``function``, ``mcp``, ``computer_use``,
    #: ``environment_connection`` or ``unknown`` (by its recorded name).
    kind: str = "function"
    outcome: str = ""  # what became of it (:data:`Outcome`)
    #: Flow control: the limiter whose slot it holds or waits for (``tool`` or
    #: ``tool:key`` with a ``concurrency_key``), if any.
    limiter: str | None = None
    #: Flow control: since when a ``waiting`` call waits (Unix time).
    waiting_since: float | None = None
    #: Call budgets: the call's place among its session's calls of its tool counted against
    #: the tool's ``max_calls_per_session`` (1 for the first); None: never counted.
    counted: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CallEventView:
    """One step of a call's history (never content): ``kind`` is a short word (``seen``,
    ``claimed``, ``outcome``, ``saved``, ``submit_failed``, ``submitted``, ``stale``,
    ``cancelled``, ``quarantined``, ``settled``...), ``detail`` a short non-content text (an
    error type, an API status, a reason)."""

    at: float
    kind: str
    attempt: int
    owner: str | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class CallDetail:
    """One call with its history; ``arguments``/``output`` only when content was asked for."""

    summary: CallSummary
    history: tuple[CallEventView, ...] = ()
    arguments: str | None = None
    output: str | None = None
    settleable: bool = False
    #: The call's approval request (waiting or decided), when it has one.
    approval: ApprovalView | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class CallPage:
    """A page of calls, newest first; ``next_cursor`` fetches the next one (None: last)."""

    calls: tuple[CallSummary, ...]
    next_cursor: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class DeliveryView:
    """A recorded webhook delivery; ``attempts``/``last_error`` are the recovery sweep's."""

    delivery_id: str
    session_id: str
    received_at: float
    resolved: bool
    attempts: int = 0
    next_attempt_at: float | None = None
    last_error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class PausedSession:
    """A session paused on its spending limit (status ``budget_reached``, openai 3.63):
    its ``spend_control``'s ``limit`` and ``consumed``, in USD cents (None: not given).
    Its pending calls are still answered; a turn it fails is no longer owed."""

    session_id: str
    limit: int | None = None
    consumed: int | None = None


#: How many of the project's newest sessions the overview looks through for those paused on
#: their budget: one page of ``GET /agents/sessions``, one request per overview.
BUDGET_SCAN_LIMIT = 100
#: The scan is one request of one try, given at most this long, and its answer (or that it
#: failed) is kept this long: a page refreshed by several operators asks the API at most
#: once a period, and never waits on an API that does not answer.
BUDGET_SCAN_TIMEOUT = 2.0
BUDGET_SCAN_TTL = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Overview:
    """Health and counts: what ``status`` prints and the page's first screen shows."""

    store: str  # the resolved store location, password hidden
    healthy: bool
    deliveries: int
    unresolved_deliveries: int
    calls_by_state: Mapping[str, int] = field(default_factory=dict)
    successes: int = 0
    failures: int = 0
    #: Every call counted once, by :data:`Outcome` (they add up to the number of calls).
    outcomes: Mapping[str, int] = field(default_factory=dict)
    needs_attention: tuple[CallSummary, ...] = ()  # in doubt and quarantined, by id
    failing_deliveries: tuple[DeliveryView, ...] = ()  # the sweep keeps failing on these
    oldest_pending_at: float | None = None
    approvals_waiting: int = 0  # calls waiting for a person's approval
    #: Calls waiting for their tool's concurrency or rate limit, and how many per tool
    #: (counted among the first :data:`WAITING_COUNT_LIMIT` listed).
    calls_waiting: int = 0
    waiting_by_tool: Mapping[str, int] = field(default_factory=dict)
    #: Sessions among the project's newest :data:`BUDGET_SCAN_LIMIT` that are paused on their
    #: spending limit (``budget_reached``); None when not known (no API key, or the Agents
    #: API did not answer).
    paused_on_budget: tuple[PausedSession, ...] | None = None
    #: Pending actions nobody here answers (``unanswered``): how many, how many of each
    #: kind (among the first :data:`UNANSWERED_SCAN_LIMIT`), and when the oldest was first
    #: seen (its age is how long the session has waited for someone else).
    unanswered: int = 0
    unanswered_by_kind: Mapping[str, int] = field(default_factory=dict)
    oldest_unanswered_at: float | None = None

    def unanswered_summary(self, oldest: Callable[[float], str]) -> str:
        """``mcp 2, computer_use 1; ...``: the unanswered actions by kind, then the oldest
        one's wait as ``oldest`` words it from its first sight (the CLI and the page)."""
        kinds = ", ".join(f"{kind} {n}" for kind, n in self.unanswered_by_kind.items())
        at = self.oldest_unanswered_at
        return kinds if at is None else f"{kinds}; {oldest(at)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class SettleOutcome:
    """What settling did: ``submitted``/``saved`` (a result stands), ``running`` (re-run
    started), or ``refused`` (``message`` says why: running, submitted, stale...)."""

    status: Literal["submitted", "saved", "running", "refused"]
    message: str


class OperatorView(Protocol):
    """What the CLI and the operator page read and do. Raises
    :class:`~agentfn_asgi.errors.CallNotFoundError` (a ``LookupError``) for an unknown call,
    :class:`~agentfn_asgi.errors.OperatorInputError` (a ``ValueError``) when ``call_id`` alone
    names calls of several sessions or a cursor is not of the listing."""

    async def overview(self) -> Overview: ...

    async def calls(self, query: CallFilter) -> CallPage: ...

    async def call(
        self, call_id: str, *, session_id: str | None = None, content: bool = False
    ) -> CallDetail: ...

    async def deliveries(
        self, *, unresolved: bool = False, limit: int = 50
    ) -> list[DeliveryView]: ...

    async def settle(
        self,
        call_id: str,
        *,
        session_id: str | None = None,
        output: Any = None,
        error: str | None = None,
        rerun: bool = False,
    ) -> SettleOutcome: ...

    async def revoke_login(self, login_id: str, *, expires_at: float) -> None:
        """End the operator-page login ``login_id`` (its cookie's random id) for every
        replica, durably, until ``expires_at`` (when its cookie expires anyway)."""

    async def login_revoked(self, login_id: str) -> bool:
        """Whether the login ``login_id`` was ended by :meth:`revoke_login`."""


@runtime_checkable
class ApprovalsView(Protocol):
    """What the CLI and the operator page read and do about approval requests (the real
    :class:`Operator` is one). Decisions raise :class:`~agentfn_asgi.errors.ApprovalError`."""

    async def approvals(self, *, limit: int = 200) -> list[ApprovalView]: ...

    async def approval(self, approval_id: str) -> tuple[ApprovalView, CallDetail] | None: ...

    async def decide(
        self,
        approval_id: str,
        *,
        approve: bool,
        by: str,
        via: str,
        reason: str | None = None,
        digest: str | None = None,
    ) -> ApprovalView: ...

    async def notify_again(self, approval_id: str) -> ApprovalView: ...


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d{1,9})([smhdw])")


def parse_duration(text: str) -> float:
    """``15m``, ``2h``, ``3d`` (also ``s`` and ``w``) → seconds (the ``since`` filter of the
    CLI and the page). :class:`~agentfn_asgi.errors.OperatorInputError` (a ``ValueError``),
    saying the expected form, for anything else."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise OperatorInputError(
            "'since' must be a number and a unit (s, m, h, d or w), like 15m, 2h or 3d; "
            f"got {text!r}"
        )
    return float(int(match.group(1)) * _DURATION_UNITS[match.group(2)])


#: Deepest JSON an operator's output may nest (the limit of the webhook's own JSON reader):
#: deeper values would fail later, when the result is encoded, or exhaust the stack.
MAX_OUTPUT_DEPTH = 200


def json_or_text(text: str) -> tuple[bool, Any]:
    """An operator's output, as the CLI's ``--output`` and the page read it: ``(True,
    value)`` when the text is JSON (not NaN or Infinity, which the API does not take),
    else ``(False, text)``. ValueError, saying why, for JSON that nests more than
    :data:`MAX_OUTPUT_DEPTH` levels: it is meant as JSON but cannot be sent as it is."""
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise ValueError(_too_deep()) from None
    except ValueError:
        return False, text
    if _depth_exceeds(value, MAX_OUTPUT_DEPTH):
        raise ValueError(_too_deep())
    return True, value


def _too_deep() -> str:
    return f"the output is JSON nested more than {MAX_OUTPUT_DEPTH} levels deep"


def _depth_exceeds(value: Any, limit: int) -> bool:
    # Iterative: the value may be as deep as the parser allowed, near the recursion limit.
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return False


def _refuse_constant(name: str) -> Any:
    raise ValueError(name)


#: How many in-doubt and quarantined calls the overview names.
ATTENTION_LIMIT = 50
#: How many waiting calls the overview reads to count them per tool (the total is exact).
WAITING_COUNT_LIMIT = 1000
#: The overview reads at most this many unanswered calls for their kinds and the oldest.
UNANSWERED_SCAN_LIMIT = 5000
#: About how many calls one page of :meth:`Operator.calls` reads at most, looking for the
#: calls of an outcome (see there).
OUTCOME_READ_BUDGET = 1000


class Operator:
    """The :class:`OperatorView` of a store, and of the dispatcher that settles its calls.

    Without a ``dispatcher`` (a read-only CLI command with no API key) everything but
    settling and showing a pending call's arguments works. ``location`` is the store's
    location as shown to operators (password hidden); ``margin`` the dispatcher's clock-skew
    allowance (an in-doubt call is settleable once its lease expired that long ago).
    """

    def __init__(
        self,
        store: Store,
        *,
        dispatcher: Dispatcher | None = None,
        location: str,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._dispatcher = dispatcher
        self._store = store
        self._location = location
        self._clock = clock
        self._margin = 0.0 if dispatcher is None else dispatcher.settings.fence_margin
        #: The last scan for sessions paused on their budget: when (monotonic), and what.
        self._paused: tuple[float, tuple[PausedSession, ...] | None] | None = None

    async def overview(self) -> Overview:
        """Health, counts by state (``in_doubt`` apart), what needs a person, failing
        deliveries, the oldest pending call."""
        try:
            await self._store.ping()
            stats = await self._store.stats(margin=self._margin)
        except StoreError:
            return Overview(
                store=self._location, healthy=False, deliveries=0, unresolved_deliveries=0
            )
        attention: list[CallSummary] = []
        for state in ("in_doubt", "quarantined"):
            query = CallQuery(state=state, limit=ATTENTION_LIMIT, margin=self._margin)
            found = await self._store.list_calls(query)
            attention += [self._summary(record) for record in found]
        failing = [
            _delivery_view(d)
            for d in await self._store.list_deliveries(unresolved_only=True, limit=200)
            if d.attempts
        ]
        counts = dict(stats.calls_by_state)
        counts["in_doubt"] = stats.in_doubt
        counts["claimed"] = counts.get("claimed", 0) - stats.in_doubt
        outcomes = {
            outcome: sum(counts.get(state, 0) for state in _OUTCOME_STATES[outcome])
            for outcome in OUTCOMES
        } | {"succeeded": stats.successes, "failed": stats.failures}
        by_kind, oldest_unanswered = await self._unanswered(counts.get("unanswered", 0))
        by_tool: dict[str, int] = {}
        if counts.get("waiting", 0):
            query = CallQuery(state=CallState.WAITING.value, limit=WAITING_COUNT_LIMIT)
            for record in await self._store.list_calls(query):
                by_tool[record.tool_name] = by_tool.get(record.tool_name, 0) + 1
        return Overview(
            paused_on_budget=await self._paused_on_budget(),
            store=self._location,
            healthy=True,
            deliveries=stats.deliveries,
            unresolved_deliveries=stats.unresolved_deliveries,
            calls_by_state=counts,
            successes=stats.successes,
            failures=stats.failures,
            outcomes=outcomes,
            needs_attention=tuple(attention),
            failing_deliveries=tuple(failing[:ATTENTION_LIMIT]),
            oldest_pending_at=stats.oldest_pending_at,
            approvals_waiting=counts.get("awaiting_approval", 0),
            calls_waiting=counts.get("waiting", 0),
            waiting_by_tool=dict(sorted(by_tool.items())),
            unanswered=counts.get("unanswered", 0),
            unanswered_by_kind=by_kind,
            oldest_unanswered_at=oldest_unanswered,
        )

    async def unanswered(self) -> tuple[dict[str, int], float | None]:
        """The pending actions nobody here answers: how many of each kind, and when the
        oldest was first seen (None: there are none)."""
        stats = await self._store.stats(margin=self._margin)
        return await self._unanswered(stats.calls_by_state.get(CallState.UNANSWERED.value, 0))

    async def _unanswered(self, count: int) -> tuple[dict[str, int], float | None]:
        """The unanswered calls' kinds and the oldest one's first sight, read only when
        there are some (one per pending action left: few), at most
        :data:`UNANSWERED_SCAN_LIMIT` of them (a listing is newest first: past that, the
        oldest is the oldest of those read)."""
        if not count:
            return {}, None
        by_kind: dict[str, int] = {}
        oldest: float | None = None
        before: tuple[float, str, str, str] | None = None
        read = 0
        while read < UNANSWERED_SCAN_LIMIT:
            query = CallQuery(state=CallState.UNANSWERED.value, limit=500, before=before)
            page = await self._store.list_calls(query)
            for record in page:
                kind = action_kind(record.tool_name)
                by_kind[kind] = by_kind.get(kind, 0) + 1
                oldest = record.created_at if oldest is None else min(oldest, record.created_at)
            read += len(page)
            if len(page) < 500:
                break
            before = _position(page[-1])
        return dict(sorted(by_kind.items())), oldest

    async def _paused_on_budget(self) -> tuple[PausedSession, ...] | None:
        """The project's newest sessions paused on their spending limit (None: unknown), as
        read at most :data:`BUDGET_SCAN_TTL` ago."""
        if self._dispatcher is None:
            return None
        now = time.monotonic()
        if self._paused is not None and now - self._paused[0] < BUDGET_SCAN_TTL:
            return self._paused[1]
        paused = await self._scan_paused(self._dispatcher.client)
        self._paused = (now, paused)
        return paused

    async def _scan_paused(self, client: AgentsClient) -> tuple[PausedSession, ...] | None:
        try:
            async with asyncio.timeout(BUDGET_SCAN_TIMEOUT):
                page = await client.list_sessions(limit=BUDGET_SCAN_LIMIT, once=True)
        except (APIError, TimeoutError):
            return None
        return tuple(
            PausedSession(
                session_id=item.id,
                limit=None if item.spend_control is None else item.spend_control.limit,
                consumed=None if item.spend_control is None else item.spend_control.consumed,
            )
            for item in page.data
            if item.status == SESSION_BUDGET_REACHED
        )

    async def calls(self, query: CallFilter) -> CallPage:
        """A page of calls, newest first (``OperatorInputError`` for a cursor not ours).

        A page reads at most about :data:`OUTCOME_READ_BUDGET` calls: an outcome that is a
        part of a state's calls (``failed`` among the submitted ones) may be rare, and the
        calls of it are looked for that far only. Then the page holds what was found (maybe
        nothing) and its ``next_cursor`` goes on from where the reading stopped, so paging
        still reaches every call, in bounded time per page."""
        before = None if query.cursor is None else _decode_cursor(query.cursor)
        outcome, now = query.outcome, self._clock()
        states = (query.state,) if outcome is None else _OUTCOME_STATES[outcome]
        found: list[CallRecord] = []
        cut: tuple[float, str, str, str] | None = None  # where a reading stopped short
        for state in states:
            cursor, matched, read = before, 0, 0
            while True:  # an outcome is a part of a state's calls: read on until enough
                batch = await self._store.list_calls(
                    CallQuery(
                        state=state,
                        session_id=query.session_id,
                        tool_name=query.tool_name,
                        since=query.since,
                        limit=query.limit + 1,
                        before=cursor,
                        margin=self._margin,
                    )
                )
                hits = [
                    r
                    for r in batch
                    if outcome is None or outcome_of(r, now, self._margin) == outcome
                ]
                found += hits
                matched += len(hits)
                read += len(batch)
                if matched > query.limit or len(batch) <= query.limit:
                    break
                cursor = _position(batch[-1])
                if read >= OUTCOME_READ_BUDGET:
                    cut = cursor if cut is None else max(cut, cursor)
                    break
        if cut is not None:  # older than the cut, calls of some state were not read yet
            found = [r for r in found if _position(r) >= cut]
        found.sort(key=_position, reverse=True)
        page = found[: max(0, query.limit)]
        next_cursor = None
        if len(found) > len(page) and page:
            next_cursor = _encode_cursor(_position(page[-1]))
        elif cut is not None:
            next_cursor = _encode_cursor(cut)
        return CallPage(calls=tuple(self._summary(r) for r in page), next_cursor=next_cursor)

    async def call(
        self, call_id: str, *, session_id: str | None = None, content: bool = False
    ) -> CallDetail:
        """One call with its history (``CallNotFoundError``: unknown;
        ``OperatorInputError``: the id names calls of several sessions, give ``session_id``).
        With ``content``, the saved output and, while the call is still pending, its
        arguments read from the live session."""
        record = await self._find(call_id, session_id)
        return self._detail(
            record,
            arguments=await self._arguments(record.key) if content else None,
            output=_output_of(record) if content else None,
            settleable=settleable(record, now=self._clock(), margin=self._margin),
        )

    async def deliveries(self, *, unresolved: bool = False, limit: int = 50) -> list[DeliveryView]:
        """Recorded deliveries, newest first."""
        found = await self._store.list_deliveries(unresolved_only=unresolved, limit=limit)
        return [_delivery_view(d) for d in found]

    async def settle(
        self,
        call_id: str,
        *,
        session_id: str | None = None,
        output: Any = None,
        error: str | None = None,
        rerun: bool = False,
    ) -> SettleOutcome:
        """Settle a held, quarantined or in-doubt call through the dispatcher's rules."""
        record = await self._find(call_id, session_id)
        if self._dispatcher is None:
            raise ConfigurationError(
                "settling a call submits its result: it needs the Agents API (OPENAI_API_KEY)"
            )
        try:
            status, message = await self._dispatcher.settle(
                record.key, output=output, error=error, rerun=rerun
            )
        except APIError as exc:
            return SettleOutcome(
                status="refused", message=f"the Agents API could not be read: {exc}"
            )
        return SettleOutcome(status=status, message=message)

    async def revoke_login(self, login_id: str, *, expires_at: float) -> None:
        """End an operator-page login, in the store (so every replica, and a restart, knows)."""
        await self._store.revoke_token(login_id, expires_at=expires_at)

    async def login_revoked(self, login_id: str) -> bool:
        """Whether an operator-page login was ended (read from the store)."""
        return await self._store.token_revoked(login_id)

    # -- approval --------------------------------------------------------------------------
    async def approvals(self, *, limit: int = 200) -> list[ApprovalView]:
        """The requests waiting for a person, soonest expiry first."""
        return [approval_view(r) for r in await self._store.waiting_approvals(limit=limit)]

    async def approval(self, approval_id: str) -> tuple[ApprovalView, CallDetail] | None:
        """One request (waiting or decided) and its call, with the call's arguments while it
        waits (read from the live session: what the person decides on), or None."""
        record = await self._store.find_approval(approval_id)
        if record is None or record.approval is None:
            return None
        waiting = record.state is CallState.AWAITING_APPROVAL
        arguments = await self._arguments(record.key) if waiting else None
        return approval_view(record), self._detail(record, arguments=arguments)

    async def decide(
        self,
        approval_id: str,
        *,
        approve: bool,
        by: str,
        via: str,
        reason: str | None = None,
        digest: str | None = None,
    ) -> ApprovalView:
        """A person's decision through the dispatcher's rules (see
        :meth:`~agentfn_asgi.dispatch.approvals.Approvals.decide`; raises its
        :class:`~agentfn_asgi.errors.ApprovalError`)."""
        if self._dispatcher is None:
            raise ConfigurationError(
                "deciding an approval may submit a result: it needs the Agents API (OPENAI_API_KEY)"
            )
        return await self._dispatcher.approvals.decide(
            approval_id, approve=approve, by=by, via=via, reason=reason, digest=digest
        )

    async def notify_again(self, approval_id: str) -> ApprovalView:
        """Send a waiting request to ``on_approval_request`` again, with new links (see
        :meth:`~agentfn_asgi.dispatch.approvals.Approvals.notify_again`)."""
        if self._dispatcher is None:
            raise ConfigurationError("nobody to tell: this view runs no app")
        return await self._dispatcher.approvals.notify_again(approval_id)

    # -- helpers ---------------------------------------------------------------------------
    async def _find(self, call_id: str, session_id: str | None) -> CallRecord:
        found = await self._store.find_calls(call_id)
        if session_id is not None:
            found = [r for r in found if r.key.session_id == session_id]
        if not found:
            where = f" in session {session_id}" if session_id else ""
            raise CallNotFoundError(f"no call {call_id}{where} in the store")
        if len(found) > 1:
            sessions = ", ".join(sorted({r.key.session_id for r in found})[:5])
            raise OperatorInputError(
                f"call id {call_id} names calls of several sessions ({sessions}): give the session"
            )
        return found[0]

    async def _arguments(self, key: CallKey) -> str | None:
        # Arguments are not stored (they may hold personal data): while the call is pending
        # the live session still has them.
        if self._dispatcher is None:
            return None
        try:
            session = await self._dispatcher.client.retrieve_session(key.session_id)
        except (APIError, ValueError):
            return None
        action = session.pending_call(key.turn_id, key.call_id)
        if action is None:
            return None
        return json.dumps(action.arguments, ensure_ascii=False, default=str)

    def _summary(self, record: CallRecord) -> CallSummary:
        result = record.result
        return CallSummary(
            session_id=record.key.session_id,
            turn_id=record.key.turn_id,
            call_id=record.key.call_id,
            tool_name=record.tool_name,
            state="in_doubt"
            if in_doubt(record, now=self._clock(), margin=self._margin)
            else record.state.value,
            attempt=record.attempt,
            created_at=record.created_at,
            updated_at=record.updated_at,
            error_type=None if result is None else result.error_type,
            reason=record.reason,
            outcome=outcome_of(record, self._clock(), self._margin),
            limiter=None if record.limiter is None else limiter_label(record.limiter),
            waiting_since=record.waiting_since,
            counted=record.counted,
            kind=action_kind(record.tool_name),
        )

    def _detail(
        self,
        record: CallRecord,
        *,
        arguments: str | None,
        output: str | None = None,
        settleable: bool = False,
    ) -> CallDetail:
        return CallDetail(
            summary=self._summary(record),
            history=tuple(_event_view(e) for e in record.history),
            arguments=arguments,
            output=output,
            settleable=settleable,
            approval=None if record.approval is None else approval_view(record),
        )


def limiter_label(name: str) -> str:
    """A limiter's name as an operator reads it: ``tool``, or ``tool:key`` for a tool with a
    ``concurrency_key`` (a tool's name never holds a colon)."""
    return name.replace(LIMITER_KEY_SEPARATOR, ":")


def _event_view(event: CallEvent) -> CallEventView:
    return CallEventView(
        at=event.at, kind=event.kind, attempt=event.attempt, owner=event.owner, detail=event.detail
    )


def _delivery_view(delivery: DeliveryRecord) -> DeliveryView:
    return DeliveryView(
        delivery_id=delivery.delivery_id,
        session_id=delivery.session_id,
        received_at=delivery.received_at,
        resolved=delivery.resolved,
        attempts=delivery.attempts,
        next_attempt_at=None if delivery.resolved else delivery.next_attempt_at,
        last_error=delivery.last_error,
    )


def _output_of(record: CallRecord) -> str | None:
    """The saved output (or the error the model was told), as text; a too-large result's
    full output when one was kept."""
    result = record.result
    if result is None:
        return None
    if result.full_output is not None:
        return result.full_output
    try:
        event = json.loads(result.event_json)
    except ValueError:
        return result.event_json
    value = event.get("output") if result.success else event.get("error")
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _position(record: CallRecord) -> tuple[float, str, str, str]:
    """Where ``record`` stands in a listing (newest first: the largest first)."""
    key = record.key
    return record.created_at, key.session_id, key.turn_id, key.call_id


def _encode_cursor(position: tuple[float, str, str, str]) -> str:
    raw = json.dumps(list(position))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> tuple[float, str, str, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        at, session_id, turn_id, call_id = json.loads(raw)
        return float(at), str(session_id), str(turn_id), str(call_id)
    except (ValueError, TypeError, binascii.Error):
        raise OperatorInputError("not a cursor of this listing") from None
