"""The example tools served from a Starlette app at ``POST /openai/webhooks``.

Run it (from the repository root)::

    OPENAI_API_KEY=sk-... OPENAI_WEBHOOK_SECRET=whsec_... \\
        uvicorn examples.starlette_app:app --port 8000

Configuration comes from the environment: ``OPENAI_API_KEY``, ``OPENAI_BASE_URL``,
``OPENAI_WEBHOOK_SECRET`` (several, separated by spaces or commas, during a rotation),
``AGENTFN_STORE_URL`` (default ``sqlite:///agentfn.sqlite3``), ``EXAMPLE_LEDGER`` and
``AGENTFN_ADMIN_TOKEN`` (when set, the operator page answers at ``/openai/admin``).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentfn_asgi import AgentWebhookApp
from agentfn_asgi.admin import AdminApp
from agentfn_asgi.demo.tools import ACTIONS, Ledger, tools
from agentfn_asgi.integrations.starlette import mount, mount_admin


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    # Host resources are created here and reach handlers as ``ctx.resources.ledger``.
    app.state.ledger = Ledger.from_env()
    # Recovery sweep at start-up, in-flight calls drained on shutdown.
    async with webhooks.lifespan():
        yield


async def index(request: Request) -> JSONResponse:
    """A route of the host app, to show that it keeps working beside the webhooks."""
    return JSONResponse({"app": "starlette example"})


app = Starlette(routes=[Route("/", index)], lifespan=lifespan)
webhooks = AgentWebhookApp(tools, resources=app.state, actions=ACTIONS)
mount(app, webhooks, "/openai/webhooks")
# The operator page: on with AGENTFN_ADMIN_TOKEN set, else 404 (see docs/operating.md).
mount_admin(app, AdminApp(webhooks), "/openai/admin")
