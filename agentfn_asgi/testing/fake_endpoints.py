"""Webhook endpoints of :class:`~agentfn_asgi.testing.FakeAgentsAPI` (wire protocol §8.5).

The fake serves the management API the official SDK calls ``client.webhooks``:
``POST /webhook_endpoints`` (create: the answer holds a fresh ``whsec_`` secret),
``GET /webhook_endpoints[/{id}]``, ``POST /webhook_endpoints/{id}`` (update),
``DELETE /webhook_endpoints/{id}``, ``POST /webhook_endpoints/{id}/rotate_secret``,
``POST /webhook_endpoints/{id}/test`` and ``GET /webhook_event_types``.

An endpoint created here receives the fake's events of the types it subscribes to, signed
with its own secret, as well as the URLs the fake was started with. ``test`` signs a sample
of the given type with the endpoint's secret(s), posts it once (no retry) and answers the
status code it got. After a rotation with ``keep_old_secret_active_for_24_hours`` every
delivery to that endpoint is signed with the new and the old secret (two ``v1,``
signatures, space-separated, as Standard Webhooks senders do) until the 24 hours end.

Where the fake is looser or had to choose: it takes ``http://`` URLs (the real API wants
HTTPS; a local app listens on plain HTTP), and a test delivery that gets no answer is a 400
naming the error (the real API's answer to that is not documented).
"""

from __future__ import annotations

import base64
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from agentfn_asgi.testing.fake_validation import error_body, list_page
from agentfn_asgi.wire import WEBHOOK_EVENT_TYPES

__all__ = [
    "KEEP_OLD_SECRET_SECONDS",
    "EndpointReply",
    "FakeEndpoint",
    "FakeEndpoints",
    "new_webhook_secret",
    "sample_data",
]

#: How long a rotated-out secret still signs with ``keep_old_secret_active_for_24_hours``.
KEEP_OLD_SECRET_SECONDS = 24 * 3600

#: A reply of the endpoint routes: status and JSON body.
EndpointReply = tuple[int, dict[str, Any]]
#: A request's query string, parsed (``urllib.parse.parse_qs``).
Query = Mapping[str, list[str]]

_SAMPLE_PREFIXES = {
    "batch": "batch_",
    "response": "resp_",
    "eval": "evalrun_",
    "fine_tuning": "ftjob_",
    "realtime": "rtc_",
    "video": "video_",
    "agent.environment": "env_",
    "agent.session": "sess_",
    "safety": "safety_",
}


