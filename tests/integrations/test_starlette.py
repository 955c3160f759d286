"""Starlette: exact-path mounting with no redirect, lifespan in one line or none at all,
and handlers reaching host resources through ``ctx.resources``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, MutableMapping
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Mount, Route

from agentfn_asgi.admin import AdminApp
from agentfn_asgi.app import AgentWebhookApp
from agentfn_asgi.client import AgentsClient
from agentfn_asgi.errors import ConfigurationError
from agentfn_asgi.integrations.starlette import ExactPathApp, mount, mount_admin, webhook_routes
from agentfn_asgi.testing import (
    FakeAgentsAPI,
    FakeCall,
    serve_app,
    serve_fake,
    signed_delivery,
    webhook_event,
)
from agentfn_asgi.tools import FunctionTools, ToolContext
from tests.admin.memory_view import MemoryOperatorView

from . import (
    API_KEY,
    ECHO_STEPS,
    FAST,
    HOST_URL,
    SECRET,
    WebhooksFactory,
    echo_tools,
    hosted_stack,
)


async def _home(request: Request) -> PlainTextResponse:
    return PlainTextResponse("host home")


def _ignored_delivery() -> tuple[bytes, dict[str, str]]:
    # A verified event the app acknowledges without work: proves the request reached it.
    return signed_delivery(SECRET, webhook_event("agent.session.in_progress", {"id": "sess_1"}))


def _host_with_mount(new_webhooks: WebhooksFactory) -> Starlette:
    app = Starlette(routes=[Route("/", _home)])
    mount(app, new_webhooks(resources=app.state))
    return app


@pytest.mark.anyio
@pytest.mark.parametrize("url", ["/openai/webhooks", "/openai/webhooks/"])
async def test_exact_path_and_trailing_slash_reach_the_app_without_redirect(url: str) -> None:
    """POST to the mount point, with or without a trailing slash, is answered by the webhook
    app itself (verified, 200), never by a 307 from Starlette's slash redirect."""
    async with hosted_stack(echo_tools(), _host_with_mount) as hosted:
        body, headers = _ignored_delivery()
        response = await hosted.http.post(url, content=body, headers=headers)
        assert response.status_code == 200, response.text
        assert response.json() == {"status": "ignored"}


@pytest.mark.anyio
async def test_healthz_host_routes_and_method_answers() -> None:
    """``/healthz`` below the mount works, the host's own routes still answer, and a GET on
    the webhook URL gets the app's 405 (not the host's 404 or a redirect)."""
    async with hosted_stack(echo_tools(), _host_with_mount) as hosted:
        health = await hosted.http.get("/openai/webhooks/healthz")
        assert health.status_code == 200
        assert health.json()["status"] == "ok"
        home = await hosted.http.get("/")
        assert home.text == "host home"
        wrong_method = await hosted.http.get("/openai/webhooks")
        assert wrong_method.status_code == 405
        assert wrong_method.headers["allow"] == "POST"
        unknown = await hosted.http.get("/openai/webhooks/nope")
        assert unknown.status_code == 404


@pytest.mark.anyio
async def test_mount_goes_before_a_host_catch_all() -> None:
    """``mount()`` inserts its routes first, so a host ``Mount("/")`` cannot shadow them."""

    def make_host(new_webhooks: WebhooksFactory) -> Starlette:
        app = Starlette(routes=[Mount("/", app=PlainTextResponse("catch-all"))])
        mount(app, new_webhooks())
        return app

    async with hosted_stack(echo_tools(), make_host) as hosted:
        body, headers = _ignored_delivery()
        response = await hosted.http.post("/openai/webhooks", content=body, headers=headers)
        assert response.json() == {"status": "ignored"}
        other = await hosted.http.get("/elsewhere")
        assert other.text == "catch-all"


@pytest.mark.anyio
async def test_session_completes_through_the_host_without_lifespan() -> None:
    """With no lifespan at all (httpx's ASGI transport sends none) the webhook app starts on
    its first delivery and the fake's session is answered through the host's routing."""

    def make_host(new_webhooks: WebhooksFactory) -> Starlette:
        return Starlette(routes=webhook_routes(new_webhooks()))

    async with hosted_stack(echo_tools(), make_host) as hosted:
        assert not hosted.webhooks.dispatcher.started
        session_id = hosted.fake.create_session(ECHO_STEPS)
        await hosted.fake.wait_idle(session_id, timeout=10)
        assert [(s.call_id, s.output) for s in hosted.fake.submissions] == [("call_echo", "hello")]


@pytest.mark.anyio
async def test_root_path_is_respected() -> None:
    """Behind a proxy prefix (``root_path="/api"``) the mount still matches exactly."""
    async with hosted_stack(echo_tools(), _host_with_mount, root_path="/api") as hosted:
        body, headers = _ignored_delivery()
        for url in ("/api/openai/webhooks", "/api/openai/webhooks/"):
            response = await hosted.http.post(url, content=body, headers=headers)
            assert response.json() == {"status": "ignored"}, url
        session_id = hosted.fake.create_session(ECHO_STEPS)
        await hosted.fake.wait_idle(session_id, timeout=10)


