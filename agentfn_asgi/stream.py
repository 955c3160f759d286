"""Stream mode: follow sessions' event streams instead of receiving webhooks.

``GET /agents/sessions/{id}/events`` streams a session's events as Server-Sent Events
(wire protocol §5). A laptop with no public URL can follow it and act whenever the session
requires action; two users sit on this module:

- ``agentfn-asgi listen`` (:mod:`agentfn_asgi.cli.listen`) forwards a locally signed
  ``agent.session.action_required`` delivery to the local app, so the app runs unchanged;
- :meth:`AgentWebhookApp.follow <agentfn_asgi.app.AgentWebhookApp.follow>` records a
  delivery and hands the session to the app's dispatcher, in process.

The rules both inherit from :func:`follow_session`:

- **Subscribe, then read.** The stream has no resume cursor, so after every (re)connect
  the session is read again: whatever happened while nobody listened is in that read.
- **What is owed comes from ``required_actions`` of a fresh read**, never from a streamed
  item: a ``requires_action`` event only triggers the read.
- **Duplicates by ``event_id`` are dropped** (the official helper does the same).
- **No single event stops a follower**: one that cannot be parsed (a snapshot whose
  model-written arguments nest 100,000 levels deep, say) is logged and skipped, and the
  session is read again in its place, since it may have announced anything.
- **A dropped stream is reconnected with backoff** (:data:`RECONNECT` by default); a
  session that is gone (404) ends the follow; an auth or request error (401, 403, 400) is
  raised, since retrying cannot help.

:class:`SessionWatcher` decides which sessions to follow: given ids, or the project's
active sessions found by polling ``GET /agents/sessions`` (newest first).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import anyio

from .backoff import Backoff
from .errors import APIError, APIStatusError, NotFoundError
from .session_events import (
    ErrorEvent,
    SessionBudgetReachedEvent,
    SessionFailedEvent,
    SessionIdleEvent,
    SessionRequiresActionEvent,
    TurnCancelledEvent,
    TurnCompletedEvent,
    TurnCreatedEvent,
    TurnFailedEvent,
    UnreadableEvent,
)
from .wire import SESSION_BUDGET_REACHED, AgentSession

if TYPE_CHECKING:
    from .client import AgentsClient

__all__ = [
    "ACTIVE_STATUSES",
    "RECONNECT",
    "FollowEnd",
    "FollowSummary",
    "SessionWatcher",
    "follow_session",
    "stream_delivery_id",
]

logger = logging.getLogger("agentfn_asgi.stream")

#: Statuses in which a session may come to require action: it is followed while in one.
ACTIVE_STATUSES = frozenset({"in_progress", "requires_action"})

#: Statuses retrying cannot fix: the key, the project or the request is wrong.
_PERMANENT = frozenset({400, 401, 403, 422})

Notice = Callable[[str], None]
OnAction = Callable[[AgentSession], Awaitable[None]]


# -- following one session -------------------------------------------------------------------


#: Reconnect delays: 0.5 s doubling per failure in a row up to 15 s, less a jitter of up to a
#: quarter (so many listeners do not reconnect in step).
RECONNECT = Backoff(base=0.5, cap=15.0, jitter=0.25)


@dataclass(frozen=True, slots=True)
class FollowEnd:
    """How :func:`follow_session` ended.

    ``status`` is ``idle`` (the turn completed), ``cancelled`` (the last turn was cancelled;
    the session is idle), ``failed``, ``budget_reached`` (the session is paused on its
    spending limit, ``spend_control``) or ``deleted`` (the API no longer finds the session).
    ``reconnects`` counts streams opened after the first, ``events`` the distinct events
    seen, ``duplicates`` the repeats dropped by ``event_id``.
    """

    session_id: str
    status: str
    reconnects: int = 0
    events: int = 0
    duplicates: int = 0


@dataclass(frozen=True, slots=True)
class FollowSummary:
    """What :meth:`AgentWebhookApp.follow <agentfn_asgi.app.AgentWebhookApp.follow>` did.

    ``status`` is how the follow ended (see :class:`FollowEnd`: ``idle``, ``cancelled``,
    ``failed``, ``budget_reached`` or ``deleted``). ``calls_owed`` counts the function calls
    the session required while followed (read from ``required_actions``); of those,
    ``calls_run`` have a result (run here, by a worker, or before this follow) and
    ``results_submitted`` were accepted by the API. ``deliveries`` is how many deliveries
    were recorded in the store, ``reconnects`` how many times the stream was opened again.
    """

    session_id: str
    status: str
    calls_owed: int
    calls_run: int
    results_submitted: int
    deliveries: int
    reconnects: int


class _RecentIds:
    """The last ``size`` event ids, to drop a repeat (a bounded set, oldest forgotten)."""

    def __init__(self, size: int) -> None:
        self._ids: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._size = size

    def repeat(self, event_id: str) -> bool:
        """True if ``event_id`` was seen; otherwise remember it and return False."""
        if event_id in self._ids:
            return True
        self._ids[event_id] = None
        if len(self._ids) > self._size:
            self._ids.popitem(last=False)
        return False


def stream_delivery_id(session: AgentSession) -> str:
    """A delivery id for what ``session`` requires now (``wh_`` + 32 hex).

    The same pending actions give the same id: a re-read after a reconnect, or a repeated
    ``requires_action``, names the delivery already recorded (or forwarded), and the
    store's de-duplication keeps it single.
    """
    owed = sorted(
        json.dumps(
            [
                action.type,
                getattr(action, "turn_id", None),
                getattr(action, "call_id", None),
                getattr(action, "request_id", None),
                getattr(action, "environment_id", None),
            ]
        )
        for action in session.required_actions
    )
    digest = hashlib.sha256("\n".join([session.id, *owed]).encode()).hexdigest()
    return "wh_" + digest[:32]


def _root_turn(event: object, turn_id: str | None, ended: bool) -> tuple[str | None, bool]:
    """The root turn seen (its id, whether it ended) after ``event``: a turn created with
    no subagent starts one; its completion, failure or cancellation ends it."""
    if isinstance(event, TurnCreatedEvent) and event.turn.subagent_id is None:
        return event.turn_id, False
    ending = TurnCompletedEvent | TurnFailedEvent | TurnCancelledEvent
    if isinstance(event, ending) and turn_id is not None and event.turn_id == turn_id:
        return turn_id, True
    return turn_id, ended


def _permanent(exc: APIError) -> bool:
    return isinstance(exc, APIStatusError) and exc.status in _PERMANENT


async def follow_session(
    client: AgentsClient,
    session_id: str,
    on_action: OnAction,
    *,
    backoff: Backoff | None = None,
    notice: Notice | None = None,
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    recent_ids: int = 1024,
) -> FollowEnd:
    """Follow ``session_id``'s event stream until the session is idle, failed, paused on
    its spending limit or gone.

    ``on_action`` gets a freshly read session whenever it has ``required_actions``: after
    each (re)connect, after each ``requires_action`` event, and after each event that
    cannot be parsed (logged on ``agentfn_asgi.stream`` and skipped). It may be called again for
    the same pending actions (a reconnect re-reads); :func:`stream_delivery_id` names them
    stably. An ``agent.session.budget_reached`` event re-reads the session (answering what
    it still owes) and ends the follow once the root turn seen started here ended, or at
    once when none was seen, as the openai SDK's stream helper does; a read that finds the
    session paused ends it too. ``notice`` receives one line per reconnect or streamed
    error. Raises
    :class:`~agentfn_asgi.errors.APIStatusError` for 400/401/403/422 (retrying cannot help);
    cancel the task to stop early.
    """
    say = notice or (lambda _line: None)
    pause = backoff or RECONNECT
    seen = _RecentIds(recent_ids)
    failures = opened = events = duplicates = 0
    cancelled = False
    # The root turn started while followed, and whether it ended (budget_reached ends the
    # follow only then, or when no turn was seen: the SDK's rule).
    root_turn: str | None = None
    root_ended = False

    def end(status: str) -> FollowEnd:
        if status == "idle" and cancelled:
            status = "cancelled"
        return FollowEnd(session_id, status, max(opened - 1, 0), events, duplicates)

    async def read() -> AgentSession:
        session = await client.retrieve_session(session_id)
        if session.required_actions:
            await on_action(session)
        return session

    while True:
        if failures:
            await sleep(pause.delay(failures))
        trouble = "cannot open the event stream ({}); retrying"
        try:
            stream = await client.open_event_stream(session_id, include_obfuscation=False)
            opened += 1
            trouble = "stream dropped ({}); reconnecting"
            async with stream:
                # Subscribed first, then read: nothing can fall between the two.
                session = await read()
                failures = 0
                if session.status not in ACTIVE_STATUSES:
                    return end(session.status)
                async for event in stream.tolerant():
                    if event.event_id is not None and seen.repeat(event.event_id):
                        duplicates += 1
                        continue
                    events += 1
                    if isinstance(event, UnreadableEvent):
                        logger.warning(
                            "session %s: a streamed event of %d characters cannot be read "
                            "(%s); skipped, reading the session instead",
                            session_id,
                            event.size,
                            event.reason,
                        )
                        say(f"session {session_id}: skipped an unreadable event ({event.reason})")
                    if isinstance(event, SessionRequiresActionEvent | UnreadableEvent):
                        session = await read()
                        if session.status not in ACTIVE_STATUSES:
                            return end(session.status)
                    elif isinstance(event, SessionIdleEvent | SessionFailedEvent):
                        return end(event.session.status)
                    elif isinstance(event, SessionBudgetReachedEvent):
                        session = await read()
                        if root_turn is None or root_ended:
                            return end(SESSION_BUDGET_REACHED)
                    elif isinstance(event, TurnCancelledEvent):
                        cancelled = True
                    elif isinstance(event, TurnCreatedEvent):
                        cancelled = False
                    elif isinstance(event, ErrorEvent):
                        say(f"session {session_id}: streamed error: {event.error.message}")
                    root_turn, root_ended = _root_turn(event, root_turn, root_ended)
        except NotFoundError:
            return end("deleted")
        except APIError as exc:
            if _permanent(exc):
                raise
            failures += 1
            say(f"session {session_id}: {trouble.format(exc)}")
            continue
        # The stream ended while the session was active: reconnect (gently, in case the
        # server keeps ending it at once).
        failures = max(failures, 1)
        say(f"session {session_id}: stream ended while {session.status}; reconnecting")


# -- which sessions to follow ----------------------------------------------------------------


class SessionWatcher:
    """Follows the sessions that need it until :meth:`run`'s ``stop`` is set.

    With ``session_ids``, those sessions: each is read every ``poll_interval`` seconds while
    it is idle, and followed while active. Without, the project's sessions: ``GET
    /agents/sessions`` (the ``discover_limit`` newest) every ``poll_interval`` seconds, and
    each session listed as active is followed until idle. ``on_end`` hears how each follow
    ended. An auth or request error (see :func:`follow_session`) ends :meth:`run` with it.
    """

    def __init__(
        self,
        client: AgentsClient,
        on_action: OnAction,
        *,
        session_ids: Sequence[str] = (),
        poll_interval: float = 2.0,
        discover_limit: int = 20,
        backoff: Backoff | None = None,
        notice: Notice | None = None,
        on_start: Callable[[str], None] | None = None,
        on_end: Callable[[FollowEnd], None] | None = None,
    ) -> None:
        self.client = client
        self.on_action = on_action
        self.session_ids = list(dict.fromkeys(session_ids))
        self.poll_interval = poll_interval
        self.discover_limit = discover_limit
        self.backoff = backoff
        self._notice = notice or (lambda _line: None)
        self._on_start = on_start
        self._on_end = on_end
        self._followers: dict[str, asyncio.Task[FollowEnd]] = {}
        self._fatal: BaseException | None = None

    @property
    def following(self) -> list[str]:
        """The sessions being followed now."""
        return list(self._followers)

    async def run(self, stop: asyncio.Event) -> None:
        """Poll and follow until ``stop`` is set; then cancel every follow and return."""
        try:
            while not stop.is_set() and self._fatal is None:
                try:
                    active = await self._active()
                except APIError as exc:
                    if _permanent(exc):
                        raise
                    self._notice(f"cannot read sessions ({exc}); retrying")
                    active = []
                for session_id in active:
                    if session_id not in self._followers:
                        self._start(session_id, stop)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.poll_interval)
        finally:
            followers = list(self._followers.values())
            for task in followers:
                task.cancel()
            await asyncio.gather(*followers, return_exceptions=True)
        if self._fatal is not None:
            raise self._fatal

    async def _active(self) -> list[str]:
        if not self.session_ids:
            page = await self.client.list_sessions(limit=self.discover_limit, order="desc")
            return [item.id for item in page.data if item.status in ACTIVE_STATUSES]
        active: list[str] = []
        for session_id in list(self.session_ids):
            if session_id in self._followers:
                continue
            try:
                session = await self.client.retrieve_session(session_id)
            except NotFoundError:
                self._notice(f"session {session_id} not found; no longer watched")
                self.session_ids.remove(session_id)
                continue
            if session.status in ACTIVE_STATUSES:
                active.append(session_id)
        return active

    def _start(self, session_id: str, stop: asyncio.Event) -> None:
        if self._on_start is not None:
            self._on_start(session_id)
        task = asyncio.create_task(
            follow_session(
                self.client,
                session_id,
                self.on_action,
                backoff=self.backoff,
                notice=self._notice,
            )
        )
        self._followers[session_id] = task

        def done(finished: asyncio.Task[FollowEnd]) -> None:
            if self._followers.get(session_id) is finished:
                del self._followers[session_id]
            if finished.cancelled():
                return
            failure = finished.exception()
            if failure is not None:
                self._fatal = failure
                stop.set()
            elif self._on_end is not None:
                self._on_end(finished.result())

        task.add_done_callback(done)
