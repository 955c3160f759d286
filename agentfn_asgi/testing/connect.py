"""Wire an :class:`~agentfn_asgi.AgentWebhookApp` and a :class:`FakeAgentsAPI` together.

::

    async with connect(tools) as (app, fake):
        session = fake.create_session([[FakeCall("get_customer", {"customer_id": "123"})]])
        await fake.wait_idle(session)
    [result] = fake.submissions

Both run in this process and talk over real HTTP requests carried by
``httpx.ASGITransport``: the fake posts signed webhooks to the app at its mount path
(``/openai/webhooks`` by default, with ``root_path`` set as a host's ``Mount`` would), and
the app's :class:`~agentfn_asgi.AgentsClient` reads and submits to the fake. Nothing is
mocked: signature checks, the store, the dispatcher, retries and the fake's validation all
run as in production.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import httpx
from starlette.types import Receive, Scope, Send

from agentfn_asgi._asgi import send_json
from agentfn_asgi.app import AgentWebhookApp
from agentfn_asgi.calls.records import CallKey
from agentfn_asgi.client import AgentsClient
from agentfn_asgi.errors import ConfigurationError
from agentfn_asgi.store import Store
from agentfn_asgi.testing.fake import FakeAgentsAPI
from agentfn_asgi.testing.fake_state import FakeCall, Submission
from agentfn_asgi.testing.server import serve_fake
from agentfn_asgi.tools import FunctionTools
from agentfn_asgi.tracing import Telemetry

__all__ = ["Connection", "connect"]

#: The origin the app answers at in process (``http://app.test/openai/webhooks``).
_APP_ORIGIN = "http://app.test"
_API_ORIGIN = "http://fake.test"
#: The owner of the claims :meth:`Connection.create_session_in_doubt` leaves behind.
_GONE_OWNER = "agentfn-testing:replica-that-died"


class Connection(tuple[AgentWebhookApp, FakeAgentsAPI]):
    """An app and a fake wired together by :func:`connect`; unpacks as ``(app, fake)``.

    Like ``os.stat_result`` it is a tuple with named extras: :attr:`app`, :attr:`fake`,
    :attr:`client` and :attr:`store` (the app's), :attr:`webhook_url` (where the fake
    delivers) and :attr:`webhook_http` (an ``httpx.AsyncClient`` into the app, for requests
    of your own such as ``/healthz``).
    """

    webhook_url: str
    webhook_http: httpx.AsyncClient

    def __new__(
        cls,
        app: AgentWebhookApp,
        fake: FakeAgentsAPI,
        *,
        webhook_url: str,
        webhook_http: httpx.AsyncClient,
    ) -> Connection:
        connection = super().__new__(cls, (app, fake))
        connection.webhook_url = webhook_url
        connection.webhook_http = webhook_http
        return connection

    @property
    def app(self) -> AgentWebhookApp:
        """The app under test."""
        return self[0]

    @property
    def fake(self) -> FakeAgentsAPI:
        """The fake Agents API."""
        return self[1]

    @property
    def client(self) -> AgentsClient:
        """The app's client, talking to the fake."""
        return self.app.client

    @property
    def store(self) -> Store:
        """The app's store."""
        return self.app.store

    async def call(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        timeout: float = 10.0,  # noqa: ASYNC109 - the fake's wait_* helpers take one too
    ) -> Submission:
        """Start a session whose one call is ``name(**arguments)``, wait until it is idle and
        return the result the app submitted::

            result = await conn.call("get_customer", {"customer_id": "123"})
            assert result.success and result.output == '{"found":true}'

        ``TimeoutError`` after ``timeout`` seconds (a call waiting for a person's approval
        keeps its session waiting: answer it, then :meth:`FakeAgentsAPI.wait_idle`).
        """
        session_id = self.fake.create_session([[FakeCall(name, dict(arguments or {}))]])
        await self.fake.wait_idle(session_id, timeout)
        [result] = [s for s in self.fake.submissions if s.session_id == session_id]
        return result

    async def create_session_in_doubt(
        self,
        steps: Sequence[Sequence[FakeCall]],
        *,
        session_id: str | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> str:
        """Create a session whose first calls look as if the replica running them died
        mid-call, and let the app find them; return the session id.

        This is how a reconcile hook is tested. Before the app hears of the session, each of
        its pending calls is claimed in the app's store by an owner that is gone, with a lease
        that already ran out (past the fencing margin): exactly what a replica killed while
        running the handler leaves behind. Then the app looks at the session
        (:meth:`~agentfn_asgi.AgentWebhookApp.recover`) and finds each call in doubt: a
        plain tool runs again, a side-effect tool's ``reconcile`` hook decides (``Ran``: its
        result is submitted and the handler does not run; ``NotRun``: the handler runs;
        ``Unknown``: the call is quarantined, or failed, by the in-doubt policy)::

            sid = await conn.create_session_in_doubt([[FakeCall("refund", {"order": "o1"})]])
            await fake.wait_idle(sid)
        """
        fake = self.fake
        sid = fake.create_session(steps, session_id=session_id, metadata=metadata, deliver=False)
        # Lapsed by more than the margin another replica waits before taking a claim over.
        lapsed = -(self.app.dispatcher.settings.fence_margin + 1.0)
        for action in fake.required_actions(sid):
            key = CallKey(sid, str(action["turn_id"]), str(action["call_id"]))
            await self.store.claim_call(
                key, tool_name=str(action["name"]), owner=_GONE_OWNER, lease_seconds=lapsed
            )
        await self.app.recover(sid)
        return sid

    async def post_webhook(self, body: bytes, headers: Mapping[str, str]) -> httpx.Response:
        """POST a delivery of your own (see :func:`signed_delivery`) to the app's webhook URL."""
        return await self.webhook_http.post(self.webhook_url, content=body, headers=dict(headers))


class _Mounted:
    """Serve ``app`` below ``path`` as a host's ``Mount`` does (``root_path``); 404 elsewhere."""

    def __init__(self, app: AgentWebhookApp, path: str) -> None:
        self.app = app
        self.path = path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] == "http" and (
            not self.path or path == self.path or path.startswith(self.path + "/")
        ):
            await self.app(dict(scope, root_path=self.path), receive, send)
            return
        await send_json(send, 404, {"error": "not found"})


