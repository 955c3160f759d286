"""Public test kit: a fake Agents API and helpers to sign webhook deliveries.

- :class:`FakeAgentsAPI`: an ASGI app behaving like the Agents API endpoints the middleware
  uses (sessions with scripted function calls, validation, idempotency, SSE, signed
  webhooks with retries) plus fault injection. Use it in-process through
  ``httpx.ASGITransport`` or over loopback with :func:`serve_fake`.
- :func:`signed_delivery`, :func:`action_required_event`, :func:`sign`,
  :func:`signed_headers`: build signed requests to test a webhook endpoint directly.
- :func:`serve_app`: run any ASGI app on a free loopback port (needs the ``server`` extra).
"""

from __future__ import annotations

from agentfn_asgi.signing import sign, signed_headers
from agentfn_asgi.testing.deliveries import (
    WEBHOOK_USER_AGENT,
    action_required_event,
    new_webhook_id,
    signed_delivery,
    webhook_event,
)
from agentfn_asgi.testing.fake import (
    FakeAgentsAPI,
    FakeCall,
    FakeConnectionDropped,
    RecordedRequest,
    Route,
    Submission,
)
from agentfn_asgi.testing.fake_state import RawJSON
from agentfn_asgi.testing.fake_validation import MAX_REQUEST_BYTES
from agentfn_asgi.testing.fake_webhooks import DeliveryAttempt
from agentfn_asgi.testing.server import serve_app, serve_fake

__all__ = [
    "MAX_REQUEST_BYTES",
    "WEBHOOK_USER_AGENT",
    "DeliveryAttempt",
    "FakeAgentsAPI",
    "FakeCall",
    "FakeConnectionDropped",
    "RawJSON",
    "RecordedRequest",
    "Route",
    "Submission",
    "action_required_event",
    "new_webhook_id",
    "serve_app",
    "serve_fake",
    "sign",
    "signed_delivery",
    "signed_headers",
    "webhook_event",
]
