"""Public test kit: a fake Agents API, a one-line wiring to your app, signed deliveries.

- :func:`connect`: ``async with connect(tools) as (app, fake):`` runs an
  ``AgentWebhookApp`` against a :class:`FakeAgentsAPI` in this process, wired both ways
  (signed webhooks into the app at its mount path, the app's client into the fake).
- :class:`FakeAgentsAPI`: an ASGI app behaving like the Agents API endpoints the middleware
  uses (sessions with scripted function calls, validation, idempotency, SSE, signed
  webhooks with retries) plus fault injection. Over loopback with :func:`serve_fake`;
  :class:`FakeControlApp` adds the ``/_fake/`` control API ``agentfn-asgi fake-api`` serves.
- :func:`signed_delivery`, :func:`action_required_event`, :func:`sign`,
  :func:`signed_headers`: build signed requests to test a webhook endpoint directly.
- :func:`serve_app`: run any ASGI app on a free loopback port (needs the ``server`` extra).
"""

from __future__ import annotations

from agentfn_asgi.signing import sign, signed_headers
from agentfn_asgi.testing.connect import Connection, connect
from agentfn_asgi.testing.control import FakeControlApp
from agentfn_asgi.testing.deliveries import (
    WEBHOOK_USER_AGENT,
    action_required_event,
    new_webhook_id,
    signed_delivery,
    webhook_event,
)
from agentfn_asgi.testing.fake import FakeAgentsAPI, Route
from agentfn_asgi.testing.fake_http import FakeConnectionDropped, RecordedRequest
from agentfn_asgi.testing.fake_state import FakeCall, FakeRequest, RawJSON, Submission
from agentfn_asgi.testing.fake_validation import MAX_REQUEST_BYTES
from agentfn_asgi.testing.fake_webhooks import DeliveryAttempt, webhook_backoff
from agentfn_asgi.testing.server import serve_app, serve_fake

__all__ = [
    "MAX_REQUEST_BYTES",
    "WEBHOOK_USER_AGENT",
    "Connection",
    "DeliveryAttempt",
    "FakeAgentsAPI",
    "FakeCall",
    "FakeConnectionDropped",
    "FakeControlApp",
    "FakeRequest",
    "RawJSON",
    "RecordedRequest",
    "Route",
    "Submission",
    "action_required_event",
    "connect",
    "new_webhook_id",
    "serve_app",
    "serve_fake",
    "sign",
    "signed_delivery",
    "signed_headers",
    "webhook_backoff",
    "webhook_event",
]
