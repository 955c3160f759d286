"""The :class:`Dispatcher`: which sessions are read when, and the recovery sweep.

``schedule(S)`` puts a session on a queue that a few resolver tasks drain, single-flight per
session (a request for S while S is being resolved marks it dirty: S is read once more
afterwards). Resolving reads the session (``required_actions`` is the only proof a result is
owed) and starts one task per pending function call (:mod:`.execution` does the rest).

The recovery sweep (at start-up, then every ``recovery_interval``) re-resolves deliveries
that were never resolved and sessions with expired claims, resubmits saved-but-unsubmitted
results, and prunes records past the dedup window.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
import secrets
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from ..client import AgentsClient
from ..errors import APIError, NotFoundError, StoreError
from ..records import CallKey
from ..store.base import Store
from ..tools import FunctionTools
from ..tracing import Telemetry
from ..wire import AgentSession
from .execution import CompletionStatus, Executor, JobHandoff
from .leases import LeaseKeeper
from .settings import DispatchSettings
from .submission import Submitter

__all__ = ["Dispatcher"]

logger = logging.getLogger("agentfn_asgi.dispatch.scheduler")

#: Resolvers only read a session and start call tasks, so they never wait on a handler:
#: a handful is enough.
RESOLVERS = 8


async def _claimed(claims: list[asyncio.Future[None]]) -> None:
    """Wait for every claim to be decided; raise the first failure (all are retrieved)."""
    if not claims:
        return
    outcomes = await asyncio.gather(*claims, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, asyncio.CancelledError):
            # The call's task was cancelled (shutting down) before its claim was decided:
            # leave the delivery unresolved for the sweep.
            raise StoreError("a claim was interrupted before the store decided it")
        if isinstance(outcome, BaseException):
            raise outcome


@dataclass(frozen=True, slots=True)
class _Work:
    session_id: str
    delivery_id: str | None


class Dispatcher:
    """Resolves sessions, runs claimed calls and submits their saved results.

    It owns no HTTP server: :class:`~agentfn_asgi.app.AgentWebhookApp` records deliveries and
    calls :meth:`schedule`; ``start``/``stop`` are driven by the app's lifespan (or lazily).
    ``handoff`` hands the calls of ``enqueue=`` tools to their queue (:mod:`agentfn_asgi.jobs`).
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
        handoff: JobHandoff | None = None,
    ) -> None:
        self.tools = tools
        self.client = client
        self.store = store
        self.settings = settings or DispatchSettings()
        self.owner = owner or f"{os.uname().nodename}:{os.getpid()}:{secrets.token_hex(4)}"
        self._clock = clock
        self.telemetry = telemetry if telemetry is not None else Telemetry()
        self._queue: asyncio.Queue[_Work] | None = None
        self._queued: set[str] = set()
        self._resolving: set[str] = set()
        self._dirty: dict[str, str | None] = {}
        self._inflight: dict[CallKey, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._started = False
        self._stopping = False
        self._submitter = Submitter(client, store, self.telemetry)
        leases = LeaseKeeper(
            store, owner=self.owner, lease_seconds=self.settings.lease_seconds, spawn=self._spawn
        )
        self._executor = Executor(
            store,
            self._submitter,
            leases,
            settings=self.settings,
            owner=self.owner,
            telemetry=self.telemetry,
            resources=resources,
            clock=clock,
            handoff=handoff,
        )

    # -- lifecycle -----------------------------------------------------------------------
    @property
    def started(self) -> bool:
        """Started and not stopping."""
        return self._started and not self._stopping

    async def start(self, *, recover: bool = True) -> None:
        """Open the store and start the resolver workers and the periodic recovery sweep."""
        if self._started:
            return
        await self.store.open()  # may raise StoreUnavailableError; we stay unstarted then
        self._started = True
        self._queue = asyncio.Queue()
        self._executor.start()
        for _ in range(RESOLVERS):
            self._spawn(self._resolver_loop())
        self._spawn(self._sweep_loop(immediate=recover))
        self.telemetry.observe_pending(self._executor.oldest_running_age)

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

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        # A fresh context: work must not inherit the span of the request that started it
        # (a lazy start inside a delivery would parent every later span to that delivery).
        task = asyncio.get_running_loop().create_task(coro, context=contextvars.Context())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _track(self, key: CallKey, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` as the one in-flight task of call ``key``."""
        task = self._spawn(coro)
        self._inflight[key] = task

        def _done(_: asyncio.Task[None]) -> None:
            if self._inflight.get(key) is task:
                del self._inflight[key]

        task.add_done_callback(_done)

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
        """Read the session and start each pending function call (claims decide who runs).

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
        else:
            pending, claims = self._start_calls(session, delivery_id)
            await _claimed(claims)
            if settle:
                await self._settle_missing(session.id, pending)
        if delivery_id is not None:
            await self.store.mark_delivery_resolved(delivery_id)

    def _start_calls(
        self, session: AgentSession, delivery_id: str | None
    ) -> tuple[set[CallKey], list[asyncio.Future[None]]]:
        """One task per pending call not already in flight here; returns the pending keys
        and one future per task, resolved when its claim is decided.

        The tasks claim together, so a turn's parallel calls share store transactions (the
        SQLite store commits queued work as one group).
        """
        loop = asyncio.get_running_loop()
        pending: set[CallKey] = set()
        claims: list[asyncio.Future[None]] = []
        for action in session.function_calls:
            key = CallKey(session.id, action.turn_id, action.call_id)
            pending.add(key)
            if key in self._inflight:
                continue
            tool = self.tools.get(action.name)
            if tool is None and self.settings.unknown_tools == "ignore":
                continue  # another service sharing this agent answers it
            claimed: asyncio.Future[None] = loop.create_future()
            claims.append(claimed)
            self._track(key, self._executor.run(key, action, tool, delivery_id, claimed))
        return pending, claims

    async def _settle_missing(self, session_id: str, pending: set[CallKey]) -> None:
        """Calls we hold records for that the session no longer waits for become stale."""
        now = self._clock()
        for record in await self.store.calls_for_session(session_id):
            if record.key in pending or record.key in self._inflight or record.state.terminal:
                continue
            claimed_elsewhere = record.state == "claimed" and record.lease_expires_at > now
            if not claimed_elsewhere:
                await self.store.mark_stale(record.key)

    # -- worker completions --------------------------------------------------------------
    async def complete(
        self,
        key: CallKey,
        *,
        owner: str,
        tool_name: str,
        success: bool,
        output: Any = None,
        error: str | None = None,
    ) -> CompletionStatus:
        """Save and submit a worker's result for ``key`` (see :meth:`Executor.complete`)."""
        status, record = await self._executor.complete(
            key,
            owner=owner,
            tool=self.tools.get(tool_name),
            tool_name=tool_name,
            success=success,
            output=output,
            error=error,
        )
        if record is not None:
            self._track(record.key, self._executor.submit_completed(record))
        return status

    # -- recovery ------------------------------------------------------------------------
    async def recover(self, session_id: str | None = None) -> None:
        """Run recovery now: one session (re-read and re-dispatch), or a full sweep."""
        if session_id is not None:
            await self.resolve(session_id)
            for record in await self.store.calls_for_session(session_id):
                if record.state.has_result and not record.state.terminal:
                    await self._executor.resubmit(record)
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
                self._track(record.key, self._executor.resubmit(record))
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
    @property
    def inflight(self) -> int:
        """Calls currently being run or submitted by this process."""
        return len(self._inflight)
