"""In-process stacks for the fault and hostile-input tests, with the client under control.

The same ``connect`` stack as ``tests/support/stack.py`` with a fresh fake and memory store
each time; the fault tests choose the client's retry budget, real sleeps (to see
``Retry-After`` honoured) or real sockets (``loopback``: read timeouts, which
``httpx.ASGITransport`` cannot produce) and the key it sends.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from agentfn_asgi.dispatch import DispatchSettings
from agentfn_asgi.testing import Connection
from agentfn_asgi.tools import FunctionTools

from ..support.stack import API_KEY, FAST, SECRET, running_stack

__all__ = ["API_KEY", "SECRET", "fault_stack"]


@contextlib.asynccontextmanager
async def fault_stack(
    tools: FunctionTools,
    *,
    settings: DispatchSettings = FAST,
    loopback: bool = False,
    webhooks: bool = True,
    client_options: dict[str, Any] | None = None,
    api_key: str = API_KEY,
    **app_options: Any,
) -> AsyncIterator[Connection]:
    """Fake ⇄ client ⇄ app; the client is built with ``client_options``.

    With ``loopback`` the fake is served by uvicorn on 127.0.0.1 and the client talks to it
    through real sockets (its own pooled httpx client, real timeouts, real sleeps);
    otherwise through ``httpx.ASGITransport`` with the suite's fast sleep unless
    ``client_options`` gives ``sleep``. ``api_key`` is what the client sends (the fake
    expects ``API_KEY``).
    """
    options = dict(client_options or {}, api_key=api_key)
    async with running_stack(
        tools,
        settings=settings,
        loopback=loopback,
        webhooks=webhooks,
        client_options=options,
        **app_options,
    ) as stack:
        yield stack
