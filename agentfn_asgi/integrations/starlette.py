"""Mount the webhook receiver in a Starlette app at an exact path, with no redirect.

``Mount("/openai/webhooks", webhooks)`` alone does not match ``/openai/webhooks`` (only
``/openai/webhooks/...``); Starlette then answers ``307`` to add the slash, and a webhook
sender counts any 3xx as a failed delivery. :func:`webhook_routes` pairs an exact-path route
with the mount, so both ``/openai/webhooks`` and ``/openai/webhooks/`` reach the app directly
and ``/openai/webhooks/healthz`` still works::

    from starlette.applications import Starlette
    from agentfn_asgi import AgentWebhookApp
    from agentfn_asgi.integrations.starlette import webhook_routes

    webhooks = AgentWebhookApp(tools)
    app = Starlette(routes=[*webhook_routes(webhooks), ...], lifespan=webhooks.lifespan)

or, for an app that already exists (FastAPI too), ``mount(app, webhooks)``. The operator
page (:class:`agentfn_asgi.admin.AdminApp`) goes beside it with ``mount_admin(app, admin)``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast
from urllib.parse import urlsplit

from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from ..errors import ConfigurationError

__all__ = [
    "ADMIN_PATH",
    "DEFAULT_PATH",
    "AnyASGIApp",
    "ExactPathApp",
    "mount",
    "mount_admin",
    "not_found_hint",
    "webhook_routes",
]

#: Any ASGI callable: ``AgentWebhookApp`` types its scope as a plain ``dict``, which
#: Starlette's stricter ``ASGIApp`` alias would refuse.
AnyASGIApp = Callable[..., Awaitable[None]]

#: Where the examples and the documentation mount the receiver.
DEFAULT_PATH = "/openai/webhooks"
#: Where the examples and the documentation mount the operator page.
ADMIN_PATH = "/openai/admin"


def not_found_hint(url: str | None = None) -> str:
    """What a 404 at a webhook URL means (said by ``agentfn-asgi send``, ``webhooks test``
    and the fake's delivery log): the receiver is mounted at another path, or not at all."""
    path = urlsplit(url).path or "/" if url else "that path"
    return (
        f"nothing answers at {path}: check the mount path. mount(app, webhooks, PATH) serves"
        f" the receiver at PATH exactly (the examples use {DEFAULT_PATH}); GET PATH/healthz"
        " answers where it is mounted"
    )


def _normalise(path: str) -> str:
    if not path.startswith("/") or path.rstrip("/") == "":
        raise ConfigurationError(f"mount path must start with '/' and not be the root: {path!r}")
    return path.rstrip("/")


def _route_path(scope: Scope) -> str:
    # The path below the host's root_path (what Starlette routes match on); kept local
    # rather than importing Starlette's private helper.
    path: str = scope["path"]
    root_path: str = scope.get("root_path", "")
    if root_path and (path == root_path or path.startswith(root_path + "/")):
        return path[len(root_path) :]
    return path


class ExactPathApp:
    """Serve ``app`` at the exact path its route matched, as if it were mounted there.

    It moves the matched path into ``root_path`` (the same convention ``Mount`` uses), so the
    wrapped app sees its own sub-path as ``""``.
    """

    def __init__(self, app: AnyASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            mount_point = scope.get("root_path", "") + _route_path(scope)
            # Setting ``path`` too keeps the ASGI rule "path includes root_path" true even
            # when a server sent a path without its root_path.
            scope = {**scope, "root_path": mount_point, "path": mount_point}
        await self.app(scope, receive, send)


def webhook_routes(webhooks: AnyASGIApp, path: str = DEFAULT_PATH) -> list[BaseRoute]:
    """Routes serving ``webhooks`` at ``path``, ``path/`` and everything below it.

    Put them before any catch-all route of the host (a ``Mount("/")`` would shadow them).
    Both routes accept every method; the webhook app itself answers 405 to non-POST.
    """
    path = _normalise(path)
    return [
        Route(path, ExactPathApp(webhooks), include_in_schema=False),
        Mount(path, app=cast(ASGIApp, webhooks)),
    ]


def mount(host: Any, webhooks: AnyASGIApp, path: str = DEFAULT_PATH) -> None:
    """Insert :func:`webhook_routes` at the front of ``host.router.routes``.

    Works for any Starlette application, FastAPI included. Routes go first so that a host
    catch-all route or mount cannot shadow the webhook URL. Lifespan is not touched: pass
    ``lifespan=webhooks.lifespan`` to the host (or enter it inside your own lifespan);
    without it the webhook app starts on its first request.
    """
    router = getattr(host, "router", None)
    routes = getattr(router, "routes", None)
    if not isinstance(routes, list):
        raise ConfigurationError(
            f"cannot mount on {type(host).__name__}: expected a Starlette or FastAPI app"
        )
    routes[0:0] = webhook_routes(webhooks, path)


def mount_admin(host: Any, admin: AnyASGIApp, path: str = ADMIN_PATH) -> None:
    """Mount the operator page at ``path`` (and below) in front of ``host``'s routes.

    The same exact-path routes as the webhook, so ``/openai/admin`` answers without a
    redirect and the page's links (built from ``root_path``) work with or without the slash.
    """
    mount(host, admin, path)
