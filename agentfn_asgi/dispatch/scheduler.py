"""The :class:`Dispatcher`: which sessions are read when, and the recovery sweep.

``schedule(S)`` puts a session on a queue that a few resolver tasks drain, single-flight per
session (a request for S while S is being resolved marks it dirty: S is read once more
afterwards). Resolving reads the session (``required_actions`` is the only proof a result is
owed) and starts one task per pending function call (:mod:`.execution` does the rest).

Fairness: a resolver makes one try of a session's read per turn. A failure the client's
retry policy would retry (a 5xx, a 429, a dropped connection; or a 404 while
``not_found_retries`` pauses are left) puts the session back on the queue once the policy's
wait is over (the same backoff, ``Retry-After`` and total deadline as the client's own loop,
kept in a :class:`~agentfn_asgi.client.RetryState`), behind every fresh session: a session
whose read keeps failing never holds a resolver while it waits, and never delays healthy
ones by more than its single tries. After the last try its delivery is left to the sweep.

The recovery sweep (at start-up, then every ``recovery_interval``) re-resolves deliveries
that were never resolved and sessions with expired claims, resubmits saved-but-unsubmitted
results, and prunes records past the dedup window.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import os
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import anyio

from ..actions import ActionPolicy, ConnectEnvironmentHook, SignInHook
from ..calls.records import CallKey, CallState, DeliveryRecord
from ..client import AgentsClient, RetryState
from ..errors import APIError, APIStatusError, NotFoundError, SessionNotFoundYetError, StoreError
from ..store.base import Store
from ..tools import FunctionTools
from ..tracing import Telemetry
from ..wire import AgentSession, FunctionCallAction
from .actions import RequestAnswers
from .alarms import ConfigurationAlarm, is_configuration_error
from .approvals import Approvals, ApprovalView
from .cancelling import Canceller
from .execution import CompletionStatus, Executor, JobHandoff
from .leases import LeaseKeeper
from .settings import DispatchSettings, check_limits
from .settling import Settler, SettleStatus
from .submission import Submitter, read_session

__all__ = ["Dispatcher"]

Item = TypeVar("Item")
Cursor = TypeVar("Cursor")

logger = logging.getLogger("agentfn_asgi.dispatch.scheduler")

#: Resolvers only read a session and start call tasks, so they never wait on a handler: a
#: handful is enough. 32 measured 1.85-1.88 s against 8's 1.94-2.02 s on 1,000 concurrent 1 s
#: handlers with the package's aiohttp client, but cost an injected httpx2 client 1.3x the CPU
#: per call at saturation (its pool's bookkeeping grows with the requests waiting in it).
RESOLVERS = 8


#: The failed attempts of a record that get their own WARNING line (then every tenth).
_LOGGED_ATTEMPTS = frozenset({1, 3, 5})
#: Sessions whose turn-less actions are remembered (:meth:`Dispatcher._end_occurrences`):
#: bounded, the oldest forgotten first (a settling read still ends their occurrences).
_TURNLESS_LIMIT = 10_000


#: Records one store query of the sweep returns.
SWEEP_PAGE = 100


async def _pages(
    fetch: Callable[..., Awaitable[list[Item]]],
    cursor_of: Callable[[Item], Cursor],
    *,
    due_before: float,
    budget: int,
) -> AsyncIterator[Item]:
    """Every record ``fetch(due_before=, limit=, after=)`` pages through, oldest due first,
    up to ``budget`` records: each page starts after the cursor of the previous page's last
    record."""
    after: Cursor | None = None
    while budget > 0:
        limit = min(SWEEP_PAGE, budget)
        page = await fetch(due_before=due_before, limit=limit, after=after)
        for item in page:
            yield item
        if len(page) < limit:
            return
        budget -= len(page)
        after = cursor_of(page[-1])


def _level(level: int, turn: _Work | None) -> int:
    """``level``, or DEBUG for a live read's failed try that will be made again."""
    return logging.DEBUG if turn is not None and turn.retry.delay is not None else level


def _describe(failure: Exception) -> str:
    """A short, content-free description of a failure, for the store and the logs."""
    if isinstance(failure, APIStatusError):
        return f"HTTP {failure.status} {failure.code or ''}".strip()
    return f"{type(failure).__name__}: {str(failure)[:160]}"


