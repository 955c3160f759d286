"""Running one call: claim → run → save → submit, and the in-doubt policy.

One task per pending call runs :meth:`Executor.run` from start to end: it takes a
concurrency slot, claims the call in the store, obtains a result (runs the handler, asks the
reconcile hook, hands the call to a worker queue, or decides a failure itself), saves it
durably and submits it, then gives the slot back. The slot is taken *before* the claim, so a
claimed call starts (and renews its lease) at once instead of waiting for a slot while its
lease runs out.

Flow control (a tool with ``concurrency=`` or ``rate=``): the claim also asks the tool's
limiter for a slot; a call it refuses waits, holding no slot, in
:mod:`agentfn_asgi.dispatch.limits`, and runs here when its turn comes.

In-doubt policy (a claim expired with no saved result, so the handler may have run): plain
tools run again (at-least-once); side-effect tools ask their ``reconcile`` hook: ``Ran`` → its
result is saved and submitted, ``NotRun`` → run now, ``Unknown`` (or no hook) → quarantine: by
default a model-safe failure is submitted, or with ``in_doubt="hold"`` the call is held for
an operator and nothing is sent.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import random
import secrets
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import anyio

from .._crash import crash_point
from .._threads import ThreadPool, ThreadPoolBusyError
from ..actions import (
    ConnectEnvironmentHook,
    EnvironmentConnection,
    SignInHook,
    SignInRequest,
    connect_environment,
    request_of,
    sign_in_answer,
)
from ..calls.records import (
    ApprovalRequest,
    CallKey,
    CallRecord,
    CallState,
    ClaimOutcome,
    ClaimStatus,
    Limit,
    SavedResult,
    arguments_digest,
)
from ..errors import (
    APIError,
    ArgumentValidationError,
    CompletionMismatchError,
    ConfigurationError,
    RetryLater,
    StoreError,
    StoreRefusedError,
    ToolError,
)
from ..messages import (
    APPROVAL_ARGUMENTS_CHANGED_MESSAGE,
    CALL_BUDGET_MESSAGE,
    ENQUEUE_FAILED_MESSAGE,
    IN_DOUBT_MESSAGE,
    INTERNAL_FAILURE_MESSAGE,
    JOB_DEADLINE_MESSAGE,
    RETRIED_SUFFIX,
    RETRY_LATER_EXHAUSTED_MESSAGE,
    STORE_REFUSED_MESSAGE,
    THREADS_BUSY_MESSAGE,
    TOO_MANY_ATTEMPTS_MESSAGE,
    UNKNOWN_TOOL_MESSAGE,
    UNREADABLE_ARGUMENTS_MESSAGE,
    error_type_for,
    model_error_message,
    timeout_message,
)
from ..results import (
    answer_result,
    encode_result,
    escape_surrogates,
    event_json,
    failure_result,
    submission_key,
)
from ..running import invoke, is_async_callable, run_reconcile
from ..store.base import Store
from ..tools import FunctionTool, NotRun, Ran, ReconcileOutcome, ToolContext, derive_idempotency_key
from ..tracing import Telemetry
from ..wire import ENVIRONMENT_PREFIX, FunctionCallAction
from .actions import RequestAnswers, saved_answer
from .alarms import call_fields
from .leases import Lease, LeaseKeeper, LeaseLostError
from .limits import NO_LIMIT, Admission, Turn, Waiter, limit_for
from .settings import DispatchSettings, ResolvedPolicy, resolve
from .submission import NOT_POSTED, SUBMITTED_BEFORE_SAVED, Submitter

__all__ = ["CompletionStatus", "Executor", "JobHandoff"]

logger = logging.getLogger("agentfn_asgi.dispatch.execution")

#: What :meth:`Executor.complete` decided about a worker's result (the completion endpoint
#: maps it to a status code).
CompletionStatus = Literal["accepted", "duplicate", "conflict", "stale", "unknown_tool"]


class JobHandoff(Protocol):
    """Hands a validated call of an ``enqueue=`` tool to its queue (see
    :mod:`agentfn_asgi.jobs`, which implements it for the app)."""

    async def hand_off(
        self,
        key: CallKey,
        tool: FunctionTool,
        arguments: dict[str, Any],
        context: ToolContext,
        *,
        owner: str,
        threads: ThreadPool,
    ) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class _Attempt:
    """One claimed attempt of a call, as :class:`Executor` carries it through its steps."""

    key: CallKey
    action: FunctionCallAction
    tool: FunctionTool | None
    number: int
    in_doubt: bool
    delivery_id: str | None
    lease: Lease
    #: When the call was first claimed.
    created_at: float
    #: The call's approval request, when it has one (decided ``approved`` for a run).
    approval: ApprovalRequest | None = None
    #: The limiter whose slot the attempt holds (flow control), if any.
    limiter: str | None = None
    #: Seconds the call waited for its limiter before this attempt (flow control).
    waited: float | None = None
    #: The result decided before anything runs (a wait past ``max_wait``, a
    #: ``concurrency_key`` that raised): saved and submitted as it is.
    preset: SavedResult | None = None
    #: Call budgets: the call was counted against its session's budget already (a retry, a
    #: takeover or a re-run of it is never counted again).
    counted: bool = False

    @property
    def approved(self) -> bool:
        return self.approval is not None and self.approval.decision == "approved"

    @property
    def runs(self) -> int:
        """The executions of the call this attempt makes up to: its attempts after the one
        that asked for approval (which ran nothing)."""
        return self.number - (0 if self.approval is None else self.approval.asked_at)

    @property
    def started_at(self) -> float:
        """When the call could first run (a retry policy's deadline counts from it): its
        approval, or its first claim."""
        decided = None if self.approval is None else self.approval.decided_at
        return self.created_at if decided is None else decided


@dataclass(frozen=True, slots=True)
class _Retry:
    """An attempt that asks for another one at ``at`` (Unix time), for ``reason``."""

    at: float
    reason: str
    error_type: str


#: How a lease lost to a cancellation says so (then the reason).
_CANCELLED = "cancelled: "
#: A worker's completion for a call in these states is not wanted (answered ``stale``).
_NOT_OWED = (CallState.STALE, CallState.CANCELLED)
#: A claim finds these done; a replica that answers the action now takes it up.
_TAKEN_UP = (CallState.UNANSWERED, CallState.RETIRED)
#: A claim with one of these statuses is ours to run.
_OURS = (ClaimStatus.CLAIMED, ClaimStatus.IN_DOUBT, ClaimStatus.RETRY)
#: The events that begin an occurrence of a turn-less action (its hook's runs count from it).
_OCCURRENCE_BEGINS = frozenset({"claimed", "taken_up"})


@dataclass(slots=True, kw_only=True, eq=False)
class Executor:
    """Claims, runs, saves and submits calls for one dispatcher; see the module docstring."""

    store: Store
    submitter: Submitter
    leases: LeaseKeeper
    settings: DispatchSettings
    owner: str
    telemetry: Telemetry
    resources: Any
    clock: Callable[[], float]
    handoff: JobHandoff | None
    answers: RequestAnswers
    #: Waits for a scheduled retry's time (a test's fake clock moves).
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep
    _slots: asyncio.Semaphore | None = field(default=None, init=False)
    _threads: ThreadPool = field(init=False)
    _running_since: dict[CallKey, float] = field(default_factory=dict, init=False)
    #: The sync ``connect_environment`` hook's run per action, until its thread ends.
    _connecting: dict[CallKey, asyncio.Future[Any]] = field(default_factory=dict, init=False)
    #: The lease of each attempt running here: :meth:`stop` loses it.
    _running: dict[CallKey, Lease] = field(default_factory=dict, init=False)
    #: Attempts running here per (session, turn): a result with siblings still running
    #: waits one loop turn for those saved with it, to go in one POST.
    _turn_running: Counter[tuple[str, str]] = field(default_factory=Counter, init=False)
    _policies: dict[str, ResolvedPolicy] = field(default_factory=dict, init=False)
    #: Calls this process just held for a person (their span's source is ``approval``).
    _held_for_approval: set[CallKey] = field(default_factory=set, init=False)
    #: Called with each new approval request (the app's notifier), never awaited here.
    on_approval_request: Callable[[CallRecord], None] | None = None
    #: Called with a request whose write may or may not have happened (its answer lost,
    #: the store not read back): the notifier reads it again later.
    on_approval_unconfirmed: Callable[[CallKey, ApprovalRequest], None] | None = None
    _closing: bool = field(default=False, init=False)
    _closed: asyncio.Event | None = field(default=None, init=False)
    _waiter: Waiter = field(init=False)

    def __post_init__(self) -> None:
        self._threads = ThreadPool(self.settings.thread_pool_size)
        self._waiter = Waiter(
            self.store, self.settings, self.telemetry, owner=self.owner, clock=self.clock
        )

    def close(self) -> None:
        """Claim nothing more: call tasks that have not claimed yet give up (shutdown), and
        those waiting for a scheduled retry stop waiting (the retry stays in the store)."""
        self._closing = True
        if self._closed is not None:
            self._closed.set()
        self._waiter.close()

    def shutdown(self) -> None:
        """Release the thread pool (threads still running finish in the background)."""
        self._threads.shutdown()

    def start(self) -> None:
        """Create the concurrency bounds (on the running loop)."""
        self._slots = asyncio.Semaphore(self.settings.max_concurrency)
        self._closed = asyncio.Event()

    def stop(self, key: CallKey, reason: str) -> bool:
        """Stop the attempt of ``key`` running here, if one is (its call was cancelled):
        an async handler is cancelled, a synchronous one sees ``ctx.cancelled``, and nothing
        it returns is saved. Whether one was running."""
        lease = self._running.get(key)
        if lease is None:
            return False
        lease.lose(_CANCELLED + reason)
        return True

    def oldest_running_age(self) -> float | None:
        """Seconds since the oldest call still running here started, or None."""
        if not self._running_since:
            return None
        return time.monotonic() - min(self._running_since.values())

    # -- one call --------------------------------------------------------------------------
    async def run(
        self,
        key: CallKey,
        action: FunctionCallAction,
        tool: FunctionTool | None,
        delivery_id: str | None,
        claimed: asyncio.Future[None],
        *,
        resolves: bool = False,
    ) -> None:
        """Claim ``key`` and see it through (the whole life of one call task).

        ``claimed`` is resolved once the claim is decided in the store (or fails with the
        store's error), so the resolver marks a delivery resolved only after every call it
        names is durably claimed: a crash in between leaves claims for the sweep to find.
        With ``resolves``, the first claim resolves ``delivery_id`` in the same store step.
        A retry scheduled in the store (by this attempt or an earlier one) is waited for
        here, holding no slot and no thread, and claimed at its time: whichever replica
        claims it first runs it.
        """
        try:
            admission = await self._admit(key, action, tool)
            if isinstance(admission, str):  # nobody here answers it: recorded, and left
                await self._leave(key, action, delivery_id, claimed, why=admission)
                return
            due = await self._claim_and_run(
                key, action, tool, delivery_id, claimed, admission, resolves=resolves
            )
            await self._follow_retries(key, action, tool, due, admission)
        finally:
            if not claimed.done():  # cancelled before the claim was decided
                claimed.cancel()

    async def _leave(
        self,
        key: CallKey,
        action: FunctionCallAction,
        delivery_id: str | None,
        claimed: asyncio.Future[None],
        *,
        why: str,
    ) -> None:
        """Record an action nobody here answers as ``unanswered`` (claimed, then left), so
        that it is seen with its age; one already recorded is left as it is. A retired
        turn-less action (its previous occurrence ended) is taken up and left again."""
        claim = await self._claim(key, action, delivery_id, claimed, None, False)
        if claim is None:
            return
        status, record = await self._taken_up(claim[0], (CallState.RETIRED,))
        if status is ClaimStatus.SAVED:
            await self.resubmit(record, delivery_id)  # answered here before: owed still
            return
        if status in _OURS:
            try:
                await self.store.leave(key, owner=self.owner, attempt=record.attempt, reason=why)
            except StoreError as exc:  # its claim lapses; the sweep's read leaves it again
                logger.warning("recording action %s as unanswered failed: %s", key, exc)

    async def _follow_retries(
        self,
        key: CallKey,
        action: FunctionCallAction,
        tool: FunctionTool | None,
        due: float | None,
        admission: Admission,
    ) -> None:
        """Wait for each scheduled retry's time, then claim and run it (flow control)."""
        while due is not None and not self._closing:
            # The store's `due` guard refuses a claim before the time, so waking a little
            # early (another clock) only means waiting again.
            await self._wait_unless_closed(max(0.0, due - self.clock()))
            if self._closing:
                return  # the retry stays scheduled in the store for the next process
            due = await self._claim_and_run(key, action, tool, None, None, admission)

    async def _wait_unless_closed(
        self, seconds: float, *, freed: asyncio.Event | None = None
    ) -> None:
        """Sleep ``seconds``, or until :meth:`close`: a waiting retry never holds up a
        shutdown (it stays scheduled in the store for whoever runs next). With ``freed`` (a
        limiter's line's bell), also until a call holding one of its slots ends here."""
        events = [self._closed]
        if freed is not None:
            events.append(freed)
        async with anyio.create_task_group() as group:

            async def stop_when_set(event: asyncio.Event | None) -> None:
                if event is not None:
                    await event.wait()
                group.cancel_scope.cancel()

            for event in events:
                group.start_soon(stop_when_set, event)
            await self.sleep(seconds)
            group.cancel_scope.cancel()

    async def _claim_and_run(
        self,
        key: CallKey,
        action: FunctionCallAction,
        tool: FunctionTool | None,
        delivery_id: str | None,
        claimed: asyncio.Future[None] | None,
        admission: Admission = NO_LIMIT,
        *,
        resolves: bool = False,
    ) -> float | None:
        """One claim and, if it is ours, one attempt (after a wait for the tool's limiter,
        holding no slot); with ``resolves``, the claim resolves ``delivery_id`` too. The
        time of the retry to wait for (scheduled by this attempt, or found scheduled and
        not due yet), else None."""
        assert self._slots is not None, "start() first"
        limit = admission.limit
        async with self._slots:
            if self._closing:
                return None  # shutting down: the call stays for the next process
            sent = time.monotonic()
            claim = await self._claim(key, action, delivery_id, claimed, limit, resolves)
            if claim is None:
                return None
            outcome, refused = claim
            if refused is not None:
                limit, admission = None, Admission(failure=refused)
            # Left unanswered before (no policy or hook then, or another occurrence):
            # answered here now. Only a read that lists it says so, never a retry's claim.
            status, record = await self._taken_up(outcome, _TAKEN_UP if claimed is not None else ())
            if status in _OURS:
                crash_point("after_claim", action.name)
                attempt = self._attempt(
                    record,
                    action,
                    tool,
                    sent=sent,
                    delivery_id=delivery_id,
                    in_doubt=status is ClaimStatus.IN_DOUBT,
                    admission=admission,
                )
                return await self._execute(attempt)
            if status is ClaimStatus.SAVED:
                await self.resubmit(record, delivery_id)
            elif record.state is CallState.RETRY_SCHEDULED:
                return record.due_at  # its next attempt's time
            if status is not ClaimStatus.WAITING or limit is None or tool is None:
                return None
        # Waiting for the limiter: the process slot is free for others meanwhile.
        return await self._wait_for_turn(record, action, tool, limit, delivery_id, sent)

    async def _taken_up(
        self, outcome: ClaimOutcome, states: tuple[CallState, ...]
    ) -> tuple[ClaimStatus, CallRecord]:
        """The claim's status and record; a record in one of ``states`` (which the claim
        finds ``DONE``) taken up first: a fresh attempt, ours, when no one took it before."""
        status, record = outcome.status, outcome.record
        if status is ClaimStatus.DONE and record.state in states:
            try:
                taken = await self.store.take_up(
                    record.key, owner=self.owner, lease_seconds=self.settings.lease_seconds
                )
            except StoreError as exc:  # left as it is: the next read that lists it tries again
                logger.warning("taking up call %s failed: %s", record.key, exc)
                taken = None
            if taken is not None:
                return ClaimStatus.CLAIMED, taken
        return status, record

    async def _claim(
        self,
        key: CallKey,
        action: FunctionCallAction,
        delivery_id: str | None,
        claimed: asyncio.Future[None] | None,
        limit: Limit | None,
        resolves: bool,
    ) -> tuple[ClaimOutcome, SavedResult | None] | None:
        """The store's claim of ``key``, and None; or, when the store refuses a value the
        call carries (the model's: a function name with a NUL, which PostgreSQL cannot
        hold), the claim taken again without the limit and with the name made storable, and
        the failure to save instead of running: the same claim would be refused for ever,
        an outage that never ends. ``claimed`` (None: a retry's claim) is told the claim
        was decided, or its failure (then None is returned)."""
        claim = functools.partial(
            self.store.claim_call,
            key,
            owner=self.owner,
            lease_seconds=self.settings.lease_seconds,
            delivery_id=delivery_id,
            margin=self.settings.fence_margin,
            resolves_delivery=resolves,
        )
        refused = None
        try:
            try:
                outcome = await claim(tool_name=action.name, limit=limit)
            except StoreRefusedError as exc:
                logger.error("call %s: the store refused it, so it fails: %s", key, exc)
                name = escape_surrogates(action.name).replace("\0", "\\x00")
                message = STORE_REFUSED_MESSAGE.format(name=name)
                refused = failure_result(key, message, "store_refused")
                outcome = await claim(tool_name=name, limit=None)
        except Exception as exc:
            if claimed is None:  # the sweep finds the due retry
                logger.warning("claiming the retry of call %s failed: %s", key, exc)
            else:
                claimed.set_exception(exc)  # the resolver reports it
            return None
        if claimed is not None:
            claimed.set_result(None)
        return outcome, refused

    async def _wait_for_turn(
        self,
        record: CallRecord,
        action: FunctionCallAction,
        tool: FunctionTool,
        limit: Limit,
        delivery_id: str | None,
        sent: float,
    ) -> float | None:
        """Wait for the ``waiting`` call ``record``'s turn (:class:`Waiter`), then run it
        as a fresh attempt (nothing ran while it waited), or save its ``max_wait``
        failure."""
        assert self._slots is not None

        async def run(turn: Turn) -> float | None:
            admitted = Admission(
                limit=limit if turn.failure is None else None, failure=turn.failure
            )
            attempt = self._attempt(
                turn.record,
                action,
                tool,
                sent=turn.sent,
                delivery_id=delivery_id,
                admission=admitted,
                waited=turn.waited,
            )
            return await self._execute(attempt)

        return await self._waiter.wait(
            record,
            limit,
            sent=sent,
            max_wait=self._policy(tool).max_wait,
            slots=self._slots,
            closing=lambda: self._closing,
            nap=lambda seconds, freed: self._wait_unless_closed(seconds, freed=freed),
            run=run,
        )

    async def rerun(
        self,
        record: CallRecord,
        action: FunctionCallAction,
        tool: FunctionTool | None,
        *,
        claimed_at: float,
    ) -> None:
        """Run a call an operator released, or a person approved (claimed for us, next
        attempt) as a fresh attempt: no reconcile hook is asked, a person decided.
        ``claimed_at`` is the monotonic time the release (or the claim) was sent."""
        assert self._slots is not None, "start() first"
        approved = record.approval is not None and record.approval.decision == "approved"
        admission = await self._admit(record.key, action, tool, approved=approved)
        if isinstance(admission, str):
            # An operator's re-run of a request asks the policy again; left, it is
            # recorded unanswered (the re-run's claim is ours).
            await self.store.leave(
                record.key, owner=self.owner, attempt=record.attempt, reason=admission
            )
            return
        limit = admission.limit
        due: float | None = None
        async with self._slots:
            if limit is not None:
                # Its limiter is asked as for any claim: the call runs when its turn comes.
                try:
                    asked = await self._waiter.ask(record.key, attempt=record.attempt, limit=limit)
                except StoreError as exc:
                    # Claimed and never run: the sweep takes it over once its lease lapses.
                    logger.warning("call %s: asking its limiter failed: %s", record.key, exc)
                    return
                if asked is None:
                    return  # not ours any more
                outcome, claimed_at = asked
                record = outcome.record
            if record.state is not CallState.WAITING:
                attempt = self._attempt(record, action, tool, sent=claimed_at, admission=admission)
                due = await self._execute(attempt)
        if record.state is CallState.WAITING and limit is not None and tool is not None:
            due = await self._wait_for_turn(record, action, tool, limit, None, claimed_at)
        await self._follow_retries(record.key, action, tool, due, admission)

    async def _admit(
        self,
        key: CallKey,
        action: FunctionCallAction,
        tool: FunctionTool | None,
        *,
        approved: bool = False,
    ) -> Admission | str:
        """The word on a call before its claim: flow control's for a function call (a tool
        without limits never asks it); for a request, the policy's, or why nobody here
        answers it. A request a person ``approved`` is answered, never limited."""
        if action.request_type is not None:
            return NO_LIMIT if approved else await self.answers.admission(key, action)
        if tool is None or not tool.policy.limited:
            return NO_LIMIT
        return await limit_for(key, action, tool, self.resources)

    def _attempt(
        self,
        record: CallRecord,
        action: FunctionCallAction,
        tool: FunctionTool | None,
        *,
        sent: float,
        admission: Admission,
        delivery_id: str | None = None,
        in_doubt: bool = False,
        waited: float | None = None,
    ) -> _Attempt:
        """The attempt ``record``'s claim (sent at monotonic ``sent``) holds: fenced by its
        lease, holding its limiter's slot when ``admission`` gave it one, or carrying the
        failure flow control decided instead of running."""
        return _Attempt(
            key=record.key,
            action=action,
            tool=tool,
            number=record.attempt,
            in_doubt=in_doubt,
            delivery_id=delivery_id,
            lease=self.leases.lease(record.key, attempt=record.attempt, claimed_at=sent),
            created_at=record.created_at,
            approval=record.approval,
            limiter=None if admission.limit is None else admission.limit.name,
            waited=waited,
            preset=admission.failure,
            counted=record.counted is not None,
        )

    async def _execute(self, attempt: _Attempt) -> float | None:
        """Run one claimed attempt to its end: saved and submitted, held, handed off, or a
        retry scheduled in the store (its time is returned)."""
        key, action, tool = attempt.key, attempt.action, attempt.tool
        woken = False  # the slot's next waiter here was told
        self._running_since[key] = time.monotonic()
        self._running[key] = attempt.lease
        turn = (key.session_id, key.turn_id)
        self._turn_running[turn] += 1
        span_scope = self.telemetry.tool_call(
            tool_name=action.name,
            session_id=key.session_id,
            turn_id=key.turn_id,
            call_id=key.call_id,
            attempt=attempt.number,
            delivery_link=self.telemetry.link_for_delivery(attempt.delivery_id),
            description=tool.description if tool is not None else None,
        )
        try:
            with span_scope as span:
                span.set_arguments(action.arguments)
                if attempt.approval is not None:
                    span.note_approval(attempt.approval)
                if attempt.waited is not None:
                    span.note_wait(attempt.waited)
                try:
                    result = await self._obtain_result_safely(attempt)
                    if result is not None:
                        # Nothing produced after the lease was lost may be saved.
                        self.leases.check(attempt.lease)
                except LeaseLostError as exc:
                    why = await self._cancelled(key)
                    if why is not None:
                        logger.info("call %s of %s stopped: cancelled: %s", key, action.name, why)
                        span.note_cancelled(why)
                        return None
                    logger.error("call %s: %s; its outcome is dropped, not saved", key, exc)
                    span.set_error("lease_lost")
                    return None
                if result is None:
                    # Handed to a worker queue, held for an operator or for a person's
                    # approval: no result yet.
                    if key in self._held_for_approval:
                        self._held_for_approval.discard(key)
                        span.set_source("approval")
                    else:
                        queued = tool is not None and tool.enqueue is not None
                        span.set_source("queued" if queued else "held")
                    return None
                if isinstance(result, _Retry):
                    return await self._schedule_retry(attempt, result, span)
                crash_point("after_handler", action.name)
                record = await self.store.save_result(
                    key,
                    owner=self.owner,
                    attempt=attempt.number,
                    result=result,
                    duration=time.monotonic() - self._running_since[key],
                )
                crash_point("after_save", action.name)
                if attempt.limiter is not None:
                    # Saved, it holds no slot: the next in line here asks now, not after
                    # the submission.
                    woken = True
                    self._waiter.wake(attempt.limiter)
                if record.attempt != attempt.number or record.result != result:
                    _log_superseded(record, attempt.number, mine=result)
                if record.result is not None:
                    span.record_result(record.result)
                submitted = await self.submitter.submit(
                    record, attempt.delivery_id, together=self._turn_running[turn] > 1
                )
                _log_finished(record, submitted, time.monotonic() - self._running_since[key])
        except (APIError, StoreError) as exc:
            logger.warning("call %s left for recovery: %s", key, exc)
        finally:
            self._running_since.pop(key, None)
            if self._running.get(key) is attempt.lease:
                del self._running[key]
            self._turn_running[turn] -= 1
            if not self._turn_running[turn]:
                del self._turn_running[turn]
            if attempt.limiter is not None and not woken:
                self._waiter.wake(attempt.limiter)  # its slot is free (or will be, lease lapsed)
        return None

    async def _schedule_retry(self, attempt: _Attempt, retry: _Retry, span: Any) -> float | None:
        """Keep the next attempt's time in the store (only while our claim stands)."""
        span.set_error(retry.error_type)
        span.set_source("retry_scheduled")
        scheduled = await self.store.schedule_retry(
            attempt.key, owner=self.owner, attempt=attempt.number, at=retry.at, reason=retry.reason
        )
        if not scheduled:
            logger.warning(
                "call %s: attempt %d was superseded; no retry", attempt.key, attempt.number
            )
            return None
        logger.info(
            "call %s of %s: attempt %d failed (%s); retry at %.3f",
            attempt.key,
            attempt.action.name,
            attempt.number,
            retry.reason,
            retry.at,
        )
        return retry.at

    async def resubmit(
        self,
        record: CallRecord,
        delivery_id: str | None = None,
        *,
        together: bool = False,
        source: str | None = "saved",
    ) -> None:
        """Submit a saved result again, as its own attempt span (``source``: ``saved``, or
        None for a worker's result: its own); ``together``: with the results of its turn
        resubmitted in the same loop turn."""
        key = record.key
        with self.telemetry.tool_call(
            tool_name=record.tool_name,
            session_id=key.session_id,
            turn_id=key.turn_id,
            call_id=key.call_id,
            attempt=record.attempt,
            delivery_link=self.telemetry.link_for_delivery(delivery_id),
        ) as span:
            if record.result is not None:
                span.record_result(record.result, source)
            started = time.monotonic()
            try:
                submitted = await self.submitter.submit(record, delivery_id, together=together)
            except (APIError, StoreError) as exc:
                logger.warning("submitting %s failed; the recovery sweep retries it: %s", key, exc)
                return
            _log_finished(record, submitted, time.monotonic() - started, source=source)

    # -- obtaining a result ----------------------------------------------------------------
    async def _obtain_result_safely(self, attempt: _Attempt) -> SavedResult | _Retry | None:
        """:meth:`_obtain_result`, with any failure the package did not foresee turned into
        a saved, model-facing failure: a claim left to expire would run it again, and again.
        A store outage and a lost lease are the exceptions: the call is left for recovery."""
        try:
            return await self._obtain_result(attempt)
        except (StoreError, LeaseLostError):
            raise
        except Exception:
            logger.exception(
                "obtaining the result of call %s failed; answering a failure", attempt.key
            )
            if attempt.action.request_type is not None:  # a request is refused, never approved
                return saved_answer(attempt.key, attempt.action.name, "deny", source="policy")
            return failure_result(attempt.key, INTERNAL_FAILURE_MESSAGE, "internal_error")

    async def _obtain_result(self, attempt: _Attempt) -> SavedResult | _Retry | None:
        key, action, tool = attempt.key, attempt.action, attempt.tool
        if attempt.preset is not None:
            return attempt.preset  # decided before it could run (flow control, the policy)
        if action.request_type == "environment_connection":
            return await self._connect(attempt)
        if action.request_type is not None:
            return await self._answer_request(attempt)
        if tool is None:
            message = UNKNOWN_TOOL_MESSAGE.format(name=action.name)
            return failure_result(key, message, "unknown_tool")
        if action.unreadable is not None:
            message = UNREADABLE_ARGUMENTS_MESSAGE.format(reason=action.unreadable)
            return failure_result(key, message, "validation_error")
        policy = self._policy(tool)
        if attempt.in_doubt and attempt.runs > policy.max_attempts:
            started = attempt.runs - 1
            logger.error(
                "call %s of %s was started %d times and never finished; not running it again",
                key,
                tool.name,
                started,
            )
            message = TOO_MANY_ATTEMPTS_MESSAGE.format(attempts=started)
            return await self._hold_or(
                attempt,
                failure_result(key, message, "too_many_attempts", source="quarantined"),
                hold=tool.side_effects and policy.in_doubt == "hold",
                reason=f"started {started} times, never finished",
            )
        context = self._context(attempt, tool)
        try:
            arguments = tool.parse_arguments(action.arguments)
        except ArgumentValidationError as exc:
            return failure_result(
                key, model_error_message(exc, tool_name=tool.name), "validation_error"
            )
        over_budget = await self._over_budget(attempt, tool)
        if over_budget is not None:
            return over_budget  # before an approval is asked: a person never sees it
        if attempt.approved:
            assert attempt.approval is not None
            if arguments_digest(action.arguments) != attempt.approval.digest:
                message = APPROVAL_ARGUMENTS_CHANGED_MESSAGE.format(name=tool.name)
                return failure_result(key, message, "approval_mismatch", source="approval")
        elif tool.approval is not False and await tool.needs_approval(context, arguments):
            # Before any in-doubt reconcile: a call never approved never ran.
            return await self._request_approval(
                attempt, name=tool.name, lapses_in=self._policy(tool).approval_timeout
            )
        if attempt.in_doubt and tool.enqueue is not None:
            # Past its job deadline, its job may still be running: fail the call rather than
            # queue it again (before it, its claim expired early: the process died between
            # claiming it and handing over its job).
            record = await self.store.get_call(key)
            if record is None or self.clock() >= record.created_at + tool.job_deadline:
                return failure_result(key, JOB_DEADLINE_MESSAGE, "job_deadline", source="worker")
        if attempt.in_doubt and tool.side_effects:
            # The lease must outlive a slow reconcile hook, or another replica takes the call
            # over, reconciles from the same state, and runs the side effect a second time.
            async with self.leases.kept(attempt.lease):
                verdict = await self._reconcile(tool, arguments, context)
            if isinstance(verdict, Ran):
                return self._encode(key, tool, verdict.result, source="reconciled")
            if not isinstance(verdict, NotRun):
                logger.warning(
                    "side-effect call %s of %s is in doubt and could not be reconciled (%s); "
                    "policy=%s",
                    key,
                    tool.name,
                    verdict.reason or "no reconcile hook",
                    policy.in_doubt,
                )
                return await self._hold_or(
                    attempt,
                    failure_result(key, IN_DOUBT_MESSAGE, "in_doubt", source="quarantined"),
                    hold=policy.in_doubt == "hold",
                    reason=verdict.reason or "in doubt",
                )
        if tool.enqueue is not None:
            return await self._hand_off(attempt, tool, arguments, context)
        return await self._run(attempt, tool, arguments, context)

    async def _over_budget(self, attempt: _Attempt, tool: FunctionTool) -> SavedResult | None:
        """Call budgets (``max_calls_per_session``): a call not counted yet is counted in
        the store against its session's budget of the tool before it first runs; past the
        budget, the failure to save instead of running it (None: it may run)."""
        budget = tool.policy.max_calls_per_session
        if budget is None or attempt.counted:
            return None
        key = attempt.key
        self.leases.check(attempt.lease)
        record = await self.store.count_call(
            key, owner=self.owner, attempt=attempt.number, budget=budget
        )
        if record is not None and record.counted is not None:
            return None
        # Refused (or no longer ours: the failure's save is then fenced off).
        fields = call_fields(key, tool.name, budget=budget)
        logger.info(
            "call over its session's budget: tool=%(tool)s session=%(session_id)s "
            "call=%(call_id)s budget=%(budget)d",
            fields,
            extra={"agentfn": fields},
        )
        message = CALL_BUDGET_MESSAGE.format(name=tool.name, budget=budget)
        return failure_result(key, message, "call_budget", source="limit")

    async def _answer_request(self, attempt: _Attempt) -> SavedResult | None:
        """An approval request the policy asked a person about: held for them, or, once
        approved, its approval (bound to the request the person saw)."""
        key, name = attempt.key, attempt.action.name
        if name.startswith("sign_in:") and self.answers.sign_in is not None:
            return await self._sign_in(attempt, self.answers.sign_in)
        if not attempt.approved:
            return await self._request_approval(
                attempt, name=name, lapses_in=self.settings.approval_timeout
            )
        assert attempt.approval is not None
        if arguments_digest(attempt.action.arguments) != attempt.approval.digest:
            return saved_answer(key, name, "deny", source="approval")
        return saved_answer(key, name, "approve", source="approval")

    async def _connect(self, attempt: _Attempt) -> SavedResult | _Retry | None:
        """Run the ``connect_environment`` hook (idempotent: at least once per occurrence).
        Its answer is recorded and never POSTed: the API learns of the connection from the
        environment. A hook that raises or runs past the app's default timeout is run again
        as a retry scheduled in the store (the sweep's backoff, ``retry_base`` doubling),
        holding no slot while it waits; after ``max_attempts`` runs the action is left
        ``unanswered`` saying so: shown, and taken up by the next read that lists it."""
        hook = self.answers.connect_environment
        assert hook is not None
        key, action = attempt.key, attempt.action
        request = EnvironmentConnection(
            session_id=key.session_id,
            environment_id=action.call_id.removeprefix(ENVIRONMENT_PREFIX),
            environment=action.arguments if isinstance(action.arguments, dict) else None,
        )
        try:
            async with self.leases.kept(attempt.lease):
                await self._run_connect(key, hook, request)
        except LeaseLostError:
            raise
        except Exception as exc:
            return await self._connect_failed(attempt, exc)
        event = {"type": "environment_connection", "environment_id": request.environment_id}
        return answer_result(key, event, error_type=None, source=NOT_POSTED)

    async def _connect_failed(self, attempt: _Attempt, exc: Exception) -> _Retry | None:
        """The hook's run failed: another one at the backoff's time, or, after
        ``max_attempts`` runs in this occurrence, the action left ``unanswered``."""
        key, runs = attempt.key, await self._runs_this_occurrence(attempt.key)
        error = "timeout" if isinstance(exc, TimeoutError) else "hook_error"
        if runs < self.settings.max_attempts:
            logger.warning(
                "the connect_environment hook failed for %s (run %d of %d): %s",
                key,
                runs,
                self.settings.max_attempts,
                type(exc).__name__,
            )
            at = self.clock() + self.settings.retry_delay(runs)
            return _Retry(at=at, reason=type(exc).__name__, error_type=error)
        logger.error(
            "the connect_environment hook failed for %s %d times; left unanswered",
            key,
            runs,
            exc_info=exc,
        )
        self.leases.check(attempt.lease)
        reason = f"the connect_environment hook failed {runs} times"
        await self.store.leave(key, owner=self.owner, attempt=attempt.number, reason=reason)
        return None

    async def _runs_this_occurrence(self, key: CallKey) -> int:
        """The hook's runs in the occurrence so far, this one included: one more than the
        retries its history shows since the occurrence's first claim (or take-up)."""
        record = await self.store.get_call(key, history=True)
        kinds = [event.kind for event in (record.history if record is not None else ())]
        began = max((i for i, kind in enumerate(kinds) if kind in _OCCURRENCE_BEGINS), default=0)
        return 1 + kinds[began:].count("retry_scheduled")

    async def _run_connect(
        self, key: CallKey, hook: ConnectEnvironmentHook, request: EnvironmentConnection
    ) -> None:
        """The hook under the app's default timeout: an async one on the loop (cancelled
        past it), a sync one in the sync handlers' thread pool (it may block: start a
        machine, call an API). A sync run past its time limit keeps its thread: the next
        run for the same action waits for it (within its own time limit), never beside it."""
        with anyio.fail_after(self.settings.default_timeout):
            if is_async_callable(hook):
                await connect_environment(hook, request)
                return
            previous = self._connecting.get(key)
            if previous is not None:
                await asyncio.wait({previous})
            run = asyncio.ensure_future(
                self._threads.run(hook, request, wait_limit=self.settings.thread_wait)
            )
            self._connecting[key] = run
            run.add_done_callback(functools.partial(self._connect_ended, key))
            answer = await asyncio.shield(run)
            if inspect.isawaitable(answer):
                await answer

    def _connect_ended(self, key: CallKey, run: asyncio.Future[Any]) -> None:
        if self._connecting.get(key) is run:
            del self._connecting[key]
        if not run.cancelled():
            run.exception()  # retrieved: its caller may have stopped waiting for it

    async def _sign_in(self, attempt: _Attempt, hook: SignInHook) -> SavedResult | None:
        """Ask the host's sign-in hook now and submit its values from memory, then keep only
        the redacted answer (its source says it was submitted before it was saved). A
        failure to submit keeps nothing: the call is taken over, and the hook asked again."""
        key = attempt.key
        request = request_of(key.session_id, attempt.action)
        assert isinstance(request, SignInRequest)
        try:
            async with self.leases.kept(attempt.lease):
                answer = await sign_in_answer(hook, request)
        except LeaseLostError:
            raise
        except Exception as exc:
            # No exc_info: a hook's exception may quote the values.
            logger.error("the sign-in hook failed on %s (%s); cancelling", key, type(exc).__name__)
            answer = None
        if answer is None:
            return saved_answer(key, attempt.action.name, "cancel", source="policy")
        event, redacted = answer
        stored = event_json(redacted)
        idempotency_key = submission_key(key, stored)
        self.leases.check(attempt.lease)
        try:
            outcome = await self.submitter.submit_unsaved(key, event_json(event), idempotency_key)
        except APIError as exc:
            # Nothing is kept: once the claim lapses, its taker asks the hook again.
            logger.warning("submitting the sign-in answer of %s failed: %s", key, exc)
            return None
        finally:
            del event, answer  # the values live no longer than the request
        if outcome == "stale":
            # Answered meanwhile, or its turn ended: owed no longer, and nothing to keep.
            reason = "the session no longer waits for this sign-in"
            await self.store.cancel(key, owner=self.owner, reason=reason, known_before=self.clock())
            return None
        if outcome == "refused":
            logger.error("the API refused the sign-in answer of %s; cancelling the request", key)
            return saved_answer(key, attempt.action.name, "cancel", source="policy")
        return answer_result(key, redacted, error_type=None, source=SUBMITTED_BEFORE_SAVED)

    async def _request_approval(
        self, attempt: _Attempt, *, name: str, lapses_in: float
    ) -> SavedResult | None:
        """Hold the call for a person (``awaiting_approval``) if our claim still stands."""
        key, store = attempt.key, self.store
        now = self.clock()
        request = ApprovalRequest(
            approval_id="apr_" + secrets.token_hex(12),
            tool_name=name,
            digest=arguments_digest(attempt.action.arguments),
            requested_at=now,
            expires_at=now + lapses_in,
            asked_at=attempt.number,
        )
        self.leases.check(attempt.lease)
        try:
            record = await store.request_approval(
                key, owner=self.owner, attempt=attempt.number, request=request
            )
        except StoreError:
            # The answer was lost and the store could not be read back: the request may be
            # waiting all the same, so whoever tells of requests looks again later.
            if self.on_approval_unconfirmed is not None:
                self.on_approval_unconfirmed(key, request)
            raise
        if record.approval != request:
            return None  # our claim was taken over meanwhile: its holder decides
        self._held_for_approval.add(key)
        fields = call_fields(key, name, approval_id=request.approval_id, approval="requested")
        logger.info(
            "call waiting for approval: tool=%(tool)s session=%(session_id)s call=%(call_id)s "
            "approval_id=%(approval_id)s expires_in=%(expires_in).0fs",
            {**fields, "expires_in": lapses_in},
            extra={"agentfn": fields},
        )
        if self.on_approval_request is not None:
            self.on_approval_request(record)
        return None

    def _context(self, attempt: _Attempt, tool: FunctionTool) -> ToolContext:
        key = attempt.key
        timeout = self._policy(tool).timeout
        return ToolContext(
            session_id=key.session_id,
            turn_id=key.turn_id,
            call_id=key.call_id,
            tool_name=tool.name,
            attempt=attempt.runs,
            deadline=None if timeout is None else self.clock() + timeout,
            idempotency_key=derive_idempotency_key(key.session_id, key.turn_id, key.call_id),
            resources=self.resources,
            cancelled=attempt.lease.cancelled,
        )

    def _policy(self, tool: FunctionTool) -> ResolvedPolicy:
        """The tool's policy merged with our settings (merged once per policy)."""
        resolved = self._policies.get(tool.name)
        if resolved is None or resolved.policy is not tool.policy:
            resolved = self._policies[tool.name] = resolve(tool.policy, self.settings)
        return resolved

    async def _run(
        self, attempt: _Attempt, tool: FunctionTool, arguments: dict[str, Any], context: ToolContext
    ) -> SavedResult | _Retry:
        key = attempt.key
        policy = self._policy(tool)
        timeout = policy.timeout
        try:
            async with self.leases.kept(attempt.lease):
                value = await invoke(
                    tool,
                    arguments,
                    context,
                    threads=self._threads,
                    time_limit=timeout,
                    wait_limit=policy.thread_wait,
                )
        except LeaseLostError:
            if tool.side_effects and await self._cancelled(key) is not None:
                await self._tell_reconcile(tool, arguments, context)
            raise
        except RetryLater as exc:
            return self._retry_or_fail(attempt, tool, policy, exc, after=exc.after)
        except ThreadPoolBusyError:
            wait = policy.thread_wait
            logger.error(
                "no thread free for tool %s (call %s) within %g s: %d of %d threads busy "
                "(hung sync handlers keep their threads)",
                tool.name,
                key,
                wait,
                self._threads.busy,
                self._threads.size,
            )
            message = THREADS_BUSY_MESSAGE.format(name=tool.name, seconds=wait)
            return failure_result(key, message, "threads_busy")
        except TimeoutError:
            assert timeout is not None
            return failure_result(key, timeout_message(tool.name, timeout), "timeout")
        except (ToolError, ArgumentValidationError) as exc:
            return failure_result(
                key, model_error_message(exc, tool_name=tool.name), error_type_for(exc)
            )
        except Exception as exc:
            retry = policy.retry
            if retry is not None and not tool.side_effects and retry.is_transient(exc):
                # Never for side-effect tools: only the handler knows nothing happened.
                logger.warning(
                    "tool %s failed transiently for call %s", tool.name, key, exc_info=True
                )
                return self._retry_or_fail(attempt, tool, policy, exc, after=None)
            logger.exception("tool %s failed for call %s", tool.name, key)
            return failure_result(
                key, model_error_message(exc, tool_name=tool.name), "handler_error"
            )
        return self._encode(key, tool, value, source="ran")

    async def _cancelled(self, key: CallKey) -> str | None:
        """Why ``key`` was cancelled (its lease lost because its turn ended, or a turn-less
        action's occurrence did, here or as another replica found), or None. A store that
        cannot say counts as not cancelled."""
        lease = self._running.get(key)
        if lease is not None and (lease.lost or "").startswith(_CANCELLED):
            return (lease.lost or "").removeprefix(_CANCELLED)
        try:
            record = await self.store.get_call(key)
        except StoreError:
            return None
        if record is not None and record.state is CallState.RETIRED:
            return "the session no longer waits for it (its occurrence ended)"
        if record is None or record.state is not CallState.CANCELLED:
            return None
        return record.reason or "cancelled"

    async def _reconcile(
        self, tool: FunctionTool, arguments: dict[str, Any], context: ToolContext
    ) -> ReconcileOutcome:
        """What the tool's reconcile hook answers, under the tool's time limits."""
        policy = self._policy(tool)
        return await run_reconcile(
            tool,
            arguments,
            context,
            threads=self._threads,
            time_limit=policy.timeout,
            wait_limit=policy.thread_wait,
        )

    async def _tell_reconcile(
        self, tool: FunctionTool, arguments: dict[str, Any], context: ToolContext
    ) -> None:
        """A side-effect call was stopped while it ran: it may have run. Its reconcile hook,
        if it has one, is asked once (with ``ctx.cancelled`` set), so the host can check and
        compensate; its answer is logged, and the call stays cancelled."""
        if tool.reconcile is None:
            logger.warning(
                "call %s of %s was cancelled while it ran: it may have run (no reconcile hook)",
                context.call_id,
                tool.name,
            )
            return
        verdict = await self._reconcile(tool, arguments, context)
        said = {Ran: "it ran", NotRun: "it did not run"}.get(type(verdict), "unknown")
        logger.warning(
            "call %s of %s was cancelled while it ran; its reconcile hook says: %s",
            context.call_id,
            tool.name,
            said,
        )

    def _retry_or_fail(
        self,
        attempt: _Attempt,
        tool: FunctionTool,
        policy: ResolvedPolicy,
        exc: Exception,
        *,
        after: float | None,
    ) -> SavedResult | _Retry:
        """Another attempt at the backoff's (or ``RetryLater``'s) time, while the tool's
        bounds allow: its retry policy's attempts and deadline, else its ``max_attempts``.
        Past them, the failure the model sees says the call was retried and the last error."""
        retry, number = policy.retry, attempt.runs
        limit = retry.attempts if retry is not None else policy.max_attempts
        if after is None:
            assert retry is not None
            after = retry.backoff(number, random.random())
        at = self.clock() + after
        deadline = None if retry is None else retry.deadline
        within = deadline is None or at <= attempt.started_at + deadline
        error, asked = type(exc).__name__, isinstance(exc, RetryLater)
        if number < limit and within:
            reason = f"{error}: {exc.reason}" if isinstance(exc, RetryLater) else error
            kind = "retry_later" if asked else "transient_error"
            return _Retry(at=at, reason=reason, error_type=kind)
        if asked:
            message = RETRY_LATER_EXHAUSTED_MESSAGE.format(name=tool.name)
        else:
            message = model_error_message(exc, tool_name=tool.name)
        if number > 1:
            message += RETRIED_SUFFIX.format(attempts=number, error=error)
        logger.error(
            "call %s of %s failed after %d attempts; last error %s",
            attempt.key,
            tool.name,
            number,
            error,
        )
        return failure_result(attempt.key, message, "retries_exhausted")

    def _encode(self, key: CallKey, tool: FunctionTool, value: Any, *, source: str) -> SavedResult:
        return encode_result(
            key,
            value,
            tool_name=tool.name,
            truncate=tool.truncate_oversize,
            source=source,
            limit=self.settings.result_limit,
            margin=self.settings.result_margin,
        )

    async def _hold_or(
        self, attempt: _Attempt, failure: SavedResult, *, hold: bool, reason: str
    ) -> SavedResult | None:
        """``failure`` to save, or with ``hold`` nothing: the call is held for an operator
        (quarantined for ``reason``), if our claim still stands."""
        if not hold:
            return failure
        self.leases.check(attempt.lease)
        await self.store.quarantine(
            attempt.key, owner=self.owner, attempt=attempt.number, reason=reason
        )
        return None

    # -- calls handed to workers -------------------------------------------------------------
    async def _hand_off(
        self, attempt: _Attempt, tool: FunctionTool, arguments: dict[str, Any], context: ToolContext
    ) -> SavedResult | None:
        """Hand the call to the tool's queue; its claim lasts until the job deadline.

        The claim is extended to the deadline *before* the job is queued: if the extension
        fails, nothing was queued (the call stays claimed and is taken over in doubt, then
        queued once); if the process dies after queueing, nobody takes the call over before
        the deadline, so the job is never queued twice.
        """
        key = attempt.key
        await self.leases.extend(attempt.lease, tool.job_deadline)
        try:
            if self.handoff is None:  # the app refuses such a registry; recover may not
                raise ConfigurationError("no completion secret is configured to issue job tokens")
            with anyio.fail_after(self._policy(tool).timeout):
                await self.handoff.hand_off(
                    key, tool, arguments, context, owner=self.owner, threads=self._threads
                )
        except Exception:
            logger.exception("could not enqueue call %s of tool %s", key, tool.name)
            message = ENQUEUE_FAILED_MESSAGE.format(name=tool.name)
            return failure_result(key, message, "enqueue_error")
        return None

    async def complete(
        self,
        key: CallKey,
        *,
        owner: str,
        attempt: int,
        tool: FunctionTool | None,
        tool_name: str,
        success: bool,
        output: Any = None,
        error: str | None = None,
    ) -> tuple[CompletionStatus, CallRecord | None]:
        """Save a worker's result for ``key``, handed off by ``owner`` in ``attempt``.

        Returns the status and the record to submit now, if any. ``accepted``: saved now.
        ``duplicate``: this same result was already saved. ``conflict``: another one was
        (another completion, the deadline failure) or the call was quarantined. ``stale``:
        the API no longer waits for it. ``unknown_tool``: this app does not register it.
        Raises StoreError, or :class:`~agentfn_asgi.errors.CompletionMismatchError` (a
        ``LookupError``) when ``tool_name`` is not the call's tool.
        """
        record = await self.store.get_call(key)
        if record is None or record.state in _NOT_OWED:
            return "stale", None
        if record.tool_name != tool_name:
            raise CompletionMismatchError("the completion names another tool than its call")
        if tool is None:
            return "unknown_tool", None
        if success:
            result = self._encode(key, tool, output, source="worker")
        else:
            result = failure_result(key, error or "", "worker_error", source="worker")
        fresh = record.state is CallState.CLAIMED
        if fresh:
            record = await self.store.save_result(key, owner=owner, attempt=attempt, result=result)
            crash_point("after_save", tool_name)
        if record.state in _NOT_OWED:
            return "stale", None
        if record.result is None or record.result.event_json != result.event_json:
            return "conflict", None
        status: CompletionStatus = "accepted" if fresh else "duplicate"
        # Even if the call's own task is still finishing (a fast worker completes before
        # the enqueuing attempt returns): a second submission of these bytes is harmless.
        return status, None if record.state.terminal else record


def _log_superseded(record: CallRecord, attempt: int, *, mine: SavedResult) -> None:
    """Our save was refused: another attempt holds the call, or saved first (fencing)."""
    if record.result is not None and record.result == mine:
        return  # the same bytes were saved already (a retry): nothing was lost
    logger.warning(
        "call %s: the result of attempt %d was dropped: %s",
        record.key,
        attempt,
        "another attempt saved first"
        if record.result is not None
        else f"attempt {record.attempt} holds the call now",
    )


def _log_finished(
    record: CallRecord, submitted: str, seconds: float, *, source: str | None = None
) -> None:
    """One INFO line per finished call: what operators grep for (no content)."""
    result = record.result
    if result is None or submitted == "skipped":
        return
    fields = call_fields(
        record.key,
        record.tool_name,
        outcome="success" if result.success else (result.error_type or "failure"),
        source=source or result.source,
        attempt=record.attempt,
        submission=submitted,
        duration_s=round(seconds, 3),
    )
    # The same facts as structured fields (``record.agentfn``) for JSON log formatters.
    logger.info(
        "call finished: tool=%(tool)s session=%(session_id)s call=%(call_id)s "
        "outcome=%(outcome)s source=%(source)s attempt=%(attempt)d "
        "submission=%(submission)s duration=%(duration_s).3fs",
        fields,
        extra={"agentfn": fields},
    )