def new_webhook_secret() -> str:
    """A fresh ``whsec_`` signing secret (24 random bytes, base64)."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def sample_data(event_type: str) -> dict[str, Any]:
    """The ``data`` of a sample event of ``event_type``: made-up ids of the right kind (a
    sample's session, batch or response does not exist)."""
    prefix = next(
        (value for key, value in _SAMPLE_PREFIXES.items() if event_type.startswith(key + ".")),
        "obj_",
    )
    data: dict[str, Any] = {"id": prefix + secrets.token_hex(12)}
    if event_type == "agent.session.action_required":
        data["required_action"] = {"type": "function_call"}
    elif event_type.startswith("agent.session."):
        data["environment_type"] = "none"
    return data


@dataclass(slots=True)
class FakeEndpoint:
    """One webhook endpoint: where, what, and the secret(s) deliveries are signed with."""

    id: str
    name: str
    url: str
    event_types: list[str]
    created_at: int
    updated_at: int
    secret: str
    old_secret: str | None = None
    old_secret_until: float = 0.0

    def signing_secrets(self, now: float) -> tuple[str, ...]:
        """The new secret, then the old one while it is kept active."""
        if self.old_secret is not None and now < self.old_secret_until:
            return (self.secret, self.old_secret)
        return (self.secret,)

    def to_json(self, *, with_secret: bool = False) -> dict[str, Any]:
        """The ``WebhookEndpoint`` JSON (``WebhookEndpointWithSecret`` with the secret)."""
        document: dict[str, Any] = {
            "id": self.id,
            "object": "webhook_endpoint",
            "created_at": self.created_at,
            "event_types": list(self.event_types),
            "name": self.name,
            "url": self.url,
            "signing_secret_hint": self.secret[:10] + "..." + self.secret[-4:],
            "updated_at": self.updated_at,
        }
        if with_secret:
            document["signing_secret"] = self.secret
        return document


#: What a route answers: a reply, or the endpoint a valid ``test`` goes to.
_Answer = EndpointReply | FakeEndpoint


class FakeEndpoints:
    """The project's webhook endpoints, in creation order (synchronous: each check and
    update is atomic on the event loop)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.by_id: dict[str, FakeEndpoint] = {}

    def subscribed(self, event_type: str) -> list[FakeEndpoint]:
        """The endpoints an event of ``event_type`` goes to."""
        return [e for e in self.by_id.values() if event_type in e.event_types]

    def create(self, body: Any) -> EndpointReply:
        """``POST /webhook_endpoints``."""
        problem = _check_fields(body, required=True)
        if problem is not None:
            return problem
        now = int(self.clock())
        endpoint = FakeEndpoint(
            id="we_" + secrets.token_hex(12),
            name=body["name"],
            url=body["url"],
            event_types=list(dict.fromkeys(body["event_types"])),
            created_at=now,
            updated_at=now,
            secret=new_webhook_secret(),
        )
        self.by_id[endpoint.id] = endpoint
        return 200, endpoint.to_json(with_secret=True)

    def serve(
        self, method: str, endpoint_id: str | None, action: str | None, body: Any, query: Query
    ) -> _Answer | None:
        """Answer one request of the routes below ``/webhook_endpoints``: a reply, the
        endpoint a valid ``test`` goes to (the caller posts the sample), or None when no
        such route exists."""
        if endpoint_id is None:
            if method == "POST":
                return self.create(body)
            return self.list(query) if method == "GET" else None
        handlers: dict[tuple[str, str | None], Callable[[FakeEndpoint], _Answer]] = {
            ("GET", None): lambda endpoint: (200, endpoint.to_json()),
            ("POST", None): lambda endpoint: self.update(endpoint, body),
            ("DELETE", None): self.delete,
            ("POST", "rotate_secret"): lambda endpoint: self.rotate(endpoint, body),
            ("POST", "test"): lambda endpoint: _test_target(endpoint, body),
        }
        handler = handlers.get((method, action))
        if handler is None:
            return None
        endpoint = self.by_id.get(endpoint_id)
        if endpoint is None:
            return 404, error_body(f"No webhook endpoint found with id '{endpoint_id}'.")
        return handler(endpoint)

    def list(self, query: Query) -> EndpointReply:
        """``GET /webhook_endpoints``: ``limit`` (1-100, default 20) and ``after``."""
        missing = "No webhook endpoint with id '{}'."
        return list_page(list(self.by_id.values()), query, FakeEndpoint.to_json, missing)

    def update(self, endpoint: FakeEndpoint, body: Any) -> EndpointReply:
        """``POST /webhook_endpoints/{id}``: the fields given replace the old ones."""
        problem = _check_fields(body, required=False)
        if problem is not None:
            return problem
        changed = False
        for name in ("name", "url", "event_types"):
            if name in body:
                value = list(dict.fromkeys(body[name])) if name == "event_types" else body[name]
                changed = changed or getattr(endpoint, name) != value
                setattr(endpoint, name, value)
        if changed:  # "unchanged updates do not advance it" (the SDK's docstring)
            endpoint.updated_at = int(self.clock())
        return 200, endpoint.to_json()

    def delete(self, endpoint: FakeEndpoint) -> EndpointReply:
        """``DELETE /webhook_endpoints/{id}``: nothing is sent there any more."""
        del self.by_id[endpoint.id]
        return 200, {"id": endpoint.id, "deleted": True, "object": "webhook_endpoint.deleted"}

    def rotate(self, endpoint: FakeEndpoint, body: Any) -> EndpointReply:
        """``POST /webhook_endpoints/{id}/rotate_secret``."""
        body = {} if body is None else body
        if not isinstance(body, dict):
            return 400, error_body("The request body must be a JSON object.")
        keep = body.get("keep_old_secret_active_for_24_hours", False)
        if not isinstance(keep, bool):
            return 400, error_body(
                "keep_old_secret_active_for_24_hours must be a boolean.",
                param="keep_old_secret_active_for_24_hours",
            )
        now = self.clock()
        endpoint.old_secret = endpoint.secret if keep else None
        endpoint.old_secret_until = now + KEEP_OLD_SECRET_SECONDS if keep else 0.0
        endpoint.secret = new_webhook_secret()
        endpoint.updated_at = int(now)
        return 200, endpoint.to_json(with_secret=True)


def _test_target(endpoint: FakeEndpoint, body: Any) -> _Answer:
    """Check a ``POST /webhook_endpoints/{id}/test``: the endpoint, or an error reply."""
    event_type = body.get("event_type") if isinstance(body, dict) else None
    if event_type not in WEBHOOK_EVENT_TYPES:
        return 400, error_body(
            f"Invalid event_type: {event_type!r}. Expected one of "
            f"{', '.join(WEBHOOK_EVENT_TYPES)}.",
            param="event_type",
        )
    return endpoint


def _check_fields(body: Any, *, required: bool) -> EndpointReply | None:
    """The first problem of a create (``required``) or update body, else None."""
    if not isinstance(body, dict):
        return 400, error_body("The request body must be a JSON object.")
    for name in ("event_types", "name", "url") if required else ():
        if name not in body:
            return 400, error_body(f"Missing required parameter: '{name}'.", param=name)
    if "name" in body and (not isinstance(body["name"], str) or not body["name"].strip()):
        return 400, error_body("name must be a non-empty string.", param="name")
    if "url" in body:
        url = body["url"]
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            return 400, error_body(f"Invalid url: {url!r}. Expected an HTTPS URL.", param="url")
    if "event_types" in body:
        types = body["event_types"]
        if not isinstance(types, list) or not types:
            return 400, error_body(
                "event_types must be a non-empty array of event types.", param="event_types"
            )
        for kind in types:
            if kind not in WEBHOOK_EVENT_TYPES:
                return 400, error_body(
                    f"Invalid event type: {kind!r}. See GET /webhook_event_types.",
                    param="event_types",
                )
    return None
