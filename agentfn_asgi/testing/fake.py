"""``FakeAgentsAPI``: an in-memory Agents API for testing function tools end to end.

It is a plain ASGI app. :func:`~agentfn_asgi.testing.connect` wires it to an
``AgentWebhookApp`` in the same process::

    async with connect(tools) as (app, fake):
        session = fake.create_session([[FakeCall("get_customer", {"customer_id": "123"})]])
        await fake.wait_idle(session)

It also runs over loopback with :func:`~agentfn_asgi.testing.serve_fake`. It serves
``GET /v1/agents/sessions`` (list, newest first), ``GET /v1/agents/sessions/{id}``,
``POST …/{id}/events``, ``GET …/{id}/events`` (SSE, until the session is idle) and
``DELETE …/{id}``, checks bearer auth and ``OpenAI-Beta: agents=v1``, sends signed webhooks,
records what it accepted, and can inject the faults a real deployment meets (a stream cut
mid-turn and repeated stream events among them). It also serves the webhook endpoint API
(``/v1/webhook_endpoints``..., :mod:`~agentfn_asgi.testing.fake_endpoints`): endpoints
created there get the events they subscribe to, signed with their own secret.

Scripted sessions: :meth:`FakeAgentsAPI.create_session` takes the *steps* of one turn; each
step is a batch of parallel function calls that are pending together. When every call of a
step has a result the session goes back to ``in_progress`` and the next step's calls (new
call ids, the same turn id, as one real turn requesting several rounds) become pending; after
the last step the turn completes and the session goes ``idle``. Each status change is
streamed to SSE listeners and sent as a webhook (``agent.session.created``,
``agent.session.in_progress``, ``agent.session.action_required``, ``agent.session.idle``).

Every state change happens without an ``await`` between its check and its update, so several
replicas hitting the fake at once see the same atomic behaviour as the real service.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any, Literal, Self, get_args

import httpx
from starlette.types import Receive, Scope, Send

from agentfn_asgi.signing import parse_secrets
from agentfn_asgi.testing.fake_endpoints import new_webhook_secret
from agentfn_asgi.testing.fake_http import FaultPlan, InjectedFailure, RecordedRequest, handle_http
from agentfn_asgi.testing.fake_state import FakeCall, FakeRequest, FakeSession, Submission
from agentfn_asgi.testing.fake_webhooks import (
    DEFAULT_WEBHOOK_RETRY_DELAYS,
    DeliveryAttempt,
    WebhookSender,
)

__all__ = ["FakeAgentsAPI", "Route"]

Route = Literal["list", "retrieve", "submit", "stream", "delete", "webhook_endpoints"]
_ROUTES = frozenset(get_args(Route))


class FakeAgentsAPI:
    """An in-memory Agents API (see the module docstring).

    ``api_key`` is the bearer token requests must carry. ``webhook_url`` (one or several)
    receives signed webhooks; ``webhook_secret`` (one or several ``whsec_`` secrets, each
    delivery signed with all) defaults to a random secret exposed as :attr:`webhook_secret`.
    ``webhook_client`` sends them (e.g. over ``httpx.ASGITransport`` to an app in the same
    process); by default the fake owns one. ``webhook_retry_delays`` is the backoff between
    delivery attempts: fast by default (six attempts over 1.5 s, for tests);
    ``webhook_backoff(300)`` retries for five minutes, as ``fake-api`` does.
    ``step_delay`` delays the next step after a step's results (0: at once).
    ``sse_keepalive`` is the seconds between ``: keepalive`` comments.
    ``webhook_concurrency`` is how many deliveries may be in flight at once (1: strictly in
    order; more: every URL of an event is posted at the same time, as a real sender with
    several endpoints, or a load balancer plus retries, would).

    Use ``async with fake:`` (or the ASGI lifespan) so the webhook sender stops cleanly.
    """

    def __init__(
        self,
        *,
        api_key: str = "sk-test",
        webhook_secret: str | Sequence[str] | None = None,
        webhook_url: str | Sequence[str] | None = None,
        webhook_client: httpx.AsyncClient | None = None,
        webhook_retry_delays: Sequence[float] = DEFAULT_WEBHOOK_RETRY_DELAYS,
        step_delay: float = 0.0,
        sse_keepalive: float = 1.0,
        webhook_concurrency: int = 1,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api_key = api_key
        secrets_ = (
            parse_secrets(webhook_secret) if webhook_secret is not None else (new_webhook_secret(),)
        )
        urls = [webhook_url] if isinstance(webhook_url, str) else list(webhook_url or ())
        self.webhooks = WebhookSender(
            secrets=secrets_,
            urls=urls,
            client=webhook_client,
            retry_delays=webhook_retry_delays,
            concurrency=webhook_concurrency,
            clock=clock,
        )
        self.endpoints = self.webhooks.endpoints
        """Webhook endpoints created through ``/webhook_endpoints`` (the SDK's
        ``client.webhooks``); each gets the events it subscribes to, with its own secret."""
        self.step_delay = step_delay
        self.sse_keepalive = sse_keepalive
        self.stream_duplicates = False
        """Send every streamed event twice, with the same ``event_id``."""
        self.clock = clock
        self.sessions: dict[str, FakeSession] = {}
        self.submissions: list[Submission] = []
        """Every result that took effect, in order of acceptance."""
        self.duplicate_submissions: list[Submission] = []
        """Identical repeats of an answered call's result (202, no effect). A replay with the
        same Idempotency-Key and body is not listed: it never reaches the session."""
        self.requests: list[RecordedRequest] = []
        """Every request, in order, with the status it got."""
        self.faults = FaultPlan()
        """Faults waiting to happen; set them with the fault methods below."""
        self.races: set[str] = set()
        """Call ids whose next submission answers the registration-race 400."""
        self.idempotency: dict[str, tuple[str, bytes]] = {}
        """Accepted ``Idempotency-Key`` → (session id, exact body)."""
        self._waiters: list[asyncio.Future[None]] = []

    # -- configuration and inspection ---------------------------------------------------------

    @property
    def webhook_secret(self) -> str:
        """The first webhook signing secret (give it to the app under test)."""
        return self.webhooks.secrets[0]

    @property
    def webhook_secrets(self) -> tuple[str, ...]:
        """Every secret each delivery is signed with."""
        return self.webhooks.secrets

    @property
    def deliveries(self) -> list[DeliveryAttempt]:
        """Every webhook delivery attempt, in order: webhook-id, type, URL, status."""
        return self.webhooks.attempts

    def add_webhook_url(self, url: str, *, client: httpx.AsyncClient | None = None) -> None:
        """Send future webhooks to ``url`` too, through ``client`` when given.

        ``client`` (yours to close) reaches that URL, e.g. over ``httpx.ASGITransport`` into
        an app in this process; :func:`~agentfn_asgi.testing.connect` does this for you.
        """
        self.webhooks.add_url(url, client)

    def remove_webhook_url(self, url: str) -> None:
        """Stop sending webhooks to ``url``; its pending deliveries and retries are dropped."""
        self.webhooks.remove_url(url)

    def create_session(
        self,
        steps: Sequence[Sequence[FakeCall | FakeRequest]],
        *,
        session_id: str | None = None,
        metadata: Mapping[str, str] | None = None,
        deliver: bool = True,
    ) -> str:
        """Create a session whose first turn runs ``steps``; return the session id.

        Each step is a batch of parallel calls, pending together; the session is
        ``requires_action`` on return (or ``idle`` if ``steps`` is empty). Emits
        ``agent.session.created``, ``in_progress`` and ``action_required``; with
        ``deliver=False`` these first events are recorded but no webhook is sent (the app
        learns of the session only when it looks: :meth:`redeliver`, a recovery, a stream).
        """
        sid = session_id or "sess_" + secrets.token_hex(12)
        if sid in self.sessions:
            raise ValueError(f"session {sid} already exists")
        session = FakeSession(self, sid, dict(metadata or {}))
        turn = session.plan_turn(steps)  # a bad script raises before anything is announced
        self.sessions[sid] = session
        if not deliver:
            self.webhooks.muted.add(sid)
        try:
            session.announce_created()
            session.begin_turn(turn)
        finally:
            self.webhooks.muted.discard(sid)
        return sid

    def start_turn(self, session_id: str, steps: Sequence[Sequence[FakeCall | FakeRequest]]) -> str:
        """Start a new turn with ``steps`` on an idle session; return the turn id."""
        return self._get(session_id).start_turn(steps)

    def queue_turn(
        self, session_id: str, steps: Sequence[Sequence[FakeCall | FakeRequest]]
    ) -> None:
        """Script the turn that the next ``agent.session.input.message`` starts."""
        self._get(session_id).queued_turns.append([list(step) for step in steps])

    def session(self, session_id: str) -> dict[str, Any]:
        """The JSON ``GET /agents/sessions/{id}`` returns now. KeyError if unknown."""
        return self._get(session_id).snapshot()

    def required_actions(self, session_id: str) -> list[dict[str, Any]]:
        """The session's ``required_actions`` now."""
        return self._get(session_id).required_actions()

    def events(self, session_id: str) -> list[dict[str, Any]]:
        """Every session event emitted so far (what an SSE listener from the start saw)."""
        return list(self._get(session_id).history)

    def require_environment(self, session_id: str, environment_id: str) -> None:
        """The session waits for its self-hosted environment ``environment_id`` to connect:
        an ``environment_connection`` action is listed (after the calls) until
        :meth:`environment_connected`, and an ``agent.session.action_required`` webhook
        announces it."""
        self._get(session_id).require_environment(environment_id)

    def environment_connected(self, session_id: str, environment_id: str) -> bool:
        """The environment connected (as the real one tells the API itself): its
        ``environment_connection`` action is no longer listed. False if it was not."""
        return self._get(session_id).environment_connected(environment_id)

    def cancel_turn(self, session_id: str) -> bool:
        """Cancel the active turn: its calls stop being pending, the session goes idle.

        Returns False if no turn was active.
        """
        return self._get(session_id).cancel_turn()

    def pause_on_budget(
        self, session_id: str, *, limit: int = 100, consumed: int | None = None
    ) -> None:
        """Pause a session on its spending limit, as openai 3.63 does when a session's
        ``spend_control.consumed`` reaches its ``limit`` (USD cents; ``consumed`` defaults
        to ``limit``, and may not be less): status ``budget_reached`` and the stream event
        ``agent.session.budget_reached`` (there is no webhook for it). The active turn is
        left as it is (whether the real API ends it is not documented): its pending calls
        stay pending, and no next step opens while the session is paused."""
        self._get(session_id).pause_on_budget(limit=limit, consumed=consumed)

    def fail_turn(
        self,
        session_id: str,
        code: str = "internal_error",
        message: str = "The turn failed.",
    ) -> bool:
        """Fail the active turn with a turn error ``code`` (``session_budget_exceeded``,
        ``rate_limit_exceeded``...): its calls stop being pending, the session goes
        ``failed`` and ``agent.session.failed`` is sent to the webhook URL (when one is
        set). ``GET …/turns/{turn_id}`` then shows the error. False if no turn was active."""
        return self._get(session_id).fail_turn(code, message)

    def delete_session(self, session_id: str) -> None:
        """Forget a session: every request for it then answers 404; streams end."""
        self.sessions.pop(session_id).close_streams()

    def redeliver(self, session_id: str) -> str | None:
        """Send a fresh ``action_required`` webhook (a new webhook-id) if calls are pending.

        This is what the real service does when it notices that a session still waits.
        Returns the new webhook-id, or None when nothing is pending or no URL is set.
        """
        session = self._get(session_id)
        return session.announce_action("function_call") if session.pending_calls() else None

    async def test_webhook_endpoint(self, endpoint_id: str, event_type: str) -> int | None:
        """Sign a sample ``event_type`` event with the endpoint's secret(s) and post it once
        (what ``POST /webhook_endpoints/{id}/test`` does); return the status it got, None
        when no answer came (the attempt, with its error, is in :attr:`deliveries`).
        KeyError for an unknown endpoint."""
        return await self.webhooks.send_test(endpoint_id, event_type)

    # -- faults -------------------------------------------------------------------------------

    def fail_next(
        self,
        route: Route,
        n: int = 1,
        status: int = 500,
        *,
        retry_after: float | str | None = None,
        retry_after_ms: float | None = None,
        body: Any = None,
        should_retry: bool | None = None,
        after_processing: bool = False,
        session_id: str | None = None,
    ) -> None:
        """Answer the next ``n`` requests of ``route`` with ``status`` and no effect; with
        ``session_id``, the next ``n`` of that session only (before the route's own).

        ``retry_after`` sets ``Retry-After`` (seconds, or any string such as an HTTP date),
        ``retry_after_ms`` sets ``retry-after-ms``, ``should_retry`` sets ``x-should-retry``,
        and ``body`` replaces the default error JSON (bytes are sent as is).

        With ``after_processing`` each request is served first (a submitted result takes
        effect) and only its answer is replaced by the error: an applied-then-failed request,
        as a gateway timing out in front of a server that finished. Not for ``stream``.
        """
        self._check_route(route)
        if after_processing and route == "stream":
            raise ValueError("after_processing needs a route that answers once, not 'stream'")
        headers: dict[str, str] = {}
        if retry_after is not None:
            headers["retry-after"] = str(retry_after)
        if retry_after_ms is not None:
            headers["retry-after-ms"] = str(retry_after_ms)
        if should_retry is not None:
            headers["x-should-retry"] = "true" if should_retry else "false"
        queue = self.faults.failures[route if session_id is None else f"{route} {session_id}"]
        queue.extend([InjectedFailure(status, headers, body, after_processing)] * n)

    def set_latency(self, route: Route, seconds: float) -> None:
        """Wait ``seconds`` before answering each request of ``route`` (0 turns it off)."""
        self._check_route(route)
        self.faults.latency[route] = seconds

    def drop_next(self, route: Route, n: int = 1, *, after_processing: bool = False) -> None:
        """Drop the connection on the next ``n`` requests of ``route`` without an answer.

        With ``after_processing`` the request takes effect first (a result is accepted) and
        only the answer is lost: the retry must then be harmless.

        Over a real server the client sees the connection close mid-response. In-process over
        ``httpx.ASGITransport`` the app raises :class:`FakeConnectionDropped`, a subclass of
        ``httpx.RemoteProtocolError``, so an httpx client sees a transport error either way.
        """
        self._check_route(route)
        for _ in range(n):
            self.faults.drops[route].append(after_processing)

    def cut_streams(
        self, session_id: str | None = None, *, before: str | None = None, n: int = 1
    ) -> int:
        """Drop SSE connections mid-turn, as a network or a server restart would.

        Without ``before``, every open stream of ``session_id`` (of every session when None)
        is cut now, after the events already queued for it; returns how many. With
        ``before`` (an event type such as ``"agent.session.requires_action"``), the next
        ``n`` streams (of ``session_id``, or any) about to send an event of that type are cut
        instead of sending it: that event never reaches them, so only a re-read of the
        session after reconnecting shows what happened; returns 0.

        The client sees the connection close mid-body (over ``httpx.ASGITransport``,
        :class:`FakeConnectionDropped`, an ``httpx.RemoteProtocolError``).
        """
        if before is not None:
            for _ in range(n):
                self.faults.stream_cuts.append((session_id, before))
            return 0
        targets = [self._get(session_id)] if session_id else list(self.sessions.values())
        return sum(session.cut_streams() for session in targets)

    def duplicate_stream_events(self, on: bool = True) -> None:
        """Stream every event twice with the same ``event_id`` (the real stream repeats
        events on occasion; clients drop repeats by ``event_id``)."""
        self.stream_duplicates = on

    def race_once(self, call_id: str) -> None:
        """The next submission for ``call_id`` answers the registration-race 400 once."""
        self.races.add(call_id)

    def duplicate_webhooks(self, on: bool = True) -> None:
        """Send every webhook delivery twice, with the same webhook-id."""
        self.webhooks.duplicate = on

    def reorder_webhooks(self, on: bool = True) -> None:
        """Deliver webhooks out of order: each delivery is overtaken by the next one."""
        self.webhooks.reorder = on

    # -- waiting ------------------------------------------------------------------------------

    # The interface promises ``timeout`` arguments (ASYNC109): tests read better with them.

    async def wait_idle(self, session_id: str, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        """Wait until the session is idle (TimeoutError after ``timeout`` seconds)."""
        async with asyncio.timeout(timeout):
            while self._get(session_id).status != "idle":
                await self._next_change()

    async def wait_for_submissions(
        self,
        n: int,
        timeout: float = 10.0,  # noqa: ASYNC109
    ) -> list[Submission]:
        """Wait until at least ``n`` results took effect; return them all."""
        async with asyncio.timeout(timeout):
            while len(self.submissions) < n:
                await self._next_change()
        return list(self.submissions)

    def notify(self) -> None:
        """Wake the ``wait_*`` helpers: a session changed (called by the sessions)."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def _next_change(self) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        await waiter

    async def drain_webhooks(self, timeout: float = 10.0) -> None:  # noqa: ASYNC109
        """Wait until every webhook was delivered or used up its attempts."""
        await self.webhooks.drain(timeout)

    # -- lifecycle ----------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Stop the webhook sender (pending retries are dropped) and end open streams."""
        for session in self.sessions.values():
            session.close_streams()
        await self.webhooks.aclose()

    async def __aenter__(self) -> Self:
        self.webhooks.ensure_started()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- ASGI ---------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve HTTP requests; the lifespan starts and stops the webhook sender."""
        if scope["type"] == "http":
            await handle_http(self, scope, receive, send)
        elif scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    self.webhooks.ensure_started()
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await self.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        else:  # websocket: nothing to serve
            await send({"type": "websocket.close", "code": 1000})

    # -- helpers ------------------------------------------------------------------------------

    def _get(self, session_id: str) -> FakeSession:
        try:
            return self.sessions[session_id]
        except KeyError:
            raise KeyError(f"no session {session_id!r}") from None

    @staticmethod
    def _check_route(route: str) -> None:
        if route not in _ROUTES:
            raise ValueError(f"unknown route {route!r}; use one of {sorted(_ROUTES)}")
