"""The Starlette example with one more tool, ``generate_report``, run by Celery workers.

Run RabbitMQ (127.0.0.1:5672, guest/guest), the app and a worker, from the repository root::

    pip install -e '.[celery,server]'
    export OPENAI_API_KEY=sk-... OPENAI_WEBHOOK_SECRET=whsec_...
    export AGENTFN_COMPLETION_SECRET=$(python -c "import secrets; print(secrets.token_urlsafe(32))")
    export AGENTFN_PUBLIC_URL=http://127.0.0.1:8000/openai/webhooks
    uvicorn examples.celery_worker.app:app --port 8000                           # terminal 1
    celery -A examples.celery_worker.worker:celery_app worker --loglevel INFO    # terminal 2

The shared tools run in this process as in ``examples/starlette_app.py``;
``generate_report`` calls become Celery tasks (see ``tools.py``), and the workers complete
them at ``POST /openai/webhooks/calls/complete``. ``AGENTFN_RECOVERY_INTERVAL`` (seconds,
default 10) sets how often the recovery sweep looks for jobs past their deadline.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentfn_asgi import AgentWebhookApp
from agentfn_asgi.demo.tools import Ledger
from agentfn_asgi.integrations.starlette import mount
from examples.celery_worker.tools import celery_app, tools


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    app.state.ledger = Ledger.from_env()
    async with webhooks.lifespan():
        yield
    celery_app.close()  # the broker connections used to send jobs


async def index(request: Request) -> JSONResponse:
    """A route of the host app, to show that it keeps working beside the webhooks."""
    return JSONResponse({"app": "starlette example with Celery workers"})


app = Starlette(routes=[Route("/", index)], lifespan=lifespan)
webhooks = AgentWebhookApp(tools, resources=app.state)
mount(app, webhooks, "/openai/webhooks")
