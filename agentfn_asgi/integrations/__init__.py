"""Helpers that put an :class:`~agentfn_asgi.app.AgentWebhookApp` inside a host framework
(or hand its worker tools to one).

Each integration lives in its own module and imports its framework lazily, so installing
agentfn-asgi never pulls in a framework you do not use:

- :mod:`agentfn_asgi.integrations.starlette`: ``webhook_routes()`` and ``mount()``, an
  exact-path mount (no trailing-slash redirect) for Starlette;
- :mod:`agentfn_asgi.integrations.fastapi`: the same for FastAPI (a Starlette subclass);
- :mod:`agentfn_asgi.integrations.django`: ``with_webhooks()`` to serve the sub-app beside
  Django's ASGI application, and ``django_db`` for handlers that use the ORM;
- :mod:`agentfn_asgi.integrations.celery`: ``celery_enqueue()`` and ``register_task()``, to
  run worker tools on Celery workers (the ``celery`` extra).
"""

from __future__ import annotations

__all__: list[str] = []
