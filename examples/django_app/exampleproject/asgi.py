"""ASGI entry point: Django everywhere, the webhook receiver at ``/openai/webhooks``.

Run it (from the repository root)::

    python -m django migrate --settings examples.django_app.exampleproject.settings
    OPENAI_API_KEY=sk-... OPENAI_WEBHOOK_SECRET=whsec_... \\
        uvicorn examples.django_app.exampleproject.asgi:application --port 8000

Configuration comes from the environment: ``OPENAI_API_KEY``, ``OPENAI_BASE_URL``,
``OPENAI_WEBHOOK_SECRET`` (several, separated by spaces or commas, during a rotation),
``AGENTFN_STORE_URL`` (default ``sqlite:///agentfn.sqlite3``), ``EXAMPLE_LEDGER``,
``EXAMPLE_DJANGO_DB`` (Django's own SQLite file) and ``AGENTFN_ADMIN_TOKEN`` (when set, the
operator page answers at ``/openai/admin``).
"""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "examples.django_app.exampleproject.settings")
# get_asgi_application() runs django.setup(); models (imported by the tools) come after it.
django_application = get_asgi_application()

from agentfn_asgi import AgentWebhookApp  # noqa: E402
from agentfn_asgi.admin import AdminApp  # noqa: E402
from agentfn_asgi.demo.tools import ACTIONS, ExampleResources, Ledger  # noqa: E402
from agentfn_asgi.integrations.django import with_admin, with_webhooks  # noqa: E402
from examples.django_app.exampleproject.tools import tools  # noqa: E402

# Host resources handlers reach as ``ctx.resources`` (created once, at start-up).
webhooks = AgentWebhookApp(
    tools, resources=ExampleResources(ledger=Ledger.from_env()), actions=ACTIONS
)
application = with_webhooks(django_application, webhooks, "/openai/webhooks")
# The operator page: on with AGENTFN_ADMIN_TOKEN set, else 404 (see docs/operating.md).
application = with_admin(application, AdminApp(webhooks), "/openai/admin")
