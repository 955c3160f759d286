"""The Starlette example with one more tool, ``generate_report``, run by a worker process.

Run the app and a worker (from the repository root, Redis on 127.0.0.1:6379)::

    export OPENAI_API_KEY=sk-... OPENAI_WEBHOOK_SECRET=whsec_...
    export AGENTFN_COMPLETION_SECRET=$(python -c "import secrets; print(secrets.token_urlsafe(32))")
    export AGENTFN_PUBLIC_URL=http://127.0.0.1:8000/openai/webhooks
    uvicorn examples.worker.app:app --port 8000      # terminal 1
    python -m examples.worker.worker                  # terminal 2 (as many as you like)

The three shared tools run in this process as in ``examples/starlette_app.py``;
``generate_report`` calls become jobs on a Redis list (see ``examples/worker/jobs.py``), and
the worker completes them at ``POST /openai/webhooks/calls/complete``.
``AGENTFN_RECOVERY_INTERVAL`` (seconds, default 10) sets how often the recovery sweep looks
for jobs past their deadline; the end-to-end test shortens it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from agentfn_asgi.app import AgentWebhookApp
from agentfn_asgi.demo.tools import Ledger, build_tools
from agentfn_asgi.integrations.starlette import mount
from examples.worker.jobs import RedisQueue, generate_report, job_deadline

queue = RedisQueue.from_env()
tools = build_tools()
# `timeout` bounds the LPUSH; `job_deadline` bounds the whole job.
tools.add(generate_report, enqueue=queue.push, job_deadline=job_deadline(), timeout=10)


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    app.state.ledger = Ledger.from_env()
    async with webhooks.lifespan():
        yield
    await queue.aclose()


async def index(request: Request) -> JSONResponse:
    """A route of the host app, to show that it keeps working beside the webhooks."""
    return JSONResponse({"app": "starlette example with a worker"})


app = Starlette(routes=[Route("/", index)], lifespan=lifespan)
webhooks = AgentWebhookApp(tools, resources=app.state)
mount(app, webhooks, "/openai/webhooks")
