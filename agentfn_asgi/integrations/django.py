"""Serve the webhook receiver beside Django's ASGI application.

Django has no way to mount an ASGI app inside its URLconf, so :func:`with_webhooks` wraps
both in one ASGI application that routes by path. In your project's ``asgi.py``::

    import os
    from django.core.asgi import get_asgi_application

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "mysite.settings")
    django_app = get_asgi_application()        # calls django.setup(): models import after it

    from agentfn_asgi import AgentWebhookApp
    from agentfn_asgi.integrations.django import with_webhooks
    from mysite.tools import tools

    webhooks = AgentWebhookApp(tools, resources=settings)    # or any object of yours
    application = with_webhooks(django_app, webhooks)        # POST /openai/webhooks

The operator page (:class:`agentfn_asgi.admin.AdminApp`) goes in front of that with
``application = with_admin(with_webhooks(django_app, webhooks), admin)`` (``/openai/admin``).

The wrapper answers the ``lifespan`` protocol itself (Django's handler refuses it) by starting
and stopping the webhook app, so ``uvicorn mysite.asgi:application`` runs the recovery sweep
at start-up and drains in-flight calls on shutdown. Without lifespan (some servers never send
it) the webhook app starts on its first request.

ORM access: synchronous handlers already run in a worker thread, where the ORM may be used
directly. Decorate them with :func:`django_db` so database connections are handled the way
Django handles them around each request (``close_old_connections`` before and after, which
honours ``CONN_MAX_AGE`` and drops broken connections).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, cast

from starlette.routing import Router

from ..errors import ConfigurationError, ToolDefinitionError
from .starlette import ADMIN_PATH, DEFAULT_PATH, webhook_routes

__all__ = [
    "ADMIN_PATH",
    "DEFAULT_PATH",
    "AdminBeside",
    "WebhooksAndDjango",
    "django_db",
    "with_admin",
    "with_webhooks",
]

P = ParamSpec("P")
R = TypeVar("R")

Scope = dict[str, Any]
ASGIApp = Callable[[Scope, Any, Any], Any]


class WebhooksAndDjango:
    """One ASGI app: ``path`` (exact, trailing slash and below) → webhooks, the rest → Django.

    ``lifespan`` goes to the webhook app only: it starts the dispatcher and its recovery
    sweep, and drains in-flight calls on shutdown.
    """

    def __init__(self, django_app: ASGIApp, webhooks: ASGIApp, *, path: str = DEFAULT_PATH) -> None:
        self.django_app = django_app
        self.webhooks = webhooks
        # Starlette's router over the integration's exact-path routes (no slash redirect).
        routes = webhook_routes(webhooks, path)
        self._router = Router(routes, redirect_slashes=False, default=cast(Any, django_app))

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self.webhooks(scope, receive, send)
            return
        await self._router(scope, receive, send)


def with_webhooks(
    django_app: ASGIApp, webhooks: ASGIApp, path: str = DEFAULT_PATH
) -> WebhooksAndDjango:
    """Serve ``webhooks`` at ``path`` and Django everywhere else (see the module docstring)."""
    return WebhooksAndDjango(django_app, webhooks, path=path)


class AdminBeside(WebhooksAndDjango):
    """One ASGI app: ``path`` (exact, trailing slash and below) → the operator page, the rest
    → ``app``. Unlike :class:`WebhooksAndDjango`, ``lifespan`` goes to ``app`` (typically
    ``with_webhooks(...)``, which starts the webhook app); the page resolves its own parts
    on its first request."""

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self.django_app(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def with_admin(app: ASGIApp, admin: ASGIApp, path: str = ADMIN_PATH) -> AdminBeside:
    """Serve the operator page ``admin`` at ``path`` and ``app`` everywhere else, e.g.
    ``with_admin(with_webhooks(django_app, webhooks), admin)``."""
    return AdminBeside(app, admin, path=path)


def django_db(fn: Callable[P, R]) -> Callable[P, R]:
    """Run a synchronous ORM-using handler the way Django runs a request.

    Calls ``django.db.close_old_connections()`` before and after the handler, so a worker
    thread never reuses a connection past ``CONN_MAX_AGE`` or one left broken by an error.
    Apply it under ``@tools.function`` (the signature and docstring are kept, so the tool's
    schema is unchanged). Asynchronous handlers are refused: use Django's async ORM methods
    (``aget``, ``acount``...) or a synchronous handler instead.
    """
    if inspect.iscoroutinefunction(fn):
        raise ToolDefinitionError(
            f"django_db is for synchronous handlers; {fn.__qualname__} is async "
            "(use Django's async ORM methods there, or make the handler synchronous)"
        )
    try:
        from django.db import close_old_connections
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ConfigurationError("django_db needs Django installed: pip install django") from exc

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        close_old_connections()
        try:
            return fn(*args, **kwargs)
        finally:
            close_old_connections()

    return wrapper
