"""In-process stacks for the fault and hostile-input tests, with the client under control.

``tests/support/stack.py``'s ``running_stack`` builds its client itself; the fault tests need
their own retry budget, real sleeps (to see ``Retry-After`` honoured) or real sockets (to
see read timeouts, which ``httpx.ASGITransport`` cannot produce). Everything else is the
same: the real app, client and store, the fake's signed webhooks delivered in process.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx

from agentfn_asgi.app import AgentWebhookApp
from agentfn_asgi.client import AgentsClient
from agentfn_asgi.dispatch import DispatchSettings
from agentfn_asgi.store import open_store
from agentfn_asgi.testing import FakeAgentsAPI, serve_fake
from agentfn_asgi.tools import FunctionTools

from ..support.stack import API_KEY, APP_URL, FAST, SECRET, Stack, _Proxy

__all__ = ["API_KEY", "SECRET", "fast_sleep", "fault_stack"]


async def fast_sleep(seconds: float) -> None:
    """Retry sleeps keep their order and count but not their wall time."""
    await anyio.sleep(min(seconds, 0.01))


@contextlib.asynccontextmanager
async def fault_stack(
    tools: FunctionTools,
    *,
    settings: DispatchSettings = FAST,
    loopback: bool = False,
    webhooks: bool = True,
    client_options: dict[str, Any] | None = None,
    api_key: str = API_KEY,
    **app_options: Any,
) -> AsyncIterator[Stack]:
    """Fake ⇄ client ⇄ app; the client is built with ``client_options``.

    With ``loopback`` the fake is served by uvicorn on 127.0.0.1 and the client talks to it
    through real sockets (its own pooled httpx client, real timeouts, real sleeps);
    otherwise through ``httpx.ASGITransport`` with the suite's fast sleep unless
    ``client_options`` gives ``sleep``. ``api_key`` is what the client sends (the fake
    expects ``API_KEY``).
    """
    proxy = _Proxy()
    webhook_http = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=proxy), base_url="http://app.test"
    )
    fake = FakeAgentsAPI(
        api_key=API_KEY,
        webhook_secret=SECRET,
        webhook_url=APP_URL if webhooks else None,
        webhook_client=webhook_http,
    )
    options = dict(client_options or {})
    if not loopback:
        options.setdefault("sleep", fast_sleep)
    async with contextlib.AsyncExitStack() as exits:
        await exits.enter_async_context(fake)
        exits.push_async_callback(webhook_http.aclose)
        if loopback:
            base_url = await exits.enter_async_context(serve_fake(fake))
            client = AgentsClient(api_key=api_key, base_url=base_url, **options)
        else:
            api_http = httpx.AsyncClient(
                transport=httpx.ASGITransport(app=fake), base_url="http://fake.test"
            )
            exits.push_async_callback(api_http.aclose)
            client = AgentsClient(
                api_key=api_key, base_url="http://fake.test/v1", http_client=api_http, **options
            )
        exits.push_async_callback(client.aclose)
        store = open_store("memory://")
        app = AgentWebhookApp(
            tools,
            webhook_secret=SECRET,
            client=client,
            store=store,
            settings=settings,
            **app_options,
        )
        proxy.target = app
        await app.startup()
        exits.push_async_callback(app.shutdown)
        yield Stack(fake=fake, app=app, client=client, store=store, webhook_http=webhook_http)
