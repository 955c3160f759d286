"""The operator page: see every call, explain it, settle the ones that wait for a person.

An ASGI app the host mounts where it likes, reading through the same
:class:`~agentfn_asgi.operator.OperatorView` as the CLI. It is **off unless configured**:
without tokens (default ``AGENTFN_ADMIN_TOKEN``) or an ``authorizer`` it answers 404::

    from agentfn_asgi.admin import AdminApp
    from agentfn_asgi.integrations.starlette import mount_admin

    mount_admin(app, AdminApp(webhooks))       # GET /openai/admin (also FastAPI)

Built on the webhook app it checks nothing at import; it starts with the app.

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
