"""The HTTP side of :class:`~agentfn_asgi.testing.FakeAgentsAPI`: routing, faults, auth,
the session endpoints (list, retrieve, submit, delete), the SSE stream and the webhook
endpoint routes (served by :mod:`~agentfn_asgi.testing.fake_endpoints`).

Order of checks per request, as a real deployment layers them: latency, a dropped
connection, an injected failure (a load balancer answers before auth), bearer auth (401),
``OpenAI-Beta`` (400 ``invalid_beta``; not for ``/webhook_endpoints``, which takes none),
the session (404), then the endpoint itself.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import random
import re
import secrets
import string
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import parse_qs

import httpx
from starlette.types import Receive, Scope, Send

from agentfn_asgi.testing.fake_endpoints import FakeEndpoints
from agentfn_asgi.testing.fake_state import STREAM_CUT, FakeSession, RawJSON, StreamItem
from agentfn_asgi.testing.fake_validation import (
    MAX_REQUEST_BYTES,
    Rejection,
    error_body,
    list_page,
    parse_events_body,
)
from agentfn_asgi.testing.fake_webhooks import WebhookSender
from agentfn_asgi.wire import WEBHOOK_EVENT_TYPES

__all__ = [
    "FakeConnectionDropped",
    "FaultPlan",
    "HTTPHost",
    "InjectedFailure",
    "RecordedRequest",
    "handle_http",
]

_PATH = re.compile(r"(?:/v1)?/agents/sessions(?:/([^/]+)(/events|/turns/[^/]+)?)?/?")
_ENDPOINTS_PATH = re.compile(
    r"(?:/v1)?/(webhook_endpoints|webhook_event_types)(?:/([^/]+))?(?:/([^/]+))?/?"
)
_ALNUM = string.ascii_letters + string.digits


class FakeConnectionDropped(httpx.RemoteProtocolError):
    """Raised by the fake's ASGI app to drop a connection (see ``drop_next``).

    Over a real server the response is cut off mid-way and the server closes the socket; in
    process, ``httpx.ASGITransport`` re-raises this, which httpx clients treat as a
    transport error because it is an ``httpx.RemoteProtocolError``.
    """


@dataclass(frozen=True, slots=True)
class RecordedRequest:
    """One request the fake answered: ``status`` is None when the connection was dropped.

    ``route`` is ``list``, ``retrieve``, ``submit``, ``stream``, ``delete`` or ``unknown``;
    ``headers`` are lower-cased.
    """

    method: str
    path: str
    route: str
    status: int | None
    headers: Mapping[str, str]
    at: float

    @property
    def idempotency_key(self) -> str | None:
        """The request's ``Idempotency-Key`` header, if any."""
        return self.headers.get("idempotency-key")


@dataclass(frozen=True, slots=True)
class InjectedFailure:
    """One scripted error answer: ``status``, extra ``headers`` and ``body`` (JSON or bytes).

    With ``after_processing`` the request is served first (a result takes effect) and only
    then answered with this error: the client sees a failure for a request that was applied.
    """

    status: int
    headers: dict[str, str]
    body: Any
    after_processing: bool = False


@dataclass(slots=True)
class FaultPlan:
    """Faults waiting to happen, per route (``list``, ``retrieve``, ``submit``, ``stream``,
    ``delete``, ``webhook_endpoints``); ``stream_cuts`` are (session id or None, event type)
    pairs: the next stream (of that session) about to send an event of that type is cut
    instead."""

    failures: dict[str, collections.deque[InjectedFailure]] = field(
        default_factory=lambda: collections.defaultdict(collections.deque)
    )
    drops: dict[str, collections.deque[bool]] = field(
        default_factory=lambda: collections.defaultdict(collections.deque)
    )
    latency: dict[str, float] = field(default_factory=dict)
    stream_cuts: collections.deque[tuple[str | None, str]] = field(
        default_factory=collections.deque
    )


@dataclass(slots=True)
class _Reply:
    status: int
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)


def _route(method: str, path: str) -> tuple[str, str | None]:
    if _ENDPOINTS_PATH.fullmatch(path):
        return "webhook_endpoints", None
    match = _PATH.fullmatch(path)
    if match is None:
        return "unknown", None
    session_id, tail = match.group(1), match.group(2) or ""
    if session_id is None:
        return ("list" if method == "GET" else "unknown"), None
    routes = {
        ("GET", ""): "retrieve",
        ("DELETE", ""): "delete",
        ("POST", "/events"): "submit",
        ("GET", "/events"): "stream",
        ("GET", "/turns"): "turn",
    }
    return routes.get((method, tail.rsplit("/", 1)[0] or tail), "unknown"), session_id