@contextlib.asynccontextmanager
async def connect(
    tools: FunctionTools,
    fake: FakeAgentsAPI | None = None,
    *,
    store: Store | str = "memory://",
    mount_path: str = "/openai/webhooks",
    webhooks: bool = True,
    start: bool = True,
    loopback: bool = False,
    client_options: Mapping[str, Any] | None = None,
    **app_options: Any,
) -> AsyncIterator[Connection]:
    """Run an :class:`~agentfn_asgi.AgentWebhookApp` serving ``tools`` against a fake API.

    Yields a :class:`Connection` (``async with connect(tools) as (app, fake):``). On exit the
    app shuts down (drain, store closed) and everything ``connect`` created is closed.

    Args:
        tools: the registry the app serves.
        fake: a :class:`FakeAgentsAPI` of yours (its secret, faults, retry schedule...). It
            stays yours: it is neither started nor closed here, so it can outlive one app
            and meet the next (a restart). By default ``connect`` makes and closes one.
        store: the app's store (default ``memory://``).
        mount_path: where the app is mounted; the fake delivers to
            ``http://app.test{mount_path}`` and the app sees the path as a host mount gives it.
        webhooks: False keeps the fake from delivering webhooks to this app (post your own
            with :meth:`Connection.post_webhook`).
        start: False leaves the app to start lazily on its first request.
        loopback: serve the fake under uvicorn on 127.0.0.1 (the ``server`` extra) and let
            the client use real sockets and its own connection pool (real timeouts).
        client_options: keyword arguments for the :class:`~agentfn_asgi.AgentsClient`
            (``max_retries``, ``sleep``, ``api_key`` to send a wrong key, ...).
        app_options: keyword arguments for the app (``settings``, ``resources``,
            ``telemetry``, ``clock``, ...). ``webhook_secret`` defaults to the fake's secrets.
    """
    if not mount_path.startswith("/"):
        raise ConfigurationError(f"mount_path must start with '/': {mount_path!r}")
    mount = mount_path.rstrip("/")
    telemetry = app_options.pop("telemetry", None)
    telemetry = telemetry if telemetry is not None else Telemetry()
    options = dict(client_options or {})
    # As a client the app owns would: retries become span events.
    options.setdefault("on_retry", telemetry.client_retry)
    async with contextlib.AsyncExitStack() as exits:
        if fake is None:
            fake = await exits.enter_async_context(FakeAgentsAPI())
        options.setdefault("api_key", fake.api_key)
        if loopback:
            base_url = await exits.enter_async_context(serve_fake(fake))
            client = AgentsClient(base_url=base_url, **options)
        else:
            api_http = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=fake), base_url=_API_ORIGIN
            )
            exits.push_async_callback(api_http.aclose)
            client = AgentsClient(base_url=_API_ORIGIN + "/v1", http_client=api_http, **options)
        exits.push_async_callback(client.aclose)
        app_options.setdefault("webhook_secret", fake.webhook_secrets)
        app = AgentWebhookApp(tools, client=client, store=store, telemetry=telemetry, **app_options)
        webhook_http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=_Mounted(app, mount)), base_url=_APP_ORIGIN
        )
        exits.push_async_callback(webhook_http.aclose)
        # Shut down even when never started: a lazy start on a request may have happened.
        exits.push_async_callback(app.shutdown)
        webhook_url = _APP_ORIGIN + (mount or "/")
        if webhooks:
            fake.add_webhook_url(webhook_url, client=webhook_http)
            exits.callback(fake.remove_webhook_url, webhook_url)
        if start:
            await app.startup()
        yield Connection(app, fake, webhook_url=webhook_url, webhook_http=webhook_http)
