"""Tests of the framework integrations, plus the small in-process harness they share.

:func:`hosted_stack` wires FakeAgentsAPI ⇄ a *host* application (Starlette, FastAPI or the
Django wrapper) over ``httpx.ASGITransport``: the fake's signed webhooks go through the
host's routing into the mounted :class:`AgentWebhookApp`, whose client talks back to the
fake. ``httpx.ASGITransport`` sends no lifespan events, which is exactly the "host does not
forward lifespan" case.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import httpx

from agentfn_asgi.app import AgentWebhookApp
from agentfn_asgi.client import AgentsClient
from agentfn_asgi.dispatch import DispatchSettings
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall
from agentfn_asgi.tools import FunctionTools

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
API_KEY = "sk-test"
HOST_URL = "http://host.test"
FAST = DispatchSettings(
    lease_seconds=2.0, recovery_interval=0.2, recovery_grace=0.2, retry_base=0.05
)


class WebhooksFactory(Protocol):
    """Creates the webhook app under test (``resources`` as the host chooses)."""

    def __call__(self, *, resources: Any = None) -> AgentWebhookApp: ...


@dataclass
class Hosted:
    """A running in-process stack: the fake, the webhook app and the host app."""

    fake: FakeAgentsAPI
    webhooks: AgentWebhookApp
    host: Any
    http: httpx.AsyncClient
    """Talks to the host app (``base_url`` is :data:`HOST_URL`)."""


@contextlib.asynccontextmanager
async def hosted_stack(
    tools: FunctionTools,
    make_host: Callable[[WebhooksFactory], Any],
    *,
    path: str = "/openai/webhooks",
    root_path: str = "",
) -> AsyncIterator[Hosted]:
    """Let ``make_host`` build the host app, calling the factory it gets to create the
    webhook app (``new_webhooks(resources=app.state)``, as real code does), and deliver the
    fake's webhooks to ``HOST_URL + root_path + path`` through the host."""
    holder: dict[str, Any] = {}

    async def host_proxy(scope: Any, receive: Any, send: Any) -> None:
        await holder["host"](scope, receive, send)

    transport = httpx.ASGITransport(app=host_proxy, root_path=root_path)
    http = httpx.AsyncClient(transport=transport, base_url=HOST_URL)
    fake = FakeAgentsAPI(
        api_key=API_KEY,
        webhook_secret=SECRET,
        webhook_url=HOST_URL + root_path + path,
        webhook_client=http,
    )
    api_http = httpx.AsyncClient(transport=httpx.ASGITransport(app=fake), base_url="http://fake")
    client = AgentsClient(api_key=API_KEY, base_url="http://fake/v1", http_client=api_http)

    def new_webhooks(*, resources: Any = None) -> AgentWebhookApp:
        webhooks = AgentWebhookApp(
            tools,
            webhook_secret=SECRET,
            client=client,
            store="memory://",
            settings=FAST,
            resources=resources,
        )
        holder["webhooks"] = webhooks
        return webhooks

    holder["host"] = make_host(new_webhooks)
    webhooks: AgentWebhookApp = holder["webhooks"]
    try:
        async with fake:
            yield Hosted(fake=fake, webhooks=webhooks, host=holder["host"], http=http)
    finally:
        await webhooks.shutdown()
        await client.aclose()
        await api_http.aclose()
        await http.aclose()


def echo_tools() -> FunctionTools:
    """One tool that echoes, to prove a session completes through the host."""
    tools = FunctionTools()

    @tools.function
    async def echo(text: str) -> str:
        """Echo the text."""
        return text

    return tools


ECHO_STEPS = [[FakeCall("echo", {"text": "hello"}, call_id="call_echo")]]


@contextlib.asynccontextmanager
async def lifespan_of(app: Any) -> AsyncIterator[None]:
    """Drive ``app``'s ASGI lifespan protocol (startup on enter, shutdown on exit), as a
    server that forwards lifespan does."""
    import asyncio

    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
    task = asyncio.create_task(app(scope, inbox.get, outbox.put))
    await inbox.put({"type": "lifespan.startup"})
    started = await outbox.get()
    if started["type"] != "lifespan.startup.complete":
        raise RuntimeError(f"start-up failed: {started}")
    try:
        yield
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        await outbox.get()
        await task
