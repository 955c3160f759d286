"""Build and sign webhook deliveries the way OpenAI sends them (wire protocol §8).

Use these to test a webhook endpoint without the fake service::

    body, headers = signed_delivery(secret, action_required_event("sess_1"))
    response = await client.post("/webhooks", content=body, headers=headers)
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Sequence
from typing import Any

from agentfn_asgi.signing import signed_headers

__all__ = [
    "WEBHOOK_USER_AGENT",
    "action_required_event",
    "new_webhook_id",
    "signed_delivery",
    "webhook_event",
]

#: The ``user-agent`` OpenAI's webhook sender announces.
WEBHOOK_USER_AGENT = "OpenAI/1.0 (+https://platform.openai.com/docs/webhooks)"


def new_webhook_id() -> str:
    """A fresh delivery id in OpenAI's ``wh_…`` style (the ``webhook-id`` header)."""
    return "wh_" + secrets.token_hex(16)


def webhook_event(
    event_type: str,
    data: dict[str, Any],
    *,
    event_id: str | None = None,
    created_at: int | None = None,
    clock: Callable[[], float] = time.time,
) -> dict[str, Any]:
    """A webhook envelope ``{id, object: "event", created_at, type, data}``."""
    return {
        "id": event_id or "evt_" + secrets.token_hex(12),
        "object": "event",
        "created_at": int(clock()) if created_at is None else created_at,
        "type": event_type,
        "data": data,
    }


def action_required_event(
    session_id: str,
    action_type: str = "function_call",
    *,
    event_id: str | None = None,
    created_at: int | None = None,
) -> dict[str, Any]:
    """The body of an ``agent.session.action_required`` webhook for ``session_id``."""
    return webhook_event(
        "agent.session.action_required",
        {"id": session_id, "required_action": {"type": action_type}},
        event_id=event_id,
        created_at=created_at,
    )


def signed_delivery(
    secret: str | Sequence[str],
    event: dict[str, Any] | bytes,
    *,
    msg_id: str | None = None,
    timestamp: int | None = None,
) -> tuple[bytes, dict[str, str]]:
    """Return ``(body, headers)`` of a signed delivery of ``event``.

    A dict is serialised as compact JSON; bytes are sent (and signed) exactly as given.
    ``headers`` holds ``content-type``, ``user-agent`` and the three ``webhook-*`` headers
    (one ``v1`` signature per secret).
    """
    body = event if isinstance(event, bytes) else json.dumps(event, separators=(",", ":")).encode()
    headers = {
        "content-type": "application/json",
        "user-agent": WEBHOOK_USER_AGENT,
        **signed_headers(secret, body, msg_id=msg_id or new_webhook_id(), timestamp=timestamp),
    }
    return body, headers