class HTTPHost(Protocol):
    """What the HTTP layer needs from the fake that owns it (``FakeAgentsAPI``; a protocol,
    so that this module does not import the one that imports it)."""

    api_key: str
    webhooks: WebhookSender
    faults: FaultPlan
    sessions: dict[str, FakeSession]
    idempotency: dict[str, tuple[str, bytes]]
    requests: list[RecordedRequest]
    endpoints: FakeEndpoints
    sse_keepalive: float
    stream_duplicates: bool
    clock: Callable[[], float]

    def delete_session(self, session_id: str) -> None:
        """Forget a session (``DELETE``)."""

    async def test_webhook_endpoint(self, endpoint_id: str, event_type: str) -> int | None:
        """Post a signed sample to an endpoint once; the status it got."""


async def handle_http(fake: HTTPHost, scope: Scope, receive: Receive, send: Send) -> None:
    """Serve one HTTP request and record it in ``fake.requests``."""
    fake.webhooks.ensure_started()
    method: str = scope["method"]
    path: str = scope["path"]
    root = scope.get("root_path") or ""
    if root and path.startswith(root):
        path = path[len(root) :]
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    route, session_id = _route(method, path)
    status: int | None = None
    try:
        body = await _read_body(receive)
        if route in fake.faults.latency and fake.faults.latency[route] > 0:
            await asyncio.sleep(fake.faults.latency[route])
        drops = fake.faults.drops.get(route)
        drop_after = drops.popleft() if drops else None
        if drop_after is False or (drop_after and route == "stream"):
            await _drop(send)
        reply = _check_request(fake, route, session_id, headers)
        if reply is None and route == "stream" and session_id is not None:
            status = 200
            await _stream(fake, session_id, scope, receive, send)
            return
        if reply is None:
            if route == "webhook_endpoints":
                reply = await _endpoints(fake, method, path, body, scope)
            else:
                reply = _serve(fake, route, session_id, headers, body, scope)
            reply = _injected(fake, route, session_id, after_processing=True) or reply
        if drop_after:
            await _drop(send)
        status = reply.status
        await _send_reply(send, reply)
    finally:
        fake.requests.append(RecordedRequest(method, path, route, status, headers, fake.clock()))


def _check_request(
    fake: HTTPHost, route: str, session_id: str | None, headers: dict[str, str]
) -> _Reply | None:
    """Faults, auth, beta header and session lookup: an error reply, or None to proceed."""
    injected = _injected(fake, route, session_id, after_processing=False)
    if injected is not None:
        return injected
    if route == "unknown":
        return _Reply(404, error_body("Invalid URL.", code=None))
    if headers.get("authorization") != f"Bearer {fake.api_key}":
        return _Reply(401, error_body("Incorrect API key provided.", code="invalid_api_key"))
    if route == "webhook_endpoints":
        return None  # the management API takes no OpenAI-Beta header (wire protocol §8.5)
    beta = [part.strip() for part in headers.get("openai-beta", "").split(",")]
    if "agents=v1" not in beta:
        message = "The OpenAI-Beta header must include 'agents=v1'."
        return _Reply(400, error_body(message, param="OpenAI-Beta", code="invalid_beta"))
    if session_id is not None and session_id not in fake.sessions:
        return _Reply(404, error_body(f"No session found with id '{session_id}'.", code=None))
    return None


def _injected(
    fake: HTTPHost, route: str, session_id: str | None, *, after_processing: bool
) -> _Reply | None:
    """The injected failure that answers this request now, its session's before its route's:
    before it is served, or (``after_processing``) in place of a served request's answer."""
    failures = fake.faults.failures
    queue = (failures.get(f"{route} {session_id}") if session_id else None) or failures.get(route)
    if not queue or queue[0].after_processing != after_processing:
        return None
    failure = queue.popleft()
    body = failure.body
    if body is None:
        kind = "server_error" if failure.status >= 500 else "error"
        body = error_body("Injected failure.", type=kind)
    return _Reply(failure.status, body, dict(failure.headers))


