"""The suite's in-process stack: ``agentfn_asgi.testing.connect`` with the suite's defaults.

Nothing is mocked: the fake sends real signed webhooks through httpx into the real ASGI app,
whose dispatcher reads and submits through the real client into the fake.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import anyio

from agentfn_asgi.dispatch import DispatchSettings
from agentfn_asgi.store import Store
from agentfn_asgi.testing import Connection, FakeAgentsAPI, connect
from agentfn_asgi.tools import FunctionTools

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
API_KEY = "sk-test"
APP_URL = "http://app.test/openai/webhooks"

FAST = DispatchSettings(
    lease_seconds=2.0, recovery_interval=0.2, recovery_grace=0.2, retry_base=0.05
)


async def fast_sleep(seconds: float) -> None:
    """Retry sleeps keep their order and count but not their wall time."""
    await anyio.sleep(min(seconds, 0.01))


@contextlib.asynccontextmanager
async def running_stack(
    tools: FunctionTools,
    *,
    store: Store | str = "memory://",
    settings: DispatchSettings | None = FAST,
    fake: FakeAgentsAPI | None = None,
    webhooks: bool | None = None,
    client_options: dict[str, Any] | None = None,
    **options: Any,
) -> AsyncIterator[Connection]:
    """The app serving ``tools`` against a fake signing with ``SECRET``, fast retry sleeps.

    A ``fake`` passed in is the caller's and outlives this app (a "restart"); otherwise one
    is made here. The fake delivers webhooks to the app unless ``webhooks`` is False, which
    is the default for a fake passed in: the restart tests post their own deliveries.
    ``options`` go to :func:`~agentfn_asgi.testing.connect` (``start``, ``loopback``) or to
    the app.
    """
    if webhooks is None:
        webhooks = fake is None
    client = dict(client_options or {})
    if not options.get("loopback"):
        client.setdefault("sleep", fast_sleep)
    async with contextlib.AsyncExitStack() as exits:
        if fake is None:
            fake = await exits.enter_async_context(
                FakeAgentsAPI(api_key=API_KEY, webhook_secret=SECRET)
            )
        yield await exits.enter_async_context(
            connect(
                tools,
                fake,
                store=store,
                settings=settings,
                webhooks=webhooks,
                client_options=client,
                **options,
            )
        )
