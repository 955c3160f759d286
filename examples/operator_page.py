"""The operator page for the examples: ``/openai/admin``, only when ``AGENTFN_ADMIN_TOKEN``
is set (one token, or several separated by spaces or commas during a rotation).

Without the variable the page is not mounted at all (the URL is the host's 404).
"""

from __future__ import annotations

from agentfn_asgi import AgentWebhookApp, Config
from agentfn_asgi.admin import AdminApp

__all__ = ["admin_from_env"]


def admin_from_env(webhooks: AgentWebhookApp) -> AdminApp | None:
    """The operator page over ``webhooks``' store and dispatcher, or None when it is off."""
    tokens = Config.from_env().admin_tokens
    if not tokens:
        return None
    view = webhooks.operator()
    return AdminApp(view, tokens=tokens)