async def _claimed(claims: list[asyncio.Future[None]]) -> None:
    """Wait for every claim to be decided; raise the first failure (all are retrieved)."""
    if not claims:
        return
    if len(claims) == 1:
        # One call (the usual delivery): its future awaited directly, not through a gather
        # (≈ 9 against 21 µs, timed).
        try:
            await claims[0]
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this resolver itself is cancelled, as a gather would have raised
            raise StoreError("a claim was interrupted before the store decided it") from None
        return
    outcomes = await asyncio.gather(*claims, return_exceptions=True)
    for outcome in outcomes:
        if isinstance(outcome, asyncio.CancelledError):
            # The call's task was cancelled (shutting down) before its claim was decided:
            # leave the delivery unresolved for the sweep.
            raise StoreError("a claim was interrupted before the store decided it")
        if isinstance(outcome, BaseException):
            raise outcome


@dataclass(slots=True)
class _Work:
    """A session to read, and where its live read stands in the retry policy."""

    session_id: str
    delivery_id: str | None
    #: Settle what the session no longer waits for (a turn ended: see :mod:`.cancelling`).
    settle: bool = False
    #: The client's retries so far; ``retry.delay`` is set after a try that deserves another.
    retry: RetryState = field(default_factory=RetryState)
    #: 404s so far: each is read again after the next of ``not_found_retries``.
    missing: int = 0


#: Queue ranks: fresh work first, then reads being retried.
_FRESH, _RETRY = 0, 1


