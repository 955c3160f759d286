"""The operator page: see every call, explain it, settle the ones that wait for a person.

An ASGI app the host mounts where it likes, reading through the same
:class:`~agentfn_asgi.operator.OperatorView` as the CLI. It is **off unless configured**:
without ``tokens`` or an ``authorizer`` it refuses to start::

    from agentfn_asgi import Config
    from agentfn_asgi.admin import AdminApp
    from agentfn_asgi.integrations.starlette import mount_admin

    admin = AdminApp(webhooks.operator(), tokens=Config.from_env().admin_tokens)
    mount_admin(app, admin)                    # GET /openai/admin (also FastAPI)

Pages: overview (health, counts by state), calls (filters ``state``, ``session``,
``tool``, ``since``, ``limit``; newest first, paginated), one call's timeline (content only
on request), calls that need attention with settle forms (confirmed on a second page), and
unresolved deliveries. Server-rendered HTML without any script, usable without JavaScript.

Modules: :mod:`.app` (ASGI, authentication flow, headers), :mod:`.auth` (tokens, cookies,
CSRF), :mod:`.handlers` (one per page), :mod:`.pages` and :mod:`.layout` (rendering),
:mod:`.forms` (checking input), :mod:`.html` (the escaping helper).
"""

from __future__ import annotations

from .app import AdminApp
from .auth import Authorizer

__all__ = ["AdminApp", "Authorizer"]
