"""``AgentWebhookApp``: the pure ASGI sub-app that receives ``agent.*`` webhooks.

It only gathers bytes, calls the pure cores and maps their errors to status codes; the work
happens in :class:`~agentfn_asgi.dispatch.Dispatcher` (the package docstring of
:mod:`agentfn_asgi.dispatch` draws one delivery's whole route). Every answer is deliberate:

========================================================  ======
situation                                                 status
========================================================  ======
verified ``action_required`` (any action type), recorded  200
verified ``idle`` / ``failed`` (a turn ended), recorded   200
duplicate ``webhook-id`` (already recorded)               200
other event types (one INFO line)                         200 (ignored)
missing, malformed or repeated ``webhook-*`` header       400
body is not a JSON webhook envelope / no session id       400
bad signature, timestamp outside the tolerance            401
method other than POST (GET/HEAD for ``/healthz``)        405 (with ``Allow``)
any other path below the mount point (exact, no redirect) 404
body not received within ``body_timeout``                 408
body larger than ``max_body_size``                        413
store unavailable, shutting down, unexpected failure      503 (the sender retries)
========================================================  ======

``POST {mount}/calls/complete`` takes a worker's result for a queued call; its answers are
listed in :mod:`agentfn_asgi.jobs`.

No untrusted input can produce a 500 or run a handler: handlers only run for calls read from
the live session after a verified delivery was recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from starlette.types import Message, Receive, Scope, Send

from ._asgi import (
    BodyTooLargeError,
    DisconnectedError,
    exact_router,
    header,
    read_body,
    send_json,
)
from ._crash import crash_point
from .actions import ActionPolicy, ConnectEnvironmentHook, SignInHook
from .backoff import Backoff
from .calls.records import CallKey, CallState
from .client import AgentsClient
from .config import Config
from .dispatch import Dispatcher, DispatchSettings
from .dispatch.approvals import ApprovalView
from .errors import (
    ConfigurationError,
    StoreError,
    WebhookHeaderError,
    WebhookSignatureError,
    WebhookTimestampError,
    WebhookVerificationError,
)
from .jobs import COMPLETE_PATH, COMPLETION_BODY_LIMIT, WorkerJobs, worker_jobs
from .logs import one_line_start_failure, show_by_default
from .operator import Operator
from .signing import WebhookVerifier, parse_secrets
from .store import Store, store_location
from .stream import FollowSummary, follow_session, stream_delivery_id
from .tools import FunctionTools
from .tracing import DeliverySpan, Telemetry
from .wire import SESSION_ID_RE, AgentSession, parse_webhook_event

__all__ = ["AgentWebhookApp"]

logger = logging.getLogger("agentfn_asgi.app")
_T = TypeVar("_T")


ACTION_REQUIRED = "agent.session.action_required"
#: A turn ended (completed, cancelled or failed): the session is read again and what it no
#: longer waits for is stopped (:mod:`agentfn_asgi.dispatch.cancelling`).
TURN_ENDED = frozenset({"agent.session.idle", "agent.session.failed"})
DEFAULT_MAX_BODY = 1024 * 1024

_REJECT_HINTS = {
    "bad_signature": (
        "check OPENAI_WEBHOOK_SECRET: it must be this endpoint's signing secret (whsec_...; "
        "old and new, separated by a comma, during a rotation)"
    ),
    "bad_timestamp": "check this host's clock (NTP): the sender's timestamp is out of tolerance",
    "bad_header": "the request is not a Standard Webhooks delivery (webhook-* headers)",
    "too_large": "raise max_body_size if such deliveries are legitimate",
    "body_timeout": "the sender was slower than body_timeout",
    "malformed_body": "the signed body is not an agent webhook event",
}
_THROTTLE_SECONDS = 60.0
_SIGNED_HEADERS = frozenset({"webhook-id", "webhook-timestamp", "webhook-signature"})

_REJECT_REASONS: dict[type[Exception], str] = {
    WebhookHeaderError: "bad_header",
    WebhookSignatureError: "bad_signature",
    WebhookTimestampError: "bad_timestamp",
}


class AgentWebhookApp:
    """Mount this at your webhook URL; it verifies, records, acknowledges and dispatches.

    Every option left out is read from the environment through
    :meth:`agentfn_asgi.config.Config.from_env` (or taken from ``config=``); see the
    documentation's configuration page.

    Building the app never fails for a missing or malformed secret, key or setting, so a
    module that builds it at import time always imports (the CLI's ``agentfn-asgi tools``,
    pytest's collection). The configuration is checked at start-up (the lifespan, or the
    first request when the host runs none, which then gets 503 and logs why), or earlier
    with :meth:`check`; every problem is named at once.

    Args:
        tools: the registry whose handlers run and whose definitions you gave the agent.
        webhook_secret: one ``whsec_...`` secret or several (rotation); default
            ``OPENAI_WEBHOOK_SECRET`` (several separated by spaces or commas).
        client: an :class:`AgentsClient`; default one built from ``OPENAI_API_KEY``,
            ``OPENAI_BASE_URL``, ``OPENAI_PROJECT_ID`` and ``OPENAI_ORG_ID``.
        store: a :class:`Store` or a store URL; default ``AGENTFN_STORE_URL`` or
            ``sqlite:///agentfn.sqlite3``.
        tolerance: accepted webhook timestamp skew, seconds, both directions.
        max_body_size: larger bodies get 413 without being read.
        body_timeout: a sender slower than this gets 408.
        settings: how calls run (:class:`DispatchSettings`); default from ``AGENTFN_*``.
        resources: any object handed to handlers as ``ToolContext.resources`` (a database
            pool, settings, clients created at start-up).
        drain_timeout: on shutdown, how long in-flight calls may finish before they are left
            to recovery.
        telemetry: a :class:`~agentfn_asgi.tracing.Telemetry` (spans and metrics).
        completion_secret: signs the completion tokens of tools with ``enqueue=`` (one, or
            several for a rotation, newest last); default ``AGENTFN_COMPLETION_SECRET``.
            Required when a tool enqueues. See :mod:`agentfn_asgi.jobs`.
        public_url: this app's public URL (where it is mounted), so that jobs carry
            ``complete_url``; default ``AGENTFN_PUBLIC_URL``.
        config: the environment's configuration, when you read it yourself.
        on_approval_request: an async callable receiving each new approval request (an
            :class:`~agentfn_asgi.dispatch.approvals.ApprovalView`) once, from the replica
            that made it, to post it to chat or email; retried with backoff when it raises,
            never holding up any call.
        actions: how the session's MCP and computer-use approval requests are answered: a
            callable (sync or async) from an :data:`~agentfn_asgi.actions.ActionRequest` to
            ``approve``, ``deny``, ``cancel``, ``ask`` (a person decides, as for
            ``approval=`` tools) or ``leave``; or :class:`~agentfn_asgi.actions.ActionRules`.
            Default: none is answered (each is left pending, recorded ``unanswered`` and
            shown, with one WARNING per session and kind).
        sign_in: answers a computer-use agent's ``browser_authentication`` request: a
            callable (sync or async) from a :class:`~agentfn_asgi.actions.SignInRequest` to
            a :class:`~agentfn_asgi.actions.SignIn` (values from your secret store) or None
            (cancel). Asked when the answer is due; the values are submitted from memory
            and never stored, logged, traced or shown (a crash asks again).
        connect_environment: starts or wakes a self-hosted environment when a session waits
            for it (``environment_connection``): a callable (sync or async) from an
            :class:`~agentfn_asgi.actions.EnvironmentConnection` (session id, environment
            id, the session's ``environment``). Run at least once per occurrence of the
            action (keep it idempotent), as a call: deduplicated across replicas, with its
            span, metric and log line, run again when it raises. Nothing is POSTed for it.
            Default: none (the action is left pending, recorded ``unanswered`` and shown).
    """

    def __init__(
        self,
        tools: FunctionTools,
        *,
        webhook_secret: str | Sequence[str] | None = None,
        client: AgentsClient | None = None,
        store: Store | str | None = None,
        tolerance: float = 300.0,
        max_body_size: int = DEFAULT_MAX_BODY,
        body_timeout: float = 10.0,
        settings: DispatchSettings | None = None,
        resources: Any = None,
        drain_timeout: float = 10.0,
        clock: Callable[[], float] = time.time,
        telemetry: Telemetry | None = None,
        completion_secret: str | Sequence[str] | None = None,
        public_url: str | None = None,
        config: Config | None = None,
        on_approval_request: Callable[[ApprovalView], Awaitable[Any]] | None = None,
        actions: ActionPolicy | None = None,
        sign_in: SignInHook | None = None,
        connect_environment: ConnectEnvironmentHook | None = None,
    ) -> None:
        self.tools = tools
        self.max_body_size = max_body_size
        self.body_timeout = body_timeout
        self.drain_timeout = drain_timeout
        # The environment is read now (the app sees the variables set when it was built), but
        # nothing is checked: a module that builds the app at import time must import without
        # secrets (the CLI's `tools`, pytest's collection). _parts() checks and assembles.
        env: Config | ConfigurationError
        try:
            env = config if config is not None else Config.from_env()
        except ConfigurationError as exc:
            env = exc
        self._assemble = functools.partial(
            _assemble,
            tools,
            env,
            webhook_secret=webhook_secret,
            client=client,
            store=store,
            tolerance=tolerance,
            settings=settings,
            resources=resources,
            clock=clock,
            telemetry=telemetry,
            completion_secret=completion_secret,
            public_url=public_url,
            on_approval_request=on_approval_request,
            actions=actions,
            sign_in=sign_in,
            connect_environment=connect_environment,
        )
        self._env = env
        self._approval_links: Callable[[ApprovalView], dict[str, str]] | None = None
        self._assembled: _Parts | None = None
        self._start_lock = asyncio.Lock()
        self._draining = False
        self._rejections = _Throttle()
        self._ignored = _Throttle()
        self._lazy_warned = False
        routes = [("/", self._webhook, "POST"), ("/healthz", self._health, "GET, HEAD")]
        routes.append((COMPLETE_PATH, self._complete, "POST"))
        self._router = exact_router(routes, _not_found, _not_allowed)

    # -- the parts, assembled on first use -------------------------------------------------
    def check(self) -> None:
        """Check the configuration and assemble the app now, instead of at start-up.

        Building the app never fails for a missing secret, key or setting, so that a module
        which builds it at import time always imports. Start-up (the lifespan, or the first
        request when the host runs none) runs these checks; call ``check()`` to run them
        earlier, e.g. in a deployment's smoke test. Accessing ``client``, ``store``,
        ``dispatcher``, ``verifier``, ``telemetry`` or ``operator()`` runs them too.

        Raises :class:`~agentfn_asgi.errors.ConfigurationError` naming every problem found
        (no webhook secret, no API key, a malformed store URL or ``AGENTFN_*`` value, a worker
        tool without a completion secret or public URL, ...), each with its fix.
        """
        self._parts()

    def _parts(self) -> _Parts:
        if self._assembled is None:
            self._assembled = self._assemble()
            self._assembled.dispatcher.approvals.links = self._approval_links
        return self._assembled

    @property
    def config(self) -> Config:
        """What the environment said when the app was built (or ``config=``); raises
        :class:`~agentfn_asgi.errors.ConfigurationError` if it could not be read."""
        if isinstance(self._env, ConfigurationError):
            raise self._env
        return self._env

    def link_approvals(self, links: Callable[[ApprovalView], dict[str, str]]) -> None:
        """Have each new approval request carry ``links(request)`` when it reaches
        ``on_approval_request`` (the operator page's signed link; it calls this)."""
        self._approval_links = links
        if self._assembled is not None:
            self._assembled.dispatcher.approvals.links = links

    @property
    def verifier(self) -> WebhookVerifier:
        """The webhook signature verifier (its secrets)."""
        return self._parts().verifier

    @property
    def jobs(self) -> WorkerJobs | None:
        """The worker lane (completion tokens), or None when no completion secret is set."""
        return self._parts().jobs

    @property
    def telemetry(self) -> Telemetry:
        """Spans and metrics."""
        return self._parts().telemetry

    @property
    def client(self) -> AgentsClient:
        """The Agents API client."""
        return self._parts().client

    @property
    def store(self) -> Store:
        """The durable store."""
        return self._parts().store

    @property
    def store_location(self) -> str:
        """Where the store keeps its data (resolved, password hidden), logged at start-up."""
        return self._parts().store_location

    @property
    def dispatcher(self) -> Dispatcher:
        """What claims, runs, saves and submits calls."""
        return self._parts().dispatcher

    # -- lifecycle -------------------------------------------------------------------------
    async def startup(self) -> None:
        """Check the configuration (see :meth:`check`), open the store and start dispatching,
        with a recovery sweep. Idempotent.

        Where the host configured no logging at all, the package's INFO lines (this start-up
        line, refused deliveries, ``call finished``) are printed to standard error
        (:func:`agentfn_asgi.logs.show_by_default`)."""
        if self._parts().dispatcher.started:
            return  # the per-delivery call (lazy start) costs no lock once running
        show_by_default()
        async with self._start_lock:
            if not self.dispatcher.started and not self._draining:
                await self.dispatcher.start(recover=True)
                count = len(self.tools)
                logger.info(
                    "agentfn-asgi started: %d tool%s, store %s",
                    count,
                    "" if count == 1 else "s",
                    self.store_location,
                )

    async def _lazy_startup(self) -> None:
        """Start on a request because no lifespan started the app: say once what is lost."""
        if self.dispatcher.started:
            return
        if not self._lazy_warned:
            self._lazy_warned = True
            logger.warning(
                "agentfn-asgi is starting lazily on its first request: the host did not run "
                "its lifespan (Starlette/FastAPI: lifespan=webhooks.lifespan; Django: "
                "with_webhooks). Start-up recovery ran only now, and on shutdown in-flight "
                "calls are not drained: they are left to the lease and the next start."
            )
        await self.startup()

    async def shutdown(self) -> None:
        """Stop taking work (503), drain in-flight calls, then release the store and client."""
        self._draining = True
        parts = self._assembled
        if parts is None:
            return  # never assembled (its configuration failed): nothing was opened
        await parts.dispatcher.stop(drain_timeout=self.drain_timeout)
        with contextlib.suppress(StoreError):
            await parts.store.close()
        if parts.owns_client:
            await parts.client.aclose()

    def operator(self) -> Operator:
        """What an operator sees and does for this app (the CLI's ``calls`` and the operator
        page, :mod:`agentfn_asgi.admin`, read through it)."""
        return Operator(self.store, dispatcher=self.dispatcher, location=self.store_location)

    async def approve(self, approval_id: str, *, by: str) -> ApprovalView:
        """A person (``by``: who, for the history and the log) approves the waiting request
        ``approval_id``: the call runs once, on whichever replica claims it first, within
        about a second. Raises :class:`~agentfn_asgi.errors.ApprovalNotFoundError`,
        :class:`~agentfn_asgi.errors.ApprovalExpiredError` or
        :class:`~agentfn_asgi.errors.ApprovalDecidedError` (decided already: once only)."""
        await self.startup()
        return await self.dispatcher.approve(approval_id, by=by, via="api")

    async def deny(self, approval_id: str, *, reason: str | None = None, by: str) -> ApprovalView:
        """A person denies the waiting request ``approval_id``: the call fails at once with
        ``reason``, which the model sees. Raises as :meth:`approve`."""
        await self.startup()
        return await self.dispatcher.deny(approval_id, by=by, reason=reason, via="api")

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: object = None) -> AsyncIterator[None]:
        """Start-up recovery and graceful shutdown, in one line for the host.

        ``Starlette(lifespan=webhooks.lifespan)``, ``FastAPI(lifespan=webhooks.lifespan)``,
        or ``async with webhooks.lifespan(): ...`` inside your own lifespan. Without it the
        app starts lazily on its first request (hosts rarely forward lifespan to mounts).

        A configuration mistake fails the start-up with :class:`ConfigurationError`; under
        uvicorn it is printed as one line (:func:`agentfn_asgi.logs.one_line_start_failure`).
        """
        try:
            await self.startup()
        except ConfigurationError as exc:
            one_line_start_failure(str(exc))
            # Raised afresh here: the frames of the checks below say nothing to fix.
            raise ConfigurationError(str(exc)) from None
        try:
            yield
        finally:
            await self.shutdown()

    async def recover(self, session_id: str | None = None) -> None:
        """Re-read one session (or run a full recovery sweep) and finish what is owed."""
        await self.startup()
        await self.dispatcher.recover(session_id)

    async def follow(self, session_id: str, *, backoff: Backoff | None = None) -> FollowSummary:
        """Drive one session from its event stream until it is idle, failed, cancelled or
        paused on its spending limit (``budget_reached``).

        Stream mode, for scripts and notebooks that create the session themselves: no
        webhook reaches this process. Whenever the session requires action, a delivery is
        recorded in the store and the session goes to the dispatcher, exactly as a webhook
        would send it: calls are claimed, run, saved and submitted with the same guarantees.
        What is owed comes from re-reading ``required_actions``, never from a streamed item;
        a dropped stream is reconnected with ``backoff`` and the session read again.

        Starts the app if needed (stop it with :meth:`shutdown`, or run this inside
        ``async with webhooks.lifespan():``). Returns a :class:`FollowSummary` once the
        session's calls have settled here. Raises :class:`~agentfn_asgi.errors.APIStatusError`
        for 400/401/403 (a wrong key or project) and
        :class:`~agentfn_asgi.errors.StoreError` if a delivery cannot be recorded.
        """
        if self._draining:
            raise ConfigurationError("follow() after shutdown(): this app no longer runs calls")
        await self.startup()
        owed: set[CallKey] = set()
        recorded = 0
        dispatcher = self.dispatcher

        async def on_action(session: AgentSession) -> None:
            nonlocal recorded
            # Function calls are ours; other actions when the dispatcher answers them (the
            # same decision as its claims: a policy, the sign-in hook, the connect hook).
            calls = [
                c
                for c in (*session.calls, *session.turnless_calls)
                if c.request_type is None or dispatcher.answers(c)
            ]
            if not session.required_actions:
                return
            # What nobody here answers is recorded too (unanswered, and shown), as for a
            # webhook; only what is answered here is owed.
            owed.update(CallKey(session.id, call.turn_id, call.call_id) for call in calls)
            delivery_id = stream_delivery_id(session)
            if await self.store.record_delivery(
                delivery_id, session.id, nonce=secrets.token_hex(8)
            ):
                recorded += 1
                self.dispatcher.schedule(session.id, delivery_id)

        end = await follow_session(
            self.client, session_id, on_action, backoff=backoff, notice=logger.info
        )
        if owed:
            # The turn ended (idle, cancelled, failed, deleted): stop what it no longer owes,
            # rather than wait for handlers whose answers nobody wants. Paused on its budget,
            # the session may still list calls: this read starts those not started yet.
            await self.dispatcher.resolve(session_id, settle=True)
        await self.dispatcher.wait_for(owed)
        records = [await self.store.get_call(key) for key in owed]
        return FollowSummary(
            session_id=session_id,
            status=end.status,
            calls_owed=len(owed),
            calls_run=sum(1 for r in records if r is not None and r.state.has_result),
            results_submitted=sum(
                1 for r in records if r is not None and r.state == CallState.SUBMITTED
            ),
            deliveries=recorded,
            reconnects=end.reconnects,
        )

    # -- ASGI ----------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan_protocol(receive, send)
            return
        if scope["type"] != "http":
            return  # websockets are not ours; closing without accept refuses them
        try:
            self._parts()
        except ConfigurationError as exc:
            await self._unconfigured(send, exc, head=scope.get("method") == "HEAD")
            return
        await self._router(scope, receive, send)

    async def _lifespan_protocol(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    # The server prints the message: one line, saying what to fix.
                    text = f"agentfn-asgi cannot start: {exc}"
                    await send({"type": "lifespan.startup.failed", "message": text})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _unconfigured(self, send: Send, exc: ConfigurationError, *, head: bool) -> None:
        """A request reached an app that cannot start (no lifespan said so first; its store
        URL names a folder that does not exist...): 503, so a webhook sender retries once the
        setting is fixed, and the reason as an ERROR (at most once a minute: a sender may
        retry many times)."""
        shown, suppressed = self._rejections.allow("unconfigured")
        if shown:
            show_by_default()  # a host with no logging configured sees the reason too
            more = f" ({suppressed} more requests since the last line)" if suppressed else ""
            logger.error("agentfn-asgi cannot start, answering 503: %s%s", exc, more)
        await send_json(send, 503, {"error": "not configured"}, retry_after="60", head=head)

    async def _health(self, scope: Scope, receive: Receive, send: Send) -> None:
        head = scope["method"] == "HEAD"
        try:
            await asyncio.wait_for(self.store.ping(), timeout=2.0)
        except ConfigurationError as exc:  # the store cannot open as configured
            await self._unconfigured(send, exc, head=head)
            return
        except (StoreError, TimeoutError) as exc:
            # The detail (paths, hosts) is for the operator's log, not for anonymous callers.
            logger.warning("health check: store unavailable: %s", exc)
            await send_json(send, 503, {"status": "unavailable", "store": "unavailable"}, head=head)
            return
        status = "draining" if self._draining else "ok"
        await send_json(
            send,
            503 if self._draining else 200,
            {"status": status, "store": "ok", "inflight": self.dispatcher.inflight},
            head=head,
        )

    async def _complete(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A worker's result for a queued call (the answers are in :mod:`agentfn_asgi.jobs`)."""
        if self.jobs is None:
            await send_json(send, 404, {"error": "not found"})
            return
        if self._draining:
            await send_json(send, 503, {"error": "shutting down"}, retry_after="5")
            return
        await self.jobs.complete(
            scope,
            receive,
            send,
            dispatcher=self.dispatcher,
            ready=self._lazy_startup,
            body_limit=max(self.max_body_size, COMPLETION_BODY_LIMIT),
            body_timeout=self.body_timeout,
        )

    async def _webhook(self, scope: Scope, receive: Receive, send: Send) -> None:
        with self.telemetry.delivery(delivery_id=header(scope, b"webhook-id")) as span:
            await self._webhook_in_span(scope, receive, send, span)

    async def _webhook_in_span(
        self, scope: Scope, receive: Receive, send: Send, span: DeliverySpan
    ) -> None:
        if self._draining:
            span.set_outcome("unavailable", "draining")
            await send_json(send, 503, {"error": "shutting down"}, retry_after="5")
            return
        try:
            body = await read_body(
                receive, scope, limit=self.max_body_size, timeout=self.body_timeout
            )
        except BodyTooLargeError:
            span.set_outcome("rejected", "too_large")
            self._log_rejection(scope, "too_large", f"body over {self.max_body_size} bytes")
            await send_json(send, 413, {"error": f"body over {self.max_body_size} bytes"})
            return
        except TimeoutError:
            span.set_outcome("rejected", "body_timeout")
            self._log_rejection(scope, "body_timeout", "body not received in time")
            await send_json(send, 408, {"error": "body not received in time"})
            return
        except DisconnectedError:
            span.set_outcome("rejected", "disconnected")
            return
        headers: dict[str, str] = {}
        for key, value in scope.get("headers", ()):
            name = key.decode("latin-1")
            if name in headers and name in _SIGNED_HEADERS:
                # Which copy is signed? Parts of the app would read different ones (the
                # span the first, the verifier the last): none is taken.
                span.set_outcome("rejected", "bad_header")
                self._log_rejection(scope, "bad_header", f"the {name} header appears twice")
                await send_json(send, 400, {"error": f"the {name} header appears twice"})
                return
            headers[name] = value.decode("latin-1")
        try:
            delivery = self.verifier.verify(body, headers)
        except WebhookVerificationError as exc:
            reason = _REJECT_REASONS.get(type(exc), "verification")
            span.set_outcome("rejected", reason)
            self._log_rejection(scope, reason, str(exc))
            await send_json(send, exc.status_code, {"error": str(exc)})
            return
        answered = False

        async def answer(message: Message) -> None:
            nonlocal answered
            answered = True
            await send(message)

        try:
            await self._accept(delivery.msg_id, body, answer, span)
        except Exception as exc:
            if answered:  # the answer went out (or sending it failed): nothing to add
                logger.warning("delivery %s: failed after its answer: %r", delivery.msg_id, exc)
                return
            span.set_outcome("unavailable", "internal_error")
            # Verified but something of ours failed: never a 500; 503 makes the sender retry.
            logger.exception("could not accept delivery %s", delivery.msg_id)
            await send_json(send, 503, {"error": "temporarily unavailable"}, retry_after="5")

    def _log_rejection(self, scope: Scope, reason: str, detail: str) -> None:
        """A WARNING naming why a delivery was refused, and what to check (at most one per
        reason a minute, with a count of the ones not shown); never the body or a secret."""
        shown, suppressed = self._rejections.allow(reason)
        if not shown:
            return
        client = scope.get("client") or ("?", 0)
        more = f" ({suppressed} more since the last line)" if suppressed else ""
        logger.warning(
            "webhook delivery refused (%s) from %s: %s; %s%s",
            reason,
            client[0],
            detail,
            _REJECT_HINTS.get(reason, "the request is not a valid delivery"),
            more,
            extra={"agentfn": {"reason": reason, "client": client[0], "suppressed": suppressed}},
        )

    def _log_ignored(self, delivery_id: str, event_type: str) -> None:
        """One INFO line for a delivery answered 200 with nothing to do (another event type,
        a sample from ``agentfn-asgi webhooks test``): one per event type a minute, with a
        count of the ones not shown."""
        shown, suppressed = self._ignored.allow(event_type)
        if not shown:
            return
        what = "this app acts only on agent.session.action_required, idle and failed"
        more = f" ({suppressed} more since the last line)" if suppressed else ""
        logger.info(
            "webhook %s (%s) answered 200, nothing to do: %s%s",
            delivery_id,
            event_type,
            what,
            more,
            extra={"agentfn": {"event_type": event_type, "suppressed": suppressed}},
        )

    async def _accept(self, delivery_id: str, body: bytes, send: Send, span: DeliverySpan) -> None:
        try:
            event = parse_webhook_event(body)
        except ValueError:
            span.set_outcome("rejected", "malformed_body")
            self._log_rejection({}, "malformed_body", "the body is not a webhook envelope")
            await send_json(send, 400, {"error": "body is not a webhook event envelope"})
            return
        # Whatever action it names: the webhook names one action type even when several are
        # pending (an MCP approval and a function call), so only the session tells.
        if event.type != ACTION_REQUIRED and event.type not in TURN_ENDED:
            span.set_event_type(event.type)
            span.set_outcome("ignored")
            self._log_ignored(delivery_id, event.type)
            await send_json(send, 200, {"status": "ignored"})
            return
        session_id = event.session_id
        if not session_id:
            span.set_outcome("rejected", "no_session_id")
            given = event.data.get("id")
            error = (
                "data.id (the session id) is missing"
                if given is None or given == ""
                else f"data.id (the session id) must match {SESSION_ID_RE.pattern} "
                "(letters, digits, '_' and '-', at most 256)"
            )
            await send_json(send, 400, {"error": error})
            return
        try:
            await self._lazy_startup()
            # A nonce of this request: if the write commits but its answer is lost and the
            # store retries it, the repeat is recognised as ours (new), not a duplicate.
            is_new = await self.store.record_delivery(
                delivery_id, session_id, nonce=secrets.token_hex(8)
            )
        except ConfigurationError as exc:  # started lazily, and it cannot start
            span.set_outcome("unavailable", "unconfigured")
            await self._unconfigured(send, exc, head=False)
            return
        except StoreError as exc:
            span.set_outcome("unavailable", "store")
            logger.warning("store unavailable, asking the sender to retry: %s", exc)
            await send_json(send, 503, {"error": "store unavailable"}, retry_after="5")
            return
        span.set_session(session_id)
        if not is_new:
            span.set_outcome("duplicate")
            await send_json(send, 200, {"status": "duplicate"})
            return
        # Acknowledge only after the delivery is durably recorded (architecture step 5).
        crash_point("before_ack")
        span.set_outcome("accepted")
        # The calls this delivery causes here link back to its span.
        self.telemetry.remember_delivery(delivery_id, span.link)
        self.dispatcher.schedule(session_id, delivery_id, settle=event.type in TURN_ENDED)
        await send_json(send, 200, {"status": "accepted"})
        crash_point("after_ack")


@dataclass(frozen=True, slots=True)
class _Parts:
    """What an app is assembled from once its configuration checked out."""

    verifier: WebhookVerifier
    jobs: WorkerJobs | None
    telemetry: Telemetry
    client: AgentsClient
    owns_client: bool
    store: Store
    store_location: str
    dispatcher: Dispatcher


def _assemble(
    tools: FunctionTools,
    env: Config | ConfigurationError,
    *,
    webhook_secret: str | Sequence[str] | None,
    client: AgentsClient | None,
    store: Store | str | None,
    tolerance: float,
    settings: DispatchSettings | None,
    resources: Any,
    clock: Callable[[], float],
    telemetry: Telemetry | None,
    completion_secret: str | Sequence[str] | None,
    public_url: str | None,
    on_approval_request: Callable[[ApprovalView], Awaitable[Any]] | None,
    actions: ActionPolicy | None,
    sign_in: SignInHook | None,
    connect_environment: ConnectEnvironmentHook | None,
) -> _Parts:
    """Check the options and the environment, then build the app's parts. Every problem is
    gathered first, so that one ConfigurationError names them all, and nothing that must be
    closed (the client) is built unless all is well."""
    if isinstance(env, ConfigurationError):
        raise env
    problems: list[str] = []

    def attempt(step: Callable[[], _T]) -> _T | None:
        try:
            return step()
        except ConfigurationError as exc:
            problems.append(str(exc))
            return None

    verified = attempt(lambda: _webhook_verifier(webhook_secret, env, tolerance, clock))
    completion = attempt(
        lambda: (
            parse_secrets(completion_secret, what="completion secrets")
            if completion_secret is not None
            else ()
        )
    )
    completion = completion or env.completion_secrets
    url = public_url if public_url is not None else env.public_url
    # Completion tokens are bound to this app: its store's namespace and its mount.
    namespace = env.store_namespace if store is None or isinstance(store, str) else store.namespace
    jobs = attempt(
        lambda: worker_jobs(tools, completion, public_url=url, namespace=namespace, clock=clock)
    )
    attempt(lambda: _check_configuration(tools, verified[1] if verified else (), completion, url))
    if client is None and not env.api_key:
        attempt(env.client)  # says how to set the key
    opened = (
        store
        if store is not None and not isinstance(store, str)
        else attempt(lambda: env.open_store(store, clock=clock))
    )
    if problems or verified is None or opened is None:
        if len(problems) == 1:
            raise ConfigurationError(problems[0])
        listed = "; ".join(f"({i}) {text}" for i, text in enumerate(problems, 1))
        raise ConfigurationError(f"{len(problems)} configuration problems: {listed}")
    observed = (
        telemetry if telemetry is not None else Telemetry(capture_content=env.capture_content)
    )
    # An owned client reports its retries as span events; pass
    # on_retry=telemetry.client_retry to a client of your own for the same.
    agents = client if client is not None else env.client(on_retry=observed.client_retry)
    opened_from = store if isinstance(store, str) else env.store_url if store is None else None
    dispatcher = Dispatcher(
        tools,
        agents,
        opened,
        settings=settings if settings is not None else env.dispatch,
        resources=resources,
        clock=clock,
        telemetry=observed,
        handoff=jobs,
        actions=actions,
        sign_in=sign_in,
        connect_environment=connect_environment,
    )
    dispatcher.approvals.notify = on_approval_request
    return _Parts(
        verifier=verified[0],
        jobs=jobs,
        telemetry=observed,
        client=agents,
        owns_client=client is None,
        store=opened,
        store_location=store_location(opened, opened_from),
        dispatcher=dispatcher,
    )


def _webhook_verifier(
    given: str | Sequence[str] | None, env: Config, tolerance: float, clock: Callable[[], float]
) -> tuple[WebhookVerifier, tuple[str, ...]]:
    secrets = tuple(parse_secrets(given)) if given is not None else ()
    secrets = secrets or env.webhook_secrets
    if not secrets:
        raise ConfigurationError(
            "no webhook secret: pass webhook_secret= or set OPENAI_WEBHOOK_SECRET "
            "(the whsec_... value shown when the webhook endpoint was created)"
        )
    # A malformed secret is named here with its fix.
    return WebhookVerifier(secrets, tolerance=tolerance, clock=clock), secrets


class _Throttle:
    """Lets one event per key through every ``period`` seconds and counts the rest."""

    def __init__(self, period: float = _THROTTLE_SECONDS) -> None:
        self._period = period
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def allow(self, key: str) -> tuple[bool, int]:
        """(whether to log now, how many were held back since the last one)."""
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last < self._period:
            self._held[key] = self._held.get(key, 0) + 1
            return False, 0
        self._last[key] = now
        return True, self._held.pop(key, 0)


def _check_configuration(
    tools: FunctionTools,
    webhook_secrets: Sequence[str],
    completion_secrets: Sequence[str],
    public_url: str | None,
) -> None:
    """Refuse, at start-up, configurations that cannot work (the fix in the message)."""
    queued = sorted(tool.name for tool in tools if tool.enqueue is not None)
    if queued and not public_url:
        raise ConfigurationError(
            f"tools {queued} hand calls to workers, but the app does not know its public "
            "URL, so jobs cannot say where to post their results: set AGENTFN_PUBLIC_URL "
            "(or public_url=) to the URL where this app is mounted, e.g. "
            "https://api.example.com/openai/webhooks"
        )
    reused = set(webhook_secrets) & set(completion_secrets)
    if reused:
        raise ConfigurationError(
            "the completion secret is the webhook secret: anyone holding one could forge the "
            "other. Give AGENTFN_COMPLETION_SECRET (completion_secret=) a secret of its own, "
            'e.g. python -c "import secrets; print(secrets.token_urlsafe(32))"'
        )


async def _not_found(scope: Scope, receive: Receive, send: Send) -> None:
    await send_json(send, 404, {"error": "not found"})


async def _not_allowed(scope: Scope, receive: Receive, send: Send, allow: str) -> None:
    await send_json(send, 405, {"error": "method not allowed"}, allow=allow)