@pytest.mark.anyio
async def test_custom_path() -> None:
    """Any path works, and only that path is the webhook app's."""

    def make_host(new_webhooks: WebhooksFactory) -> Starlette:
        app = Starlette(routes=[Route("/", _home)])
        mount(app, new_webhooks(), path="/hooks/agents/")
        return app

    async with hosted_stack(echo_tools(), make_host, path="/hooks/agents") as hosted:
        body, headers = _ignored_delivery()
        response = await hosted.http.post("/hooks/agents", content=body, headers=headers)
        assert response.json() == {"status": "ignored"}
        assert (await hosted.http.post("/openai/webhooks")).status_code == 404


def test_bad_paths_and_hosts_are_refused() -> None:
    """A path without a leading slash, the root, or a host without a router is an error."""
    app = ExactPathApp(PlainTextResponse("x"))
    assert app.app is not None
    for path in ("openai/webhooks", "/", ""):
        with pytest.raises(ConfigurationError):
            webhook_routes(PlainTextResponse("x"), path)
    with pytest.raises(ConfigurationError):
        mount(object(), PlainTextResponse("x"))


def _resource_tools() -> FunctionTools:
    tools = FunctionTools()

    @tools.function
    async def greet(ctx: ToolContext, name: str) -> str:
        """Greet someone with the host's configured greeting."""
        return f"{ctx.resources.greeting}, {name}"

    return tools


@pytest.mark.anyio
@pytest.mark.slow
async def test_one_line_lifespan_and_app_state_resources_over_loopback() -> None:
    """Under uvicorn with lifespan: the host's lifespan fills ``app.state`` and enters
    ``webhooks.lifespan()``; handlers read ``ctx.resources`` (no globals); the webhook app
    is started at start-up and stopped at shutdown."""
    fake = FakeAgentsAPI(api_key=API_KEY, webhook_secret=SECRET)
    async with fake, serve_fake(fake) as base_url:
        client = AgentsClient(api_key=API_KEY, base_url=base_url)

        @contextlib.asynccontextmanager
        async def lifespan(app: Starlette) -> AsyncIterator[None]:
            app.state.greeting = "Hello"
            async with webhooks.lifespan():
                yield

        host = Starlette(lifespan=lifespan)
        webhooks = AgentWebhookApp(
            _resource_tools(),
            webhook_secret=SECRET,
            client=client,
            store="memory://",
            settings=FAST,
            resources=host.state,
        )
        mount(host, webhooks)
        try:
            async with serve_app(host, lifespan="on") as root:
                assert webhooks.dispatcher.started
                fake.add_webhook_url(root + "/openai/webhooks")
                session_id = fake.create_session([[FakeCall("greet", {"name": "Ada"})]])
                await fake.wait_idle(session_id, timeout=10)
            assert [s.output for s in fake.submissions] == ["Hello, Ada"]
            assert not webhooks.dispatcher.started
        finally:
            await client.aclose()


@pytest.mark.anyio
async def test_webhooks_lifespan_directly_as_the_host_lifespan() -> None:
    """``Starlette(lifespan=webhooks.lifespan)`` type-checks and starts/stops the app."""
    # The client is never used: no function-call webhook is sent here.
    client = AgentsClient(api_key=API_KEY, base_url=HOST_URL + "/v1")
    webhooks = AgentWebhookApp(
        echo_tools(), webhook_secret=SECRET, client=client, store="memory://"
    )
    host = Starlette(routes=webhook_routes(webhooks), lifespan=webhooks.lifespan)
    messages: list[MutableMapping[str, Any]] = []
    inbox = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]

    async def receive() -> dict[str, Any]:
        return inbox.pop(0)

    async def send(message: MutableMapping[str, Any]) -> None:
        messages.append(message)
        if message["type"] == "lifespan.startup.complete":
            assert webhooks.dispatcher.started

    await host({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send)
    assert [m["type"] for m in messages] == [
        "lifespan.startup.complete",
        "lifespan.shutdown.complete",
    ]
    assert not webhooks.dispatcher.started
    await client.aclose()


@pytest.mark.anyio
async def test_mount_admin_serves_the_operator_page_beside_the_webhook() -> None:
    """``mount_admin`` puts the page at ``/openai/admin`` (exact path and below, no
    redirect) without shadowing the webhook or the host's routes."""
    token = "admin-token-0123456789"
    bearer = {"authorization": f"Bearer {token}"}

    def make_host(new_webhooks: WebhooksFactory) -> Starlette:
        app = _host_with_mount(new_webhooks)
        mount_admin(app, AdminApp(MemoryOperatorView(), tokens=[token]))
        return app

    async with hosted_stack(echo_tools(), make_host) as hosted:
        for url in ["/openai/admin", "/openai/admin/", "/openai/admin/calls"]:
            page = await hosted.http.get(url, headers=bearer)
            assert page.status_code == 200, url
            assert 'href="/openai/admin/calls"' in page.text
        assert (await hosted.http.get("/openai/admin")).status_code == 401
        assert (await hosted.http.get("/openai/webhooks/healthz")).json()["status"] == "ok"
        assert (await hosted.http.get("/")).text == "host home"