class Dispatcher:
    """Resolves sessions, runs claimed calls and submits their saved results.

    It owns no HTTP server: :class:`~agentfn_asgi.app.AgentWebhookApp` records deliveries and
    calls :meth:`schedule`; ``start``/``stop`` are driven by the app's lifespan (or lazily).
    ``handoff`` hands the calls of ``enqueue=`` tools to their queue (:mod:`agentfn_asgi.jobs`);
    ``sleep`` waits for the time of a retry scheduled in the store (flow control).
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
        sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
        actions: ActionPolicy | None = None,
        sign_in: SignInHook | None = None,
        connect_environment: ConnectEnvironmentHook | None = None,
    ) -> None:
        self.tools = tools
        self.client = client
        self.store = store
        self.settings = settings or DispatchSettings()
        check_limits(((tool.name, tool.policy) for tool in tools), self.settings)
        self.owner = owner or f"{os.uname().nodename}:{os.getpid()}:{secrets.token_hex(4)}"
        self._clock = clock
        self.telemetry = telemetry if telemetry is not None else Telemetry()
        self._queue: asyncio.PriorityQueue[tuple[int, int, _Work]] | None = None
        self._order = itertools.count()  # first in, first out within a rank
        self._queued: dict[str, _Work] = {}
        self._resolving: set[str] = set()
        self._dirty: dict[str, _Work] = {}
        #: The turn-less actions (environment connections) seen listed, by session: a read
        #: that no longer lists one ends its occurrence (:meth:`_end_occurrences`).
        self._turnless: dict[str, set[CallKey]] = {}
        #: Deliveries whose session was not found and said so (once each, at INFO).
        self._missing_told: set[str] = set()
        # One sweep pass at a time: a pass started by hand (``recover()``) while the loop's
        # runs would read the same due records twice and count each failure twice.
        self._sweeping = asyncio.Lock()
        self._inflight: dict[CallKey, asyncio.Task[None]] = {}
        #: When each in-flight task started (monotonic): the periodic re-read's clock.
        self._inflight_since: dict[CallKey, float] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._workers: list[asyncio.Task[Any]] = []  # resolvers and the sweep: they take work
        self.alarm = ConfigurationAlarm()
        self._started = False
        self._stopping = False
        self._submitter = Submitter(
            client,
            store,
            self.telemetry,
            alarm=self.alarm,
            retry_delay=self.settings.retry_delay,
            not_found_grace=self.settings.not_found_grace,
            not_found_pauses=self.settings.not_found_retries,
            clock=clock,
        )
        leases = LeaseKeeper(
            store,
            owner=self.owner,
            lease_seconds=self.settings.lease_seconds,
            margin=self.settings.fence_margin,
            spawn=self._spawn,
        )
        self._executor = Executor(
            store=store,
            submitter=self._submitter,
            leases=leases,
            settings=self.settings,
            owner=self.owner,
            telemetry=self.telemetry,
            resources=resources,
            clock=clock,
            handoff=handoff,
            sleep=sleep,
            # How MCP and computer-use approval requests are answered (``actions=``).
            answers=RequestAnswers(actions, sign_in, connect_environment),
        )

        self.approvals = Approvals(
            client=client,
            executor=self._executor,
            tools=tools,
            track=self._track,
            busy=lambda key: key in self._inflight,
            spawn=self._spawn,
        )
        self._canceller = Canceller(
            store=store, client=client, tools=tools, owner=self.owner, stop=self._stop_call
        )
        self._settler = Settler(client=client, executor=self._executor, track=self._track)

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
        self._queue = asyncio.PriorityQueue()
        self._executor.start()
        self._workers = [self._spawn(self._resolver_loop()) for _ in range(RESOLVERS)]
        self._workers.append(self._spawn(self._sweep_loop(immediate=recover)))
        if self.settings.reread_interval > 0:
            self._workers.append(self._spawn(self._reread_loop()))
        # A policy may ask a person about an approval request: the poll runs its decisions.
        gated = any(tool.approval is not False for tool in self.tools)
        if gated or self._executor.answers.policy is not None:
            self._workers.append(self._spawn(self.approvals.loop()))
        self.telemetry.observe_pending(self._executor.oldest_running_age)

    async def stop(self, *, drain_timeout: float = 10.0) -> None:
        """Stop taking work, let running calls finish for up to ``drain_timeout``, then
        cancel what is left.

        From the first moment nothing new is claimed: the resolvers and the sweep stop, and a
        call task that has not claimed its call yet gives up without claiming, so that work
        stays recorded for the next process (or another replica). Calls already running get
        the whole ``drain_timeout``. A call cancelled at the end keeps its claim; whoever
        takes over after its lease applies the in-doubt rules.
        """
        if not self._started or self._stopping:
            return
        self._stopping = True
        self._executor.close()
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        deadline = time.monotonic() + drain_timeout
        while self._inflight:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            await asyncio.wait(list(self._inflight.values()), timeout=left)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        self._executor.shutdown()

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
        self._inflight_since[key] = time.monotonic()

        def _done(_: asyncio.Task[None]) -> None:
            if self._inflight.get(key) is task:
                del self._inflight[key]
                del self._inflight_since[key]

        task.add_done_callback(_done)

    def answers(self, action: FunctionCallAction) -> bool:
        """Is the pending action ``action`` beyond a function call (an approval request, an
        environment connection, an unknown type) answered here, rather than recorded
        ``unanswered``?"""
        return self._executor.answers.answers(action)

    # -- scheduling ----------------------------------------------------------------------
    def schedule(
        self, session_id: str, delivery_id: str | None = None, *, settle: bool = False
    ) -> None:
        """Ask for ``session_id`` to be resolved soon (single-flight, never blocks). With
        ``settle``, the read also settles what the session no longer waits for (one of its
        turns ended: :mod:`.cancelling`)."""
        if self._queue is None or self._stopping:
            return
        if delivery_id is not None:
            self._submitter.delivery_received(delivery_id)
        if session_id in self._resolving:
            dirty = self._dirty.setdefault(session_id, _Work(session_id, delivery_id))
            dirty.settle |= settle
            return
        if session_id in self._queued:
            self._queued[session_id].settle |= settle
            return
        if len(self._queued) >= self.settings.max_queued_sessions:
            # The delivery is recorded in the store; the recovery sweep will pick it up.
            # Bounded memory beats an ever-growing queue under a flood.
            return
        work = self._queued[session_id] = _Work(session_id, delivery_id, settle)
        self._queue.put_nowait((_FRESH, next(self._order), work))

    async def _resolver_loop(self) -> None:
        assert self._queue is not None
        while True:
            *_, work = await self._queue.get()
            session_id = work.session_id
            self._queued.pop(session_id, None)
            self._resolving.add(session_id)
            try:
                await self._resolve_logged(
                    session_id, work.delivery_id, settle=work.settle, turn=work
                )
                while work.retry.delay is None and session_id in self._dirty:
                    work = self._dirty.pop(session_id)
                    await self._resolve_logged(
                        session_id, work.delivery_id, settle=work.settle, turn=work
                    )
                if work.retry.delay is not None:
                    # Queued meanwhile: a new delivery for it waits for the same read.
                    self._queued[session_id] = work
                    self._spawn(self._requeue(work, work.retry.delay))
            finally:
                self._resolving.discard(session_id)

    async def _requeue(self, work: _Work, delay: float) -> None:
        """Put a read to retry back on the queue after ``delay``, behind fresh work."""
        await self.client.pause(delay)
        assert self._queue is not None
        self._queue.put_nowait((_RETRY, next(self._order), work))

    async def _resolve_logged(
        self,
        session_id: str,
        delivery_id: str | None,
        *,
        settle: bool = False,
        received_at: float | None = None,
        counted: bool = False,
        turn: _Work | None = None,
    ) -> Exception | None:
        """:meth:`resolve`, logged; returns the failure (None when it succeeded, or when it
        can never succeed and was settled: a malformed session id). ``counted``: the caller
        counts failures per delivery and logs them itself (rate-limited), so a retryable
        failure is only a DEBUG line here, as is a live read's try to be made again
        (``turn``, see :meth:`_read`)."""
        retry_level = logging.DEBUG if counted else logging.WARNING
        try:
            await self._resolve(
                session_id, delivery_id, settle=settle, received_at=received_at, turn=turn
            )
        except ValueError as exc:
            # A malformed session id can never be read: retrying would loop until the dedup
            # window ends. (The app refuses such ids; this guards older records.)
            logger.error("session id %r cannot be resolved: %s", session_id, exc)
            if delivery_id is not None:
                with contextlib.suppress(StoreError):
                    await self.store.mark_delivery_resolved(delivery_id)
        except SessionNotFoundYetError as exc:
            # Expected, not a failure: a sample from ``webhooks test`` names a made-up
            # session, and a webhook may outrun its session. Said once per delivery.
            told = delivery_id is not None and delivery_id in self._missing_told
            if delivery_id is not None:
                self._missing_told.add(delivery_id)
            logger.log(
                logging.DEBUG if told else logging.INFO,
                "session %s not found: a sample (agentfn-asgi webhooks test) or a session not "
                "readable yet; read again until %g s after the delivery, then dropped",
                session_id,
                self.settings.not_found_grace,
            )
            return exc
        except (APIError, StoreError) as exc:
            # Left unresolved on purpose: the recovery sweep retries it.
            if is_configuration_error(exc):
                self.alarm.report(exc, doing=f"reading session {session_id}")
            else:
                logger.log(
                    _level(retry_level, turn),
                    "resolving session %s failed, will retry: %s",
                    session_id,
                    exc,
                )
            return exc
        except Exception as exc:
            logger.exception("unexpected error resolving session %s", session_id)
            return exc
        return None

    # -- resolution ----------------------------------------------------------------------
    async def resolve(
        self,
        session_id: str,
        *,
        delivery_id: str | None = None,
        settle: bool = True,
        received_at: float | None = None,
    ) -> None:
        """Read the session and start each pending function call (claims decide who runs).

        With ``settle``, calls recorded for the session that it no longer waits for become
        stale. A webhook-driven resolve skips that store read (one round trip per delivery on
        the hot path); the recovery sweep and :meth:`recover` settle, which is where such
        calls (a crashed claim, a cancelled turn) are found.

        A session the API does not find (404) is read again after short pauses; if it is
        still missing and its delivery arrived less than ``not_found_grace`` ago (the webhook
        may outrun the session becoming readable), the delivery stays for the sweep
        (:class:`~agentfn_asgi.errors.SessionNotFoundYetError`); past that, or without a
        delivery, the session is treated as deleted: its recorded calls become stale.
        """
        await self._resolve(
            session_id, delivery_id, settle=settle, received_at=received_at, turn=None
        )

    async def _resolve(
        self,
        session_id: str,
        delivery_id: str | None,
        *,
        settle: bool,
        received_at: float | None,
        turn: _Work | None,
    ) -> None:
        """:meth:`resolve`; a live read (``turn``) makes one try (see :meth:`_read`)."""
        link = self.telemetry.link_for_delivery(delivery_id)
        # Anything saved after this moment (less the clock-skew margin) may be newer than
        # what the read shows: settling must not make it stale.
        read_sent = self._clock()
        margin = self.settings.fence_margin
        try:
            with self.telemetry.session_read(session_id=session_id, delivery_link=link) as span:
                session = await self._read(session_id, turn)
                span.set_pending_calls(len(session.calls))
        except NotFoundError:
            if turn is not None and turn.retry.delay is not None:
                raise  # read again after a pause
            if received_at is None and delivery_id is not None:
                received_at = self._clock()  # a webhook that has just arrived
            if (
                received_at is not None
                and self._clock() - received_at < self.settings.not_found_grace
            ):
                raise SessionNotFoundYetError(session_id) from None
            # After a delivery's "not found" line, dropping it is no news.
            logger.log(
                logging.DEBUG if delivery_id in self._missing_told else logging.INFO,
                "session %s no longer exists; nothing to do",
                session_id,
            )
            await self._settle(session_id, set(), read_sent, margin, deleted=True)
        else:
            self.alarm.cleared()
            # Settling comes between the claims and the resolution: only without it can the
            # resolution ride on the claim.
            pending, claims, carried = self._start_calls(session, delivery_id, carry=not settle)
            await _claimed(claims)
            if settle:
                await self._settle(session.id, pending, read_sent, margin)
                self._forget_turnless(session.id, pending)  # the settling retired the rest
            else:
                await self._end_occurrences(session.id, pending, read_sent - margin)
            if carried:
                delivery_id = None  # resolved by its call's claim
        if delivery_id is not None:
            await self.store.mark_delivery_resolved(delivery_id)
            self._missing_told.discard(delivery_id)

    async def _read(self, session_id: str, turn: _Work | None) -> AgentSession:
        """The session. A live read (``turn``) makes one try: after a failure that deserves
        another, ``turn.retry.delay`` holds the wait before it (the client's backoff or
        ``Retry-After``, or after a 404 the next of ``not_found_retries``)."""
        pauses = self.settings.not_found_retries
        if turn is None:
            return await read_session(self.client, session_id, pauses=pauses)
        try:
            return await self.client.retrieve_session(session_id, retry=turn.retry)
        except NotFoundError:
            if turn.missing < len(pauses):
                turn.retry.delay = pauses[turn.missing]
                turn.missing += 1
            raise

    def _start_calls(
        self, session: AgentSession, delivery_id: str | None, *, carry: bool
    ) -> tuple[set[CallKey], list[asyncio.Future[None]], bool]:
        """One task per pending call not already in flight here; returns the pending keys,
        one future per task, resolved when its claim is decided, and whether the claim
        resolves the delivery too.

        The tasks claim together, so a turn's parallel calls share store transactions (the
        SQLite store commits queued work as one group). With ``carry``, a delivery whose
        session waits for one call only is resolved by that call's claim, in the same store
        step (one round trip fewer): once the claim is durable, the call's record carries
        the work. With several calls, each claim is its own step and the delivery is
        resolved after the last one is decided.
        """
        loop = asyncio.get_running_loop()
        pending: set[CallKey] = set()
        claims: list[asyncio.Future[None]] = []
        carried = False
        calls, turnless = session.calls, session.turnless_calls
        # A request's claim may not happen (the policy leaves it): only a function call's
        # claim carries the delivery, and only when it is the one action the read lists.
        carry = (
            carry
            and delivery_id is not None
            and len(calls) == 1
            and not turnless
            and calls[0].request_type is None
        )
        self._executor.answers.unanswered(session)
        self._seen_turnless(session.id, (CallKey(session.id, "", c.call_id) for c in turnless))
        # Turn-less actions (environment connections, unknown types) too: answered by a
        # hook, or recorded unanswered (the executor decides which).
        for action in (*calls, *turnless):
            key = CallKey(session.id, action.turn_id, action.call_id)
            pending.add(key)
            if key in self._inflight:
                continue
            requested = action.request_type is not None
            tool = None if requested else self.tools.get(action.name)
            if tool is None and not requested and self.settings.unknown_tools == "ignore":
                continue  # another service sharing this agent answers it
            claimed: asyncio.Future[None] = loop.create_future()
            claims.append(claimed)
            carried = carry
            self._track(
                key,
                self._executor.run(key, action, tool, delivery_id, claimed, resolves=carried),
            )
        return pending, claims, carried

    def _seen_turnless(self, session_id: str, keys: Iterable[CallKey]) -> None:
        """Remember the turn-less actions (environment connections) a read listed."""
        seen = self._turnless.pop(session_id, set()) | set(keys)
        if seen:
            self._turnless[session_id] = seen  # newest last: the oldest is forgotten first
            if len(self._turnless) > _TURNLESS_LIMIT:
                self._turnless.pop(next(iter(self._turnless)))

    def _forget_turnless(self, session_id: str, pending: set[CallKey]) -> None:
        seen = self._turnless.get(session_id)
        if seen is not None:
            seen &= pending
            if not seen:
                del self._turnless[session_id]

    async def _end_occurrences(self, session_id: str, pending: set[CallKey], read: float) -> None:
        """A read that does not settle (a webhook's) ends the occurrences of the turn-less
        actions this process saw listed and the read no longer lists: their records retire
        (a hook still running stops), so that the next occurrence runs its hook again. It
        reads no listing of the session (a settling read does, and finds the rest): one
        step per occurrence ended, and a look at the record when the step is refused (first
        seen after the read: tried again at the next read). A store that fails leaves them
        for the next read."""
        seen = self._turnless.get(session_id)
        if not seen:
            return
        try:
            for key in seen - pending:
                if await self._canceller.end_occurrence(key, known_before=read):
                    seen.discard(key)
                    continue
                record = await self.store.get_call(key)
                if record is None or record.state is CallState.RETIRED:
                    seen.discard(key)
        except StoreError as exc:
            logger.warning("ending the environment connections of %s failed: %s", session_id, exc)
        if not seen:
            self._turnless.pop(session_id, None)

    async def _settle(
        self,
        session_id: str,
        pending: set[CallKey],
        read_sent: float,
        margin: float,
        *,
        deleted: bool = False,
    ) -> None:
        """Settle what the read no longer lists (:mod:`.cancelling`); a call that may be
        newer than the read is looked at again once the clock-skew margin has passed."""
        later = await self._canceller.settle(
            session_id, pending, read_sent=read_sent, margin=margin, deleted=deleted
        )
        if later:
            self._spawn(self._settle_later(session_id, margin))

    async def _settle_later(self, session_id: str, delay: float) -> None:
        await asyncio.sleep(delay)
        self.schedule(session_id, settle=True)

    def _stop_call(self, key: CallKey, reason: str) -> None:
        """Stop what runs or waits here for ``key``, cancelled (:mod:`.cancelling`): its
        running attempt, else its task (waiting for a slot or a retry: nothing to save)."""
        if self._executor.stop(key, reason):
            return
        task = self._inflight.get(key)
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def _reread_loop(self) -> None:
        """Every ``reread_interval``: settle the sessions of calls in flight here for longer
        than that, so a cancelled turn is noticed without its webhook."""
        interval = self.settings.reread_interval
        while True:
            await asyncio.sleep(interval)
            started_before = time.monotonic() - interval
            sessions = {
                key.session_id
                for key, since in self._inflight_since.items()
                if since <= started_before
            }
            for session_id in sessions:
                self.schedule(session_id, settle=True)

    # -- worker completions --------------------------------------------------------------
    async def complete(
        self,
        key: CallKey,
        *,
        owner: str,
        attempt: int,
        tool_name: str,
        success: bool,
        output: Any = None,
        error: str | None = None,
    ) -> CompletionStatus:
        """Save and submit a worker's result for ``key`` (see :meth:`Executor.complete`)."""
        status, record = await self._executor.complete(
            key,
            owner=owner,
            attempt=attempt,
            tool=self.tools.get(tool_name),
            tool_name=tool_name,
            success=success,
            output=output,
            error=error,
        )
        if record is not None:
            self._track(record.key, self._executor.resubmit(record, source=None))
        return status

    # -- operators -----------------------------------------------------------------------
    async def settle(
        self,
        key: CallKey,
        *,
        output: Any = None,
        error: str | None = None,
        rerun: bool = False,
    ) -> tuple[SettleStatus, str]:
        """An operator settles a held or in-doubt call (see :meth:`Settler.settle`)."""
        return await self._settler.settle(
            key, tools=self.tools, output=output, error=error, rerun=rerun
        )

    async def approve(self, approval_id: str, *, by: str, via: str = "api") -> ApprovalView:
        """A person approves the waiting request ``approval_id`` (see :class:`Approvals`)."""
        return await self.approvals.decide(approval_id, approve=True, by=by, via=via)

    async def deny(
        self, approval_id: str, *, by: str, reason: str | None = None, via: str = "api"
    ) -> ApprovalView:
        """A person denies the waiting request ``approval_id``; the model sees ``reason``."""
        return await self.approvals.decide(
            approval_id, approve=False, by=by, via=via, reason=reason
        )

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
        """One pass of the recovery sweep (see the module docstring).

        Each record carries its own next-attempt time: one that failed is retried later with
        exponential backoff (``retry_base`` doubling up to ``retry_cap``), so records that
        keep failing go to the back and never hide the others. The pass pages through
        everything due with a cursor (at most ``sweep_budget`` records) and reads at most
        :data:`RESOLVERS` sessions at a time. Passes do not overlap: a second caller waits
        for the pass under way, then makes its own.
        """
        async with self._sweeping:
            await self._sweep_pass()

    async def _sweep_pass(self) -> None:
        now = self._clock()
        due = now - self.settings.recovery_grace
        by_session: dict[str, list[DeliveryRecord]] = {}
        deliveries = _pages(
            self.store.unresolved_deliveries,
            lambda last: (last.next_attempt_at, last.delivery_id),
            due_before=due,
            budget=self.settings.sweep_budget,
        )
        async for delivery in deliveries:
            by_session.setdefault(delivery.session_id, []).append(delivery)
        # In-doubt claims, and retries whose time has come whose process is gone (flow
        # control: a live one waits for its own retry, and is in flight here).
        stranded = [
            *await self.store.expired_claims(margin=self.settings.fence_margin),
            *await self.store.due_retries(),
        ]
        claimed_only = [
            record.key.session_id
            for record in stranded
            if record.key not in self._inflight and record.key.session_id not in by_session
        ]
        await self._resubmit_due(due)
        readers = asyncio.Semaphore(RESOLVERS)

        async def recover_session(session_id: str, deliveries: list[DeliveryRecord]) -> None:
            async with readers:
                await self._recover_session(session_id, deliveries)

        await asyncio.gather(
            *(recover_session(sid, found) for sid, found in by_session.items()),
            *(recover_session(sid, []) for sid in dict.fromkeys(claimed_only)),
        )
        await self.store.prune(
            deliveries_before=now - self.settings.dedup_window,
            calls_before=now - self.settings.call_retention,
        )

    async def _resubmit_due(self, due: float) -> None:
        """Resubmit saved results due for it (at most ``sweep_budget``, by their retry time)."""
        results = _pages(
            self.store.unsubmitted_results,
            lambda last: (last.next_attempt_at, last.key),
            due_before=due,
            budget=self.settings.sweep_budget,
        )
        async for record in results:
            if record.key not in self._inflight:
                # Tasks started together: the results of one turn go in one POST, the same
                # batch (and key) as the one a crash interrupted before its marks.
                self._track(record.key, self._executor.resubmit(record, together=True))

    async def _recover_session(self, session_id: str, deliveries: list[DeliveryRecord]) -> None:
        """Resolve one session for the sweep; record a failure on each of its deliveries."""
        if session_id in self._resolving or session_id in self._queued:
            for delivery in deliveries:
                self._dirty.setdefault(session_id, _Work(session_id, delivery.delivery_id))
            self._dirty.setdefault(session_id, _Work(session_id, None)).settle = True
            return
        first = deliveries[0] if deliveries else None
        failure = await self._resolve_logged(
            session_id,
            None if first is None else first.delivery_id,
            settle=True,
            received_at=None if first is None else first.received_at,
            counted=first is not None,
        )
        for delivery in deliveries[1:] if failure is None else ():
            await self.store.mark_delivery_resolved(delivery.delivery_id)
        if failure is None:
            return
        for delivery in deliveries:
            attempts = delivery.attempts + 1
            retry_at = self._clock() + self.settings.retry_delay(attempts)
            await self.store.delivery_failed(
                delivery.delivery_id, error=_describe(failure), retry_at=retry_at
            )
            self.telemetry.record_recovery_failure("delivery")
            if isinstance(failure, SessionNotFoundYetError):
                continue  # said once per delivery at INFO (see _resolve_logged)
            if attempts in _LOGGED_ATTEMPTS or attempts % 10 == 0:
                logger.warning(
                    "delivery %s (session %s) has failed %d times (%s); next try in %.0f s",
                    delivery.delivery_id,
                    session_id,
                    attempts,
                    _describe(failure),
                    retry_at - self._clock(),
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
    async def wait_for(self, keys: Iterable[CallKey]) -> None:
        """Wait until none of ``keys`` has a task in flight in this process (a call being
        run or its result being submitted); keys not in flight return at once."""
        wanted = set(keys)
        while tasks := [task for key, task in self._inflight.items() if key in wanted]:
            await asyncio.wait(tasks)

    @property
    def inflight(self) -> int:
        """Calls currently being run or submitted by this process."""
        return len(self._inflight)