async def _endpoints(fake: HTTPHost, method: str, path: str, body: bytes, scope: Scope) -> _Reply:
    """The webhook endpoint routes (:mod:`~agentfn_asgi.testing.fake_endpoints`)."""
    match = _ENDPOINTS_PATH.fullmatch(path)
    assert match is not None
    collection, endpoint_id, action = match.groups()
    if collection == "webhook_event_types":
        if method != "GET" or endpoint_id is not None:
            return _Reply(404, error_body("Invalid URL.", code=None))
        return _Reply(200, {"object": "list", "data": list(WEBHOOK_EVENT_TYPES)})
    payload: Any = None
    if body:
        try:
            payload = json.loads(body)
        except ValueError:
            return _Reply(400, error_body("The request body is not valid JSON."))
    answer = fake.endpoints.serve(method, endpoint_id, action, payload, _query(scope))
    if answer is None:
        return _Reply(404, error_body(f"Invalid URL ({method} {path}).", code=None))
    if isinstance(answer, tuple):
        return _Reply(*answer)
    # A valid test: post the sample to the endpoint once.
    event_type = payload["event_type"]
    status = await fake.test_webhook_endpoint(answer.id, event_type)
    if status is None:
        error = fake.webhooks.attempts[-1].error
        message = f"Could not deliver the test event to {answer.url}: {error}"
        return _Reply(400, error_body(message, param="url"))
    return _Reply(
        200,
        {
            "event_type": event_type,
            "object": "webhook_endpoint.test",
            "status_code": status,
            "success": True,
            "webhook_endpoint_id": answer.id,
        },
    )


def _serve(
    fake: HTTPHost,
    route: str,
    session_id: str | None,
    headers: dict[str, str],
    body: bytes,
    scope: Scope,
) -> _Reply:
    if route == "list":
        return _list(fake, _query(scope))
    assert session_id is not None
    if route == "retrieve":
        return _Reply(200, _with_raw_json(fake.sessions[session_id].snapshot()))
    if route == "turn":
        turn = fake.sessions[session_id].turn(scope["path"].rstrip("/").rsplit("/", 1)[-1])
        if turn is None:
            message = "No turn with that id in this session."
            return _Reply(404, {"error": {"message": message, "type": "invalid_request_error"}})
        return _Reply(200, turn.to_json())
    if route == "delete":
        fake.delete_session(session_id)
        return _Reply(200, {"id": session_id, "deleted": True, "object": "agent.session.deleted"})
    try:
        _submit(fake, session_id, headers.get("idempotency-key"), body)
    except Rejection as rejection:
        return _Reply(rejection.status, rejection.body)
    return _Reply(202)


def _list(fake: HTTPHost, query: dict[str, list[str]]) -> _Reply:
    """``GET /agents/sessions``: a page (:func:`list_page`, newest first by default) of the
    sessions an ``agent_id`` and ``metadata[key]=value`` filters keep (wire protocol §2)."""
    # Sessions are kept in creation order; ``created_at`` has a resolution of seconds.
    sessions = list(fake.sessions.values())
    agent_id = query.get("agent_id", [None])[-1]
    if agent_id is not None and agent_id != "agent_fake":
        sessions = []
    wanted = {
        key[len("metadata[") : -1]: values[-1]
        for key, values in query.items()
        if key.startswith("metadata[") and key.endswith("]")
    }
    sessions = [s for s in sessions if all(s.metadata.get(k) == v for k, v in wanted.items())]
    missing = "No session found with id '{}'."
    status, document = list_page(sessions, query, FakeSession.snapshot, missing, ordered=True)
    return _Reply(status, _with_raw_json(document))


def _query(scope: Scope) -> dict[str, list[str]]:
    return parse_qs(scope.get("query_string", b"").decode("latin-1"))


def _with_raw_json(document: dict[str, Any]) -> dict[str, Any] | bytes:
    """``document``, or its bytes with each :class:`RawJSON` value spliced in as written."""
    text, spliced = _dumps_raw(document)
    return text.encode() if spliced else document


def _dumps_raw(document: dict[str, Any], **options: Any) -> tuple[str, bool]:
    """``json.dumps(document, **options)`` with each :class:`RawJSON` value spliced in as
    written (the session body and the stream's snapshots alike); whether any was."""
    raws: list[str] = []

    def placeholder(value: object) -> str:
        if not isinstance(value, RawJSON):
            raise TypeError(f"cannot serialise {type(value).__name__}")
        raws.append(value.text)
        return f"\x00raw{len(raws) - 1}\x00"

    text = json.dumps(document, default=placeholder, **options)
    for index, raw in enumerate(raws):
        text = text.replace(json.dumps(f"\x00raw{index}\x00"), raw)
    return text, bool(raws)


