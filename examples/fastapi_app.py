"""The example tools served from a FastAPI app at ``POST /openai/webhooks``.

Run it (from the repository root)::

    OPENAI_API_KEY=sk-... OPENAI_WEBHOOK_SECRET=whsec_... \\
        uvicorn examples.fastapi_app:app --port 8000

Configuration comes from the environment: ``OPENAI_API_KEY``, ``OPENAI_BASE_URL``,
``OPENAI_WEBHOOK_SECRET`` (several, separated by spaces or commas, during a rotation),
``AGENTFN_STORE_URL`` (default ``sqlite:///agentfn.sqlite3``), ``EXAMPLE_LEDGER`` and
``AGENTFN_ADMIN_TOKEN`` (when set, the operator page answers at ``/openai/admin``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI

from agentfn_asgi import AgentWebhookApp
from agentfn_asgi.admin import AdminApp
from agentfn_asgi.demo.tools import ACTIONS, Ledger, tools
from agentfn_asgi.integrations.fastapi import mount, mount_admin


@contextlib.asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    # Host resources are created here and reach handlers as ``ctx.resources.ledger``.
    app.state.ledger = Ledger.from_env()
    # Recovery sweep at start-up, in-flight calls drained on shutdown.
    async with webhooks.lifespan():
        yield


app = FastAPI(lifespan=lifespan)
webhooks = AgentWebhookApp(tools, resources=app.state, actions=ACTIONS)
mount(app, webhooks, "/openai/webhooks")
# The operator page: on with AGENTFN_ADMIN_TOKEN set, else 404 (see docs/operating.md).
mount_admin(app, AdminApp(webhooks), "/openai/admin")


@app.get("/")
async def index() -> dict[str, str]:
    """A route of the host app, to show that it keeps working beside the webhooks."""
    return {"app": "fastapi example"}
