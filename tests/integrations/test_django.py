"""Django (ASGI): ``with_webhooks`` routes the webhook path (exact, trailing slash, below)
to the webhook app and everything else to Django, answers lifespan itself, and
``django_db`` handles a worker thread's database connection as Django does per request."""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Any

import anyio
import pytest
from django.http import HttpRequest, HttpResponse
from django.urls import path

from agentfn_asgi.admin import AdminApp
from agentfn_asgi.errors import ConfigurationError, ToolDefinitionError, ToolError
from agentfn_asgi.integrations.django import (
    AdminBeside,
    WebhooksAndDjango,
    django_db,
    with_admin,
    with_webhooks,
)
from agentfn_asgi.testing import FakeCall, signed_delivery, webhook_event
from agentfn_asgi.tools import FunctionTools
from tests.admin.memory_view import MemoryOperatorView

from . import SECRET, WebhooksFactory, hosted_stack, lifespan_of


def _django_home(request: HttpRequest) -> HttpResponse:
    return HttpResponse(f"django {request.path}")


# This module is the test project's ROOT_URLCONF.
urlpatterns = [path("", _django_home), path("openai/other/", _django_home)]


@pytest.fixture(scope="module")
def django_asgi(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Django configured in-process (SQLite in a temp folder, CONN_MAX_AGE=0, this module
    as URLconf) and its real ASGI handler."""
    import django
    from django.conf import settings

    if not settings.configured:
        db = tmp_path_factory.mktemp("django") / "db.sqlite3"
        settings.configure(
            DEBUG=False,
            ALLOWED_HOSTS=["host.test", "127.0.0.1"],
            ROOT_URLCONF=__name__,
            SECRET_KEY="test-only",
            INSTALLED_APPS=[],
            MIDDLEWARE=[],
            USE_TZ=True,
            DATABASES={
                "default": {
                    "ENGINE": "django.db.backends.sqlite3",
                    "NAME": str(db),
                    "CONN_MAX_AGE": 0,
                }
            },
        )
        django.setup()
    from django.core.asgi import get_asgi_application

    return get_asgi_application()


def _orm_tools() -> FunctionTools:
    tools = FunctionTools()

    @tools.function
    @django_db
    def answer(question: str) -> dict[str, object]:
        """Ask the database (through Django's connection)."""
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute("SELECT 41 + 1")
            (value,) = cursor.fetchone()
        return {"question": question, "answer": value}

    return tools


@pytest.mark.anyio
@pytest.mark.parametrize("url", ["/openai/webhooks", "/openai/webhooks/"])
async def test_webhook_path_goes_to_the_webhook_app(django_asgi: Any, url: str) -> None:
    """Exact path and trailing slash reach the webhook app (verified, 200, no redirect)."""

    def make_host(new_webhooks: WebhooksFactory) -> WebhooksAndDjango:
        return with_webhooks(django_asgi, new_webhooks())

    async with hosted_stack(_orm_tools(), make_host) as hosted:
        body, headers = signed_delivery(
            SECRET, webhook_event("agent.session.in_progress", {"id": "s"})
        )
        response = await hosted.http.post(url, content=body, headers=headers)
        assert response.status_code == 200
        assert response.json() == {"status": "ignored"}
        assert (await hosted.http.get("/openai/webhooks/healthz")).json()["status"] == "ok"


@pytest.mark.anyio
async def test_everything_else_goes_to_django(django_asgi: Any) -> None:
    """Django's own URLs answer, including one that shares the webhook path's prefix."""

    def make_host(new_webhooks: WebhooksFactory) -> WebhooksAndDjango:
        return with_webhooks(django_asgi, new_webhooks())

    async with hosted_stack(_orm_tools(), make_host) as hosted:
        assert (await hosted.http.get("/")).text == "django /"
        assert (await hosted.http.get("/openai/other/")).text == "django /openai/other/"
        assert (await hosted.http.get("/openai/webhooksX")).status_code == 404


@pytest.mark.anyio
async def test_lifespan_is_answered_and_an_orm_handler_runs(django_asgi: Any) -> None:
    """Lifespan starts and stops the webhook app (Django alone would refuse the scope); a
    synchronous ORM handler answers a session end to end through the wrapper."""

    def make_host(new_webhooks: WebhooksFactory) -> WebhooksAndDjango:
        return with_webhooks(django_asgi, new_webhooks())

    async with hosted_stack(_orm_tools(), make_host) as hosted:
        async with lifespan_of(hosted.host):
            assert hosted.webhooks.dispatcher.started
            session_id = hosted.fake.create_session(
                [[FakeCall("answer", {"question": "six times seven"})]]
            )
            await hosted.fake.wait_idle(session_id, timeout=10)
        assert not hosted.webhooks.dispatcher.started
    assert [s.output for s in hosted.fake.submissions] == [
        '{"question":"six times seven","answer":42}'
    ]


@pytest.mark.anyio
async def test_root_path_prefix(django_asgi: Any) -> None:
    """Behind a prefix (``root_path``), the wrapper matches the path below it."""

    def make_host(new_webhooks: WebhooksFactory) -> WebhooksAndDjango:
        return with_webhooks(django_asgi, new_webhooks())

    async with hosted_stack(_orm_tools(), make_host, root_path="/api") as hosted:
        body, headers = signed_delivery(
            SECRET, webhook_event("agent.session.in_progress", {"id": "s"})
        )
        response = await hosted.http.post("/api/openai/webhooks", content=body, headers=headers)
        assert response.json() == {"status": "ignored"}


def test_bad_path_is_refused() -> None:
    """The webhook path must be absolute and not the root."""

    async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        return None

    for bad in ("openai", "/", ""):
        with pytest.raises(ConfigurationError):
            with_webhooks(asgi_app, asgi_app, bad)


@pytest.mark.anyio
async def test_django_db_closes_connections_like_a_request(django_asgi: Any) -> None:
    """After the handler (normally or with an error) the thread's connection is closed when
    ``CONN_MAX_AGE`` says so: nothing leaks in the shared worker threads."""
    from django.db import connection

    seen: list[tuple[str, bool]] = []

    @django_db
    def query(fail: bool) -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            (value,) = cursor.fetchone()
        if fail:
            raise ToolError("asked to fail")
        return int(value)

    def run_in_worker(fail: bool) -> None:
        with contextlib.suppress(ToolError):
            query(fail)
        seen.append((threading.current_thread().name, connection.connection is None))

    await anyio.to_thread.run_sync(run_in_worker, False)
    await anyio.to_thread.run_sync(run_in_worker, True)
    assert [closed for _, closed in seen] == [True, True]


def test_django_db_keeps_the_schema_and_refuses_async() -> None:
    """The decorated handler's signature and docstring still make the tool's schema; an
    async handler is refused at registration (the ORM is synchronous)."""
    tools = _orm_tools()
    definition = tools.definitions()[0]
    assert definition["name"] == "answer"
    assert definition["description"].startswith("Ask the database")
    assert definition["parameters"]["required"] == ["question"]

    async def asynchronous() -> None:
        return None

    with pytest.raises(ToolDefinitionError, match="synchronous"):
        django_db(asynchronous)


def test_example_project_files_exist() -> None:
    """The Django example keeps the names other tests and the README rely on."""
    root = Path(__file__).resolve().parents[2] / "examples" / "django_app"
    assert (root / "exampleproject" / "asgi.py").is_file()
    assert (root / "orders" / "migrations" / "0001_initial.py").is_file()


@pytest.mark.anyio
async def test_with_admin_serves_the_page_and_passes_lifespan_on(django_asgi: Any) -> None:
    """``with_admin(with_webhooks(...), admin)``: the page at ``/openai/admin``, the webhook
    and Django unchanged, and lifespan still starts the webhook app."""
    token = "admin-token-0123456789"
    bearer = {"authorization": f"Bearer {token}"}

    def make_host(new_webhooks: WebhooksFactory) -> AdminBeside:
        admin = AdminApp(MemoryOperatorView(), tokens=[token])
        return with_admin(with_webhooks(django_asgi, new_webhooks()), admin)

    async with hosted_stack(_orm_tools(), make_host) as hosted:
        for url in ["/openai/admin", "/openai/admin/calls"]:
            page = await hosted.http.get(url, headers=bearer)
            assert page.status_code == 200, url
            assert 'href="/openai/admin/deliveries"' in page.text
        assert (await hosted.http.get("/")).text == "django /"
        assert (await hosted.http.get("/openai/webhooks/healthz")).json()["status"] == "ok"
        async with lifespan_of(hosted.host):
            assert hosted.webhooks.dispatcher.started
        assert not hosted.webhooks.dispatcher.started