def _submit(fake: HTTPHost, session_id: str, key: str | None, body: bytes) -> None:
    """Validate and apply a submission. No ``await``: the check and the update are atomic."""
    events = parse_events_body(body)
    if key is not None:
        previous = fake.idempotency.get(key)
        if previous == (session_id, body):
            return  # a replay of an accepted request: 202, no effect
        if previous is not None:
            raise Rejection(
                409,
                "This Idempotency-Key was already used with a different request.",
                code="idempotency_conflict",
            )
    fake.sessions[session_id].submit(events, key)
    if key is not None:
        fake.idempotency[key] = (session_id, body)


async def _read_body(receive: Receive) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        # Past the limit keep draining but stop storing; the size alone decides the answer.
        if size <= MAX_REQUEST_BYTES + 1:
            chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _send_reply(send: Send, reply: _Reply) -> None:
    if reply.body is None:
        payload = b""
    elif isinstance(reply.body, bytes):
        payload = reply.body
    else:
        payload = json.dumps(reply.body).encode()
    headers = [
        (b"content-length", str(len(payload)).encode()),
        (b"x-request-id", ("req_" + secrets.token_hex(12)).encode()),
    ]
    if payload:
        headers.append((b"content-type", b"application/json"))
    headers.extend((k.encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers.items())
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


async def _drop(send: Send) -> None:
    # Start a response that promises a body, then fail: a server closes the socket
    # mid-response (it cannot send a clean 500 any more); ASGITransport re-raises.
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", b"1024"), (b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": b"{", "more_body": True})
    raise FakeConnectionDropped("fake dropped the connection")


async def _stream(
    fake: HTTPHost, session_id: str, scope: Scope, receive: Receive, send: Send
) -> None:
    """Serve ``GET …/events`` as SSE until the session is idle or failed after a turn
    (then ``data: [DONE]``), or the client leaves."""
    session = fake.sessions[session_id]
    obfuscate = _query(scope).get("include_obfuscation", ["true"])[-1].lower() != "false"
    queue: asyncio.Queue[StreamItem] = asyncio.Queue()
    session.listeners.add(queue)

    async def watch_disconnect() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        queue.put_nowait(None)

    watcher = asyncio.create_task(watch_disconnect())
    try:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"text/event-stream; charset=utf-8"),
                    (b"cache-control", b"no-cache"),
                    (b"x-request-id", ("req_" + secrets.token_hex(12)).encode()),
                ],
            }
        )

        async def chunk(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        await chunk(b": connected\n\n")
        # An idle session's stream stays open, as the API's does: the turn that input
        # started after the subscription streams on it (the SDK's sessions.stream helper
        # subscribes first, then sends its message). It ends with that turn's idle.
        live = True
        while live:
            try:
                event = await asyncio.wait_for(queue.get(), fake.sse_keepalive)
            except TimeoutError:
                await chunk(b": keepalive\n\n")
                continue
            if event is None:
                break
            if event is STREAM_CUT or _cut_before(fake.faults, session_id, event):
                # A connection lost mid-turn: the events from here on never reach this
                # listener (the stream has no resume; it must re-read the session).
                raise FakeConnectionDropped("fake cut the event stream")
            assert isinstance(event, dict)
            if obfuscate:
                event = {**event, "obfuscation": _padding()}
            # Raw arguments travel as written here too: a client reads the same strange
            # values in a streamed snapshot as in the session body.
            data, _ = _dumps_raw(event, separators=(",", ":"))
            # Raw JSON may span lines: each line is its own data field (SSE joins them).
            lines = "".join(f"data: {line}\n" for line in data.split("\n"))
            frame = f"event: {event['type']}\n{lines}\n".encode()
            # A repeat carries the same event_id, as the real stream's rare duplicates do.
            await chunk(frame * 2 if fake.stream_duplicates else frame)
            live = event["type"] not in ("agent.session.idle", "agent.session.failed")
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
    finally:
        session.listeners.discard(queue)
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher


def _cut_before(faults: FaultPlan, session_id: str, event: object) -> bool:
    """Whether a planned cut (``FakeAgentsAPI.cut_streams(before=...)``) hits ``event``."""
    if not isinstance(event, dict):
        return False
    for index, (target, event_type) in enumerate(faults.stream_cuts):
        if target in (None, session_id) and event["type"] == event_type:
            del faults.stream_cuts[index]
            return True
    return False


def _padding() -> str:
    return "".join(random.choices(_ALNUM, k=random.randint(1, 24)))
