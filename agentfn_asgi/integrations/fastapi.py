"""Mount the webhook receiver in a FastAPI app at an exact path, with no redirect.

FastAPI is a Starlette subclass, so the Starlette helpers apply unchanged; this module exists
so that FastAPI users find them under their framework's name. The routes are plain ASGI
routes: they stay out of the OpenAPI schema and bypass FastAPI's dependency injection (the
webhook app reads the raw body to verify its signature)::

    import contextlib
    import httpx
    from fastapi import FastAPI
    from agentfn_asgi import AgentWebhookApp, ToolContext
    from agentfn_asgi.integrations.fastapi import mount

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.http = httpx.AsyncClient()          # your resources, created at start-up
        async with webhooks.lifespan():               # recovery sweep + graceful drain
            yield
        await app.state.http.aclose()

    app = FastAPI(lifespan=lifespan)
    webhooks = AgentWebhookApp(tools, resources=app.state)   # handlers: ctx.resources.http
    mount(app, webhooks)                                      # POST /openai/webhooks
"""

from __future__ import annotations

from .starlette import (
    ADMIN_PATH,
    DEFAULT_PATH,
    AnyASGIApp,
    ExactPathApp,
    mount,
    mount_admin,
    webhook_routes,
)

__all__ = [
    "ADMIN_PATH",
    "DEFAULT_PATH",
    "AnyASGIApp",
    "ExactPathApp",
    "mount",
    "mount_admin",
    "webhook_routes",
]
