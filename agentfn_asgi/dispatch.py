"""The durable dispatcher: from "session S needs attention" to submitted tool results.

Steps 6-11 of DESIGN.md "One delivery, end to end"::

    schedule(S) ─▶ resolve(S)   single-flight per session (a second request while S is being
                  │              resolved marks it dirty: S is read once more afterwards)
                  ├ GET /agents/sessions/S → required_actions (the only proof a result is owed)
                  └ for each function_call (turn, call):
                       claim in the store (lease) ─┬ CLAIMED   → run → save → submit
                                                   ├ IN_DOUBT  → in-doubt policy (below)
                                                   ├ SAVED     → submit the saved result again
                                                   └ BUSY/DONE → nothing

In-doubt policy (a claim expired with no saved result, so the handler may have run):
plain tools run again (at-least-once); side-effect tools ask their ``reconcile`` hook: ``Ran``
→ its result is saved and submitted, ``NotRun`` → run now, ``Unknown`` (or no hook) →
quarantine: by default a model-safe failure is submitted, or with ``in_doubt="hold"`` the
call is held for an operator and nothing is sent.

The result is saved durably *before* it is submitted, with an idempotency key derived from
the call and the result bytes, so a resubmission from any replica is the same request. A
call the API no longer waits for (400 "Unknown pending tool call", 409, 404) is checked
against a fresh read of the session and becomes ``stale``: never run again.

A recovery sweep (at start-up, then every ``recovery_interval``) re-resolves deliveries that
were never resolved and sessions with expired claims, resubmits saved-but-unsubmitted
results, and prunes records past the dedup window.

The :class:`Dispatcher` here schedules, resolves, claims, runs and recovers; it delegates to
``_settings.py`` (:class:`DispatchSettings`), ``_outcomes.py`` (values and failures as saved
results), ``_lease.py`` (lease heartbeats), ``_submission.py`` (submitting, stale handling)
and ``_jobs.py`` (calls handed to workers).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio

from ._completion import JOB_DEADLINE_MESSAGE, CompletionStatus, CompletionTokens, TokenClaims
from ._crash import crash_point
from ._jobs import WorkerJobs
from ._lease import LeaseKeeper

# Defined with the other outcomes; still importable from here, where they were.
from ._outcomes import IN_DOUBT_MESSAGE as IN_DOUBT_MESSAGE
from ._outcomes import UNKNOWN_TOOL_MESSAGE as UNKNOWN_TOOL_MESSAGE
from ._outcomes import describe, encode_result, failure_result
from ._settings import DispatchSettings
from ._submission import Submitter
from .client import AgentsClient
from .errors import (
    APIError,
    ArgumentValidationError,
    NotFoundError,
    StoreError,
    ToolError,
)
from .records import CallKey, CallRecord, ClaimStatus, SavedResult
from .results import error_type_for, model_error_message, timeout_message
from .store.base import Store
from .tools import FunctionTool, FunctionTools, NotRun, Ran, ToolContext, derive_idempotency_key
from .tracing import Telemetry
from .wire import AgentSession, FunctionCallAction

__all__ = ["DispatchSettings", "Dispatcher"]

logger = logging.getLogger("agentfn_asgi.dispatch")


@dataclass(frozen=True, slots=True)
class _Work:
    session_id: str
    delivery_id: str | None


class Dispatcher:
    """Resolves sessions, runs claimed calls and submits their saved results.

    It owns no HTTP server: :class:`~agentfn_asgi.app.AgentWebhookApp` records deliveries and
    calls :meth:`schedule`; ``start``/``stop`` are driven by the app's lifespan (or lazily).
    """

    def __init__(
        self,
        tools: FunctionTools,
        client: AgentsClient,
        store: Store,
        *,
        settings: DispatchSettings | None = None,
        owner: str | None = None,
        resources: Any = None,
        clock: Callable[[], float] = time.time,
        telemetry: Telemetry | None = None,
        completion_tokens: CompletionTokens | None = None,
        completion_url: str | None = None,
    ) -> None:
        self.tools = tools
        # Worker jobs (worker.py): tokens sign completions; the URL goes into each job.
        self.completion_tokens = completion_tokens
        self.completion_url = completion_url
        self.client = client
        self.store = store
        self.settings = settings or DispatchSettings()
        self.owner = owner or f"{os.uname().nodename}:{os.getpid()}:{secrets.token_hex(4)}"
        self.resources = resources
        self._clock = clock
        self.telemetry = telemetry if telemetry is not None else Telemetry()
        self._running_since: dict[CallKey, float] = {}
        self._queue: asyncio.Queue[_Work] | None = None
        self._queued: set[str] = set()
        self._resolving: set[str] = set()
        self._dirty: dict[str, str | None] = {}
        self._inflight: dict[CallKey, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._call_slots: asyncio.Semaphore | None = None
        self._thread_limiter: anyio.CapacityLimiter | None = None
        self._started = False
        self._stopping = False
        self._submitter = Submitter(client, store, self.telemetry)
        self._leases = LeaseKeeper(
            store, owner=self.owner, lease_seconds=self.settings.lease_seconds, spawn=self._spawn
        )
        self._jobs = WorkerJobs(
            store,
            tools=tools,
            settings=self.settings,
            leases=self._leases,
            owner=self.owner,
            clock=clock,
            tokens=completion_tokens,
            complete_url=completion_url,
        )

    # -- lifecycle -----------------------------------------------------------------------
    @property
    def started(self) -> bool:
        return self._started and not self._stopping

    async def start(self, *, recover: bool = True) -> None:
        """Open the store and start the resolver workers and the periodic recovery sweep."""
        if self._started:
            return
        await self.store.open()  # may raise StoreUnavailableError; we stay unstarted then
        self._started = True
        self._queue = asyncio.Queue()
        self._call_slots = asyncio.Semaphore(self.settings.max_concurrency)
        self._thread_limiter = anyio.CapacityLimiter(self.settings.thread_pool_size)
        # A handful of resolvers is enough: each one only reads a session and spawns call
        # tasks, so it never waits on a handler.
        for _ in range(8):
            self._spawn(self._resolver_loop())
        self._spawn(self._sweep_loop(immediate=recover))
        self.telemetry.observe_pending(self._oldest_running_age)

    async def stop(self, *, drain_timeout: float = 10.0) -> None:
        """Stop taking work, wait for in-flight calls up to ``drain_timeout``, cancel the rest.

        Cancelled calls keep their claims; another replica (or the next start) takes them
        over through the recovery sweep once the lease expires.
        """
        if not self._started or self._stopping:
            return
        self._stopping = True
        calls = list(self._inflight.values())
        if calls:
            _, pending = await asyncio.wait(calls, timeout=drain_timeout)
            for task in pending:
                task.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        # A fresh context: work must not inherit the span of the request that started it
        # (a lazy start inside a delivery would parent every later span to that delivery).
        task = asyncio.get_running_loop().create_task(coro, context=contextvars.Context())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- scheduling ----------------------------------------------------------------------
    def schedule(self, session_id: str, delivery_id: str | None = None) -> None:
        """Ask for ``session_id`` to be resolved soon (single-flight, never blocks)."""
        if self._queue is None or self._stopping:
            return
        if delivery_id is not None:
            self._submitter.delivery_received(delivery_id)
        if session_id in self._resolving:
            self._dirty.setdefault(session_id, delivery_id)
            return
        if session_id in self._queued:
            return
        if len(self._queued) >= self.settings.max_queued_sessions:
            # The delivery is recorded in the store; the recovery sweep will pick it up.
            # Bounded memory beats an ever-growing queue under a flood.
            return
        self._queued.add(session_id)
        self._queue.put_nowait(_Work(session_id, delivery_id))

    async def _resolver_loop(self) -> None:
        assert self._queue is not None
        while True:
            work = await self._queue.get()
            self._queued.discard(work.session_id)
            self._resolving.add(work.session_id)
            try:
                await self._resolve_logged(work.session_id, work.delivery_id)
                while work.session_id in self._dirty:
                    delivery_id = self._dirty.pop(work.session_id)
                    await self._resolve_logged(work.session_id, delivery_id)
            finally:
                self._resolving.discard(work.session_id)

    async def _resolve_logged(
        self, session_id: str, delivery_id: str | None, *, settle: bool = False
    ) -> None:
        try:
            await self.resolve(session_id, delivery_id=delivery_id, settle=settle)
        except ValueError as exc:
            # A malformed session id can never be read: retrying would loop until the dedup
            # window ends. (The app refuses such ids; this guards older records.)
            logger.error("session id %r cannot be resolved: %s", session_id, exc)
            if delivery_id is not None:
                with contextlib.suppress(StoreError):
                    await self.store.mark_delivery_resolved(delivery_id)
        except (APIError, StoreError) as exc:
            # Left unresolved on purpose: the recovery sweep retries it.
            logger.warning("resolving session %s failed, will retry: %s", session_id, exc)
        except Exception:
            logger.exception("unexpected error resolving session %s", session_id)

    # -- resolution ----------------------------------------------------------------------
    async def resolve(
        self, session_id: str, *, delivery_id: str | None = None, settle: bool = True
    ) -> None:
        """Read the session and dispatch each pending function call (claims decide who runs).

        With ``settle``, calls recorded for the session that it no longer waits for become
        stale. A webhook-driven resolve skips that store read (one round trip per delivery on
        the hot path); the recovery sweep and :meth:`recover` settle, which is where such
        calls (a crashed claim, a cancelled turn) are found.
        """
        link = self.telemetry.link_for_delivery(delivery_id)
        try:
            with self.telemetry.session_read(session_id=session_id, delivery_link=link) as span:
                session = await self.client.retrieve_session(session_id)
                span.set_pending_calls(len(session.function_calls))
        except NotFoundError:
            logger.info("session %s no longer exists; nothing to do", session_id)
            await self._settle_missing(session_id, pending=set())
            if delivery_id is not None:
                await self.store.mark_delivery_resolved(delivery_id)
            return
        await self._dispatch_session(session, delivery_id, settle=settle)
        if delivery_id is not None:
            await self.store.mark_delivery_resolved(delivery_id)

    async def _dispatch_session(
        self, session: AgentSession, delivery_id: str | None, *, settle: bool
    ) -> None:
        pending: set[CallKey] = set()
        starts = []
        for action in session.function_calls:
            key = CallKey(session.id, action.turn_id, action.call_id)
            pending.add(key)
            if key not in self._inflight:
                starts.append(self._start_call(key, action, delivery_id))
        # Claimed together, so a turn's parallel calls share store transactions (the SQLite
        # store commits queued work as one group) instead of paying one round trip each.
        await asyncio.gather(*starts)
        if settle:
            await self._settle_missing(session.id, pending)

    async def _settle_missing(self, session_id: str, pending: set[CallKey]) -> None:
        """Calls we hold records for that the session no longer waits for become stale."""
        now = self._clock()
        for record in await self.store.calls_for_session(session_id):
            if record.key in pending or record.key in self._inflight or record.state.terminal:
                continue
            claimed_elsewhere = record.state == "claimed" and record.lease_expires_at > now
            if not claimed_elsewhere:
                await self.store.mark_stale(record.key)

    async def _start_call(
        self, key: CallKey, action: FunctionCallAction, delivery_id: str | None
    ) -> None:
        tool = self.tools.get(action.name)
        if tool is None and self.settings.unknown_tools == "ignore":
            return
        # Bound concurrent handlers. The slot is taken before the claim so that a claimed
        # call starts (and heartbeats) at once; waiting here slows the resolver down
        # (back-pressure on reads) instead of piling up tasks without limit.
        assert self._call_slots is not None
        await self._call_slots.acquire()
        try:
            outcome = await self.store.claim_call(
                key,
                tool_name=action.name,
                owner=self.owner,
                lease_seconds=self.settings.lease_seconds,
                delivery_id=delivery_id,
            )
        except BaseException:
            self._call_slots.release()
            raise
        if outcome.status in (ClaimStatus.CLAIMED, ClaimStatus.IN_DOUBT):
            crash_point("after_claim", action.name)
            in_doubt = outcome.status is ClaimStatus.IN_DOUBT
            self._track(
                key, self._execute(key, action, tool, outcome.record.attempt, in_doubt, delivery_id)
            )
            return
        self._call_slots.release()
        if outcome.status is ClaimStatus.SAVED:
            self._track(key, self._resubmit(outcome.record, delivery_id))

    def _track(self, key: CallKey, coro: Any) -> None:
        task = self._spawn(coro)
        self._inflight[key] = task

        def _done(_: asyncio.Task[None]) -> None:
            if self._inflight.get(key) is task:
                del self._inflight[key]

        task.add_done_callback(_done)

    # -- execution -----------------------------------------------------------------------
    async def _execute(
        self,
        key: CallKey,
        action: FunctionCallAction,
        tool: FunctionTool | None,
        attempt: int,
        in_doubt: bool,
        delivery_id: str | None = None,
    ) -> None:
        assert self._call_slots is not None
        self._running_since[key] = time.monotonic()
        span_scope = self.telemetry.tool_call(
            tool_name=action.name,
            session_id=key.session_id,
            turn_id=key.turn_id,
            call_id=key.call_id,
            attempt=attempt,
            delivery_link=self.telemetry.link_for_delivery(delivery_id),
            description=tool.description if tool is not None else None,
        )
        try:
            with span_scope as span:
                span.set_arguments(action.arguments)
                result = await self._obtain_result(key, action, tool, attempt, in_doubt)
                if result is None:
                    # Handed to a worker queue, or held for an operator: no result yet.
                    queued = tool is not None and tool.enqueue is not None
                    span.set_source("queued" if queued else "held")
                    return
                crash_point("after_handler", action.name)
                record = await self.store.save_result(key, owner=self.owner, result=result)
                crash_point("after_save", action.name)
                describe(span, record)
                await self._submitter.submit(record, delivery_id)
        except (APIError, StoreError) as exc:
            logger.warning("call %s left for recovery: %s", key, exc)
        finally:
            self._running_since.pop(key, None)
            self._call_slots.release()

    async def _resubmit(self, record: CallRecord, delivery_id: str | None = None) -> None:
        """Submit a saved result again, as its own attempt span (source ``saved``)."""
        key = record.key
        with self.telemetry.tool_call(
            tool_name=record.tool_name,
            session_id=key.session_id,
            turn_id=key.turn_id,
            call_id=key.call_id,
            attempt=record.attempt,
            delivery_link=self.telemetry.link_for_delivery(delivery_id),
        ) as span:
            describe(span, record, source="saved")
            try:
                await self._submitter.submit(record, delivery_id)
            except (APIError, StoreError) as exc:
                logger.warning("resubmitting %s failed; will retry: %s", key, exc)

    async def _obtain_result(
        self,
        key: CallKey,
        action: FunctionCallAction,
        tool: FunctionTool | None,
        attempt: int,
        in_doubt: bool,
    ) -> SavedResult | None:
        if tool is None:
            message = UNKNOWN_TOOL_MESSAGE.format(name=action.name)
            return failure_result(key, message, "unknown_tool")
        context = self._context(key, tool, attempt)
        try:
            arguments = tool.parse_arguments(action.arguments)
        except ArgumentValidationError as exc:
            return failure_result(
                key, model_error_message(exc, tool_name=tool.name), "validation_error"
            )
        if in_doubt and tool.enqueue is not None and await self._jobs.overdue(key, tool):
            # Its job may still be running: fail the call rather than queue it again.
            return failure_result(key, JOB_DEADLINE_MESSAGE, "job_deadline", source="worker")
        if in_doubt and tool.side_effects:
            # The lease must outlive a slow reconcile hook, or another replica takes the call
            # over, reconciles from the same state, and runs the side effect a second time.
            async with self._leases.kept(key):
                verdict = await tool.run_reconcile(arguments, context)
            if isinstance(verdict, Ran):
                return self._encode(key, tool, verdict.result, source="reconciled")
            if not isinstance(verdict, NotRun):
                return await self._quarantine(key, tool, getattr(verdict, "reason", ""))
        return await self._run(key, tool, arguments, context)

    def _context(self, key: CallKey, tool: FunctionTool, attempt: int) -> ToolContext:
        timeout = tool.timeout if tool.timeout is not None else self.settings.default_timeout
        return ToolContext(
            session_id=key.session_id,
            turn_id=key.turn_id,
            call_id=key.call_id,
            tool_name=tool.name,
            attempt=attempt,
            deadline=None if timeout is None else self._clock() + timeout,
            idempotency_key=derive_idempotency_key(key.session_id, key.turn_id, key.call_id),
            resources=self.resources,
        )

    async def _run(
        self,
        key: CallKey,
        tool: FunctionTool,
        arguments: dict[str, Any],
        context: ToolContext,
    ) -> SavedResult | None:
        if tool.enqueue is not None:
            return await self._jobs.enqueue(
                key, tool, arguments, context, limiter=self._thread_limiter
            )
        timeout = tool.timeout if tool.timeout is not None else self.settings.default_timeout
        try:
            async with self._leases.kept(key):
                with anyio.fail_after(timeout):
                    value = await tool.invoke(arguments, context, limiter=self._thread_limiter)
        except TimeoutError:
            assert timeout is not None
            return failure_result(key, timeout_message(tool.name, timeout), "timeout")
        except (ToolError, ArgumentValidationError) as exc:
            return failure_result(
                key, model_error_message(exc, tool_name=tool.name), error_type_for(exc)
            )
        except Exception as exc:
            logger.exception("tool %s failed for call %s", tool.name, key)
            return failure_result(
                key, model_error_message(exc, tool_name=tool.name), "handler_error"
            )
        return self._encode(key, tool, value, source="ran")

    def _encode(self, key: CallKey, tool: FunctionTool, value: Any, *, source: str) -> SavedResult:
        limit, margin = self.settings.result_limit, self.settings.result_margin
        return encode_result(key, tool, value, source=source, limit=limit, margin=margin)

    async def _quarantine(
        self, key: CallKey, tool: FunctionTool, reason: str
    ) -> SavedResult | None:
        logger.warning(
            "side-effect call %s of %s is in doubt and could not be reconciled (%s); policy=%s",
            key,
            tool.name,
            reason or "no reconcile hook",
            self.settings.in_doubt,
        )
        if self.settings.in_doubt == "hold":
            await self.store.quarantine(key, owner=self.owner, reason=reason or "in doubt")
            return None
        return failure_result(key, IN_DOUBT_MESSAGE, "in_doubt", source="quarantined")

    # -- worker jobs (_jobs.py) --------------------------------------------------------------
    async def complete(
        self, claims: TokenClaims, *, success: bool, output: Any = None, error: str | None = None
    ) -> CompletionStatus:
        """Save and submit a worker's result for the one call its verified token names.

        ``accepted``: saved now, submission started. ``duplicate``: this same result was
        already saved. ``conflict``: another one was (another completion, the deadline
        failure) or the call was quarantined. ``stale``: the API no longer waits for it.
        ``unknown_tool``: this app does not register the tool. Raises StoreError.
        """
        status, record = await self._jobs.save_completion(
            claims, success=success, output=output, error=error
        )
        if record is not None:
            self._track(record.key, self._submit_completed(record))
        return status

    async def _submit_completed(self, record: CallRecord) -> None:
        """Submit a worker's saved result under its own call span (source ``worker``)."""
        key = record.key
        with self.telemetry.tool_call(
            tool_name=record.tool_name,
            session_id=key.session_id,
            turn_id=key.turn_id,
            call_id=key.call_id,
            attempt=record.attempt,
        ) as span:
            describe(span, record)
            try:
                await self._submitter.submit(record)
            except (APIError, StoreError) as exc:
                logger.warning("submitting %s failed; the recovery sweep retries it: %s", key, exc)

    # -- recovery ------------------------------------------------------------------------
    async def recover(self, session_id: str | None = None) -> None:
        """Run recovery now: one session (re-read and re-dispatch), or a full sweep."""
        if session_id is not None:
            await self.resolve(session_id)
            for record in await self.store.calls_for_session(session_id):
                if record.state.has_result and not record.state.terminal:
                    await self._resubmit(record)
            return
        await self.sweep()

    async def sweep(self) -> None:
        """One pass of the recovery sweep (see the module docstring)."""
        now = self._clock()
        sessions: dict[str, str | None] = {}
        for delivery in await self.store.unresolved_deliveries(
            older_than=now - self.settings.recovery_grace
        ):
            sessions.setdefault(delivery.session_id, delivery.delivery_id)
        for record in await self.store.expired_claims():
            if record.key not in self._inflight:
                sessions.setdefault(record.key.session_id, None)
        for record in await self.store.unsubmitted_results():
            # A result saved moments ago is being submitted by whoever saved it.
            fresh = record.updated_at > now - self.settings.recovery_grace
            if record.key not in self._inflight and not fresh:
                self._track(record.key, self._resubmit(record))
        for session_id, delivery_id in sessions.items():
            if session_id in self._resolving or session_id in self._queued:
                if delivery_id is not None:
                    self._dirty.setdefault(session_id, delivery_id)
                continue
            await self._resolve_logged(session_id, delivery_id, settle=True)
        await self.store.prune(
            deliveries_before=now - self.settings.dedup_window,
            calls_before=now - self.settings.call_retention,
        )

    async def _sweep_loop(self, *, immediate: bool) -> None:
        if not immediate:
            await asyncio.sleep(self.settings.recovery_interval)
        while True:
            try:
                await self.sweep()
            except (APIError, StoreError) as exc:
                logger.warning("recovery sweep failed, retrying later: %s", exc)
            except Exception:
                logger.exception("unexpected error in the recovery sweep")
            await asyncio.sleep(self.settings.recovery_interval)

    # -- introspection -------------------------------------------------------------------
    def _oldest_running_age(self) -> float | None:
        if not self._running_since:
            return None
        return time.monotonic() - min(self._running_since.values())

    @property
    def inflight(self) -> int:
        """Calls currently being run or submitted by this process."""
        return len(self._inflight)
