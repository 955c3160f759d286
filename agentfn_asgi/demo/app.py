"""The demo's app: the demo tools served by Starlette at ``POST /openai/webhooks``.

``agentfn-asgi demo`` runs it under uvicorn in a child process, configured only through the
environment as a deployment would be::

    OPENAI_API_KEY=... OPENAI_BASE_URL=... OPENAI_WEBHOOK_SECRET=whsec_... \\
        uvicorn agentfn_asgi.demo.app:app --port 8000

(``AGENTFN_STORE_URL`` and ``EXAMPLE_LEDGER`` too). It ships in the package so the demo
runs after ``pip install 'agentfn-asgi[server]'``; ``examples/starlette_app.py`` is the same
wiring with a page of the host's own, and the one to read.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette

from agentfn_asgi import AgentWebhookApp
from agentfn_asgi.demo.tools import Ledger, tools
from agentfn_asgi.integrations.starlette import mount

__all__ = ["app", "webhooks"]


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    # The ledger reaches handlers as ``ctx.resources.ledger``.
    app.state.ledger = Ledger.from_env()
    # Recovery sweep at start-up, in-flight calls drained on shutdown.
    async with webhooks.lifespan():
        yield


app = Starlette(lifespan=lifespan)
webhooks = AgentWebhookApp(tools, resources=app.state)
mount(app, webhooks, "/openai/webhooks")
