"""An in-process stack: FakeAgentsAPI ⇄ AgentsClient ⇄ AgentWebhookApp over httpx ASGI transports.

Nothing is mocked: the fake sends real signed webhooks through httpx into the real ASGI app,
whose dispatcher reads and submits through the real client into the fake.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx

from agentfn_asgi.app import AgentWebhookApp
from agentfn_asgi.client import AgentsClient
from agentfn_asgi.dispatch import DispatchSettings
from agentfn_asgi.store import Store, open_store
from agentfn_asgi.testing import FakeAgentsAPI
from agentfn_asgi.tools import FunctionTools

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
API_KEY = "sk-test"
APP_URL = "http://app.test/openai/webhooks"

FAST = DispatchSettings(lease_seconds=2.0, recovery_interval=0.2, recovery_grace=0.2)


async def _no_sleep(_: float) -> None:
    return None


@dataclass
class Stack:
    fake: FakeAgentsAPI
    app: AgentWebhookApp
    client: AgentsClient
    store: Store
    webhook_http: httpx.AsyncClient

    async def post_webhook(self, body: bytes, headers: dict[str, str]) -> httpx.Response:
        return await self.webhook_http.post(APP_URL, content=body, headers=headers)


class _Proxy:
    """Lets the fake's webhook transport exist before the app it delivers to."""

    def __init__(self) -> None:
        self.target: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        # The app is mounted at /openai/webhooks in every example; emulate the mount.
        scope = dict(scope, root_path="/openai/webhooks")
        await self.target(scope, receive, send)


def make_client(fake: FakeAgentsAPI, **kwargs: Any) -> AgentsClient:
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=fake), base_url="http://fake.test")
    kwargs.setdefault("sleep", _fast_sleep)
    return AgentsClient(api_key=API_KEY, base_url="http://fake.test/v1", http_client=http, **kwargs)


async def _fast_sleep(seconds: float) -> None:
    # Retries in tests keep their order and count but not their wall time.
    import anyio

    await anyio.sleep(min(seconds, 0.01))


@contextlib.asynccontextmanager
async def running_stack(
    tools: FunctionTools,
    *,
    store: Store | str = "memory://",
    settings: DispatchSettings | None = FAST,
    fake: FakeAgentsAPI | None = None,
    webhooks: bool = True,
    start: bool = True,
    **app_kwargs: Any,
) -> AsyncIterator[Stack]:
    proxy = _Proxy()
    webhook_http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=proxy), base_url="http://app.test"
    )
    owns_fake = fake is None
    if fake is None:
        fake = FakeAgentsAPI(
            api_key=API_KEY,
            webhook_secret=SECRET,
            webhook_url=APP_URL if webhooks else None,
            webhook_client=webhook_http,
        )
    client = make_client(fake)
    the_store = open_store(store) if isinstance(store, str) else store
    app = AgentWebhookApp(
        tools,
        webhook_secret=SECRET,
        client=client,
        store=the_store,
        settings=settings,
        **app_kwargs,
    )
    proxy.target = app
    stack = Stack(fake=fake, app=app, client=client, store=the_store, webhook_http=webhook_http)
    try:
        async with contextlib.AsyncExitStack() as exits:
            if owns_fake:
                # A fake passed in is the caller's: it outlives this app (a "restart").
                await exits.enter_async_context(fake)
            if start:
                await app.startup()
            yield stack
    finally:
        await app.shutdown()
        await webhook_http.aclose()
