"""FastAPI: the same exact-path mount, kept out of the OpenAPI schema, a host lifespan that
combines its own resources with the webhook app's, and ``app.state`` as ``ctx.resources``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import pytest
from fastapi import FastAPI

from agentfn_asgi.integrations import fastapi as fastapi_integration
from agentfn_asgi.integrations import starlette as starlette_integration
from agentfn_asgi.testing import FakeCall, signed_delivery, webhook_event
from agentfn_asgi.tools import FunctionTools, ToolContext

from . import SECRET, WebhooksFactory, hosted_stack, lifespan_of


def _tools() -> FunctionTools:
    tools = FunctionTools()

    @tools.function
    async def count_rows(ctx: ToolContext, table: str) -> dict[str, object]:
        """Count rows with the host's database pool (a stand-in created at start-up)."""
        pool = ctx.resources.pool
        return {"table": table, "rows": pool[table], "opened": ctx.resources.opened}

    return tools


def _make_host(new_webhooks: WebhooksFactory) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.pool = {"orders": 3}
        app.state.opened = True
        async with webhooks.lifespan():
            yield
        app.state.opened = False

    app = FastAPI(lifespan=lifespan)
    webhooks = new_webhooks(resources=app.state)

    @app.get("/items/{item_id}")
    async def item(item_id: int) -> dict[str, int]:
        return {"item_id": item_id}

    fastapi_integration.mount(app, webhooks)
    return app


def test_fastapi_module_reexports_the_starlette_helpers() -> None:
    """FastAPI users find the same helpers under their framework's name."""
    assert fastapi_integration.mount is starlette_integration.mount
    assert fastapi_integration.webhook_routes is starlette_integration.webhook_routes


@pytest.mark.anyio
@pytest.mark.parametrize("url", ["/openai/webhooks", "/openai/webhooks/"])
async def test_exact_path_without_redirect_and_host_routes(url: str) -> None:
    """Both spellings of the URL reach the app with no 3xx; FastAPI routes still work and
    the webhook routes stay out of the OpenAPI schema."""
    async with hosted_stack(_tools(), _make_host) as hosted:
        body, headers = signed_delivery(
            SECRET, webhook_event("agent.session.in_progress", {"id": "s"})
        )
        response = await hosted.http.post(url, content=body, headers=headers)
        assert response.status_code == 200
        assert response.json() == {"status": "ignored"}
        assert (await hosted.http.get("/items/7")).json() == {"item_id": 7}
        assert (await hosted.http.get("/openai/webhooks/healthz")).status_code == 200
        schema = (await hosted.http.get("/openapi.json")).json()
        assert list(schema["paths"]) == ["/items/{item_id}"]


@pytest.mark.anyio
async def test_host_lifespan_starts_webhooks_and_fills_resources() -> None:
    """The host's own lifespan creates resources on ``app.state`` and enters
    ``webhooks.lifespan()``; a handler then reads them through ``ctx.resources``."""
    async with hosted_stack(_tools(), _make_host) as hosted:
        async with lifespan_of(hosted.host):
            assert hosted.webhooks.dispatcher.started
            session_id = hosted.fake.create_session(
                [[FakeCall("count_rows", {"table": "orders"}, call_id="call_rows")]]
            )
            await hosted.fake.wait_idle(session_id, timeout=10)
        assert not hosted.webhooks.dispatcher.started
        assert [s.output for s in hosted.fake.submissions] == [
            '{"table":"orders","rows":3,"opened":true}'
        ]
