"""The baseline: the simplest correct endpoint a user would write by hand from the seed docs.

One Starlette route does everything before answering the webhook: verify the Standard
Webhooks signature, parse the event, drop a ``webhook-id`` already seen (in memory), read
the session, run each pending function call, submit each result, and only then return 200.
Any failure answers 500 and forgets the ``webhook-id`` so the sender's retry runs it again.

The HTTP client is the one thing that varies: ``httpx`` (what the design card names) or
``httpx2`` (what the official ``openai`` SDK uses today), each with its default settings,
as a user would leave them.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from benchmarks.handlers import HANDLERS

__all__ = ["build_inline_app"]


def _verify(secret: bytes, body: bytes, headers: Any, tolerance: int = 300) -> str | None:
    """Return the webhook-id if the delivery is authentic and fresh, else None."""
    msg_id = headers.get("webhook-id")
    timestamp = headers.get("webhook-timestamp")
    signatures = headers.get("webhook-signature")
    if not msg_id or not timestamp or not signatures or not timestamp.isdigit():
        return None
    if abs(time.time() - int(timestamp)) > tolerance:
        return None
    mac = hmac.new(secret, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    expected = base64.b64encode(mac).decode()
    for entry in signatures.split(" "):
        version, _, value = entry.partition(",")
        if version == "v1" and hmac.compare_digest(value, expected):
            return str(msg_id)
    return None


def build_inline_app(
    *, client: Literal["httpx", "httpx2"], api_url: str, api_key: str, secret: str
) -> Starlette:
    """The inline handler on ``client``, answering ``POST /webhooks`` (and ``GET /ready``)."""
    if client == "httpx2":
        import httpx2 as http
    else:
        import httpx as http  # type: ignore[no-redef]
    key = base64.b64decode(secret.removeprefix("whsec_"))
    seen: set[str] = set()
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        headers = {"Authorization": f"Bearer {api_key}", "OpenAI-Beta": "agents=v1"}
        async with http.AsyncClient(base_url=api_url, headers=headers, timeout=30.0) as c:
            state["client"] = c
            yield

    async def webhook(request: Request) -> Response:
        body = await request.body()
        msg_id = _verify(key, body, request.headers)
        if msg_id is None:
            return PlainTextResponse("invalid signature", status_code=401)
        if msg_id in seen:
            return Response(status_code=200)
        event = json.loads(body)
        if event.get("type") != "agent.session.action_required":
            return Response(status_code=200)
        session_id = event["data"]["id"]
        seen.add(msg_id)
        api = state["client"]
        try:
            response = await api.get(f"/agents/sessions/{session_id}")
            response.raise_for_status()
            for action in response.json().get("required_actions", []):
                if action.get("type") != "function_call":
                    continue
                result: dict[str, Any] = {
                    "type": "agent.session.input.tool_result",
                    "turn_id": action["turn_id"],
                    "call_id": action["call_id"],
                }
                try:
                    output = await HANDLERS[action["name"]](**action["arguments"])
                    if not isinstance(output, str):
                        output = json.dumps(output)
                    result.update(success=True, output=output)
                except Exception:
                    result.update(success=False, error="Tool handler failed.")
                submitted = await api.post(
                    f"/agents/sessions/{session_id}/events", json={"events": [result]}
                )
                submitted.raise_for_status()
        except Exception:
            seen.discard(msg_id)
            return PlainTextResponse("failed", status_code=500)
        return Response(status_code=200)

    async def ready(_request: Request) -> Response:
        return PlainTextResponse("ok")

    return Starlette(
        routes=[Route("/webhooks", webhook, methods=["POST"]), Route("/ready", ready)],
        lifespan=lifespan,
    )
