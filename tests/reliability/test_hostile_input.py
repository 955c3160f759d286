"""Hostile input (issue 8): oversized and slow bodies, deep JSON, huge numbers, replays.

The property-based fuzz of the endpoint lives in ``tests/test_fuzz_webhook.py``; these are
the targeted cases, partly against a real uvicorn server over raw sockets, where the
framing (chunked bodies, dribbling senders) is real.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import anyio.abc
import pytest
from starlette.types import Message

from agentfn_asgi.app import AgentWebhookApp
from agentfn_asgi.client import AgentsClient
from agentfn_asgi.testing import (
    FakeCall,
    action_required_event,
    serve_app,
    signed_delivery,
)
from agentfn_asgi.tools import FunctionTools

from ..support.stack import SECRET
from .stacks import fault_stack

pytestmark = [pytest.mark.anyio, pytest.mark.reliability]

CAP = 1024 * 1024
CHUNK = 64 * 1024


def offline_app(**options: Any) -> AgentWebhookApp:
    """An app whose API is unreachable: enough for everything decided before dispatch."""
    client = AgentsClient(api_key="sk-offline", base_url="http://127.0.0.1:9/v1", max_retries=0)
    return AgentWebhookApp(
        FunctionTools(), webhook_secret=SECRET, client=client, store="memory://", **options
    )


class Exchange:
    """Drives one ASGI request by hand and keeps what the app sent and how much it read."""

    def __init__(self, chunks: AsyncIterator[bytes] | None, headers: list[tuple[bytes, bytes]]):
        self.chunks = chunks
        self.headers = headers
        self.reads = 0
        self.sent: list[Message] = []

    async def receive(self) -> Message:
        self.reads += 1
        if self.chunks is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        return {"type": "http.request", "body": await anext(self.chunks), "more_body": True}

    async def send(self, message: Message) -> None:
        self.sent.append(message)

    async def run(self, app: AgentWebhookApp) -> int:
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/",
            "root_path": "",
            "headers": self.headers,
        }
        await app(scope, self.receive, self.send)
        [start] = [m for m in self.sent if m["type"] == "http.response.start"]
        status: int = start["status"]
        return status


async def endless() -> AsyncIterator[bytes]:
    while True:
        yield b"x" * CHUNK


async def test_a_streamed_oversized_body_is_cut_off_at_the_cap() -> None:
    """No content-length, 64 KiB chunks forever: 413 once past 1 MiB, and reading stops."""
    exchange = Exchange(endless(), [(b"content-type", b"application/json")])
    with anyio.fail_after(5):
        status = await exchange.run(offline_app())
    assert status == 413
    assert exchange.reads == CAP // CHUNK + 1


async def test_a_declared_oversized_body_is_refused_unread() -> None:
    """A content-length over the cap is answered 413 before a single body chunk is read."""
    exchange = Exchange(endless(), [(b"content-length", str(CAP + 1).encode())])
    assert await exchange.run(offline_app()) == 413
    assert exchange.reads == 0


async def _read_status(stream: anyio.abc.ByteStream) -> int:
    data = b""
    while b"\r\n" not in data:
        data += await stream.receive()
    return int(data.split(b" ", 2)[1])


async def test_a_chunked_oversized_body_gets_413_from_uvicorn() -> None:
    """Over a real socket with ``Transfer-Encoding: chunked``: 413 arrives while the sender
    is still sending, so the server never buffered more than the cap."""
    async with serve_app(offline_app()) as root:
        port = int(root.rsplit(":", 1)[1])
        stream = await anyio.connect_tcp("127.0.0.1", port)
        async with stream:
            await stream.send(
                b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
                b"Content-Type: application/json\r\n\r\n"
            )
            sent = 0

            async def sender() -> None:
                nonlocal sent
                # 8 MiB at most: far past the cap, bounded if the server misbehaved. The
                # server may close the connection under us once it has answered.
                with contextlib.suppress(anyio.BrokenResourceError, OSError):
                    while sent < 8 * CAP:
                        await stream.send(b"%x\r\n" % CHUNK + b"x" * CHUNK + b"\r\n")
                        sent += CHUNK

            async with anyio.create_task_group() as group:
                group.start_soon(sender)
                with anyio.fail_after(5):
                    status = await _read_status(stream)
                answered_after = sent
                group.cancel_scope.cancel()
    assert status == 413
    # The answer came while the body was still streaming: it did not wait for the end.
    assert answered_after < 8 * CAP


@pytest.mark.exclusive
async def test_a_slow_sender_is_timed_out_by_uvicorn() -> None:
    """Headers, then one body byte every 0.1 s: 408 after ``body_timeout`` (0.5 s)."""
    async with serve_app(offline_app(body_timeout=0.5)) as root:
        port = int(root.rsplit(":", 1)[1])
        async with await anyio.connect_tcp("127.0.0.1", port) as stream:
            await stream.send(
                b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 1000\r\n"
                b"Content-Type: application/json\r\n\r\n"
            )
            began = time.monotonic()

            async def dribble() -> None:
                for _ in range(100):
                    await stream.send(b" ")
                    await anyio.sleep(0.1)

            async with anyio.create_task_group() as group:
                group.start_soon(dribble)
                with anyio.fail_after(5):
                    status = await _read_status(stream)
                group.cancel_scope.cancel()
            elapsed = time.monotonic() - began
    assert status == 408
    assert 0.45 <= elapsed < 2.0


def _envelope(data_suffix: bytes, created_at: bytes = b"1") -> bytes:
    return (
        b'{"id":"evt_1","object":"event","created_at":'
        + created_at
        + b',"type":"agent.session.action_required","data":{"id":"sess_hostile"'
        + data_suffix
        + b"}}"
    )


@pytest.mark.exclusive
@pytest.mark.parametrize(
    ("label", "body"),
    [
        ("100k nested lists", _envelope(b',"deep":' + b"[" * 100_000 + b"]" * 100_000)),
        ("100k nested objects", _envelope(b',"deep":' + b'{"a":' * 100_000 + b"}" * 100_000)),
        ("a 10^6-digit number in data", _envelope(b',"n":' + b"9" * 1_000_000)),
        ("a 10^6-digit created_at", _envelope(b"", created_at=b"9" * 1_000_000)),
        ("an overflowing float", _envelope(b',"n":1e999999999')),
    ],
)
async def test_signed_pathological_json_is_answered_quickly(label: str, body: bytes) -> None:
    """Signed (so it passes verification) but pathological JSON: a deliberate 400 (or 200 for
    what parses), under a second, and the app keeps serving."""
    assert len(body) <= CAP, label
    async with fault_stack(FunctionTools(), webhooks=False) as stack:
        signed, headers = signed_delivery(SECRET, body)
        began = time.monotonic()
        answer = await stack.post_webhook(signed, headers)
        elapsed = time.monotonic() - began
        health = await stack.webhook_http.get("http://app.test/openai/webhooks/healthz")
    assert answer.status_code in (200, 400), answer.text
    assert elapsed < 1.0
    assert health.status_code == 200


async def test_replays_outside_the_tolerance_are_refused() -> None:
    """A delivery replayed within the tolerance is a duplicate (runs nothing new); the same
    bytes replayed after the 300 s window, or stamped too far ahead, are refused with 401."""
    now = [time.time()]
    runs: list[str] = []
    tools = FunctionTools()

    @tools.function
    def lookup(order_id: str) -> str:
        """Look an order up."""
        runs.append(order_id)
        return "ok"

    async with fault_stack(tools, webhooks=False, clock=lambda: now[0]) as stack:
        sid = stack.fake.create_session([[FakeCall("lookup", {"order_id": "o1"})]])
        body, headers = signed_delivery(SECRET, action_required_event(sid), timestamp=int(now[0]))
        first = await stack.post_webhook(body, headers)
        await stack.fake.wait_idle(sid, timeout=5)
        again = await stack.post_webhook(body, headers)
        now[0] += 301
        late = await stack.post_webhook(body, headers)
        ahead_body, ahead = signed_delivery(
            SECRET, action_required_event(sid), timestamp=int(now[0]) + 301
        )
        early = await stack.post_webhook(ahead_body, ahead)
        stats = await stack.store.stats()
    assert (first.json()["status"], again.json()["status"]) == ("accepted", "duplicate")
    assert (late.status_code, early.status_code) == (401, 401)
    assert stats.deliveries == 1
    assert runs == ["o1"]


async def test_error_answers_never_echo_the_input() -> None:
    """400/401 bodies are fixed texts: nothing of the (attacker-chosen) body or headers."""
    marker = "MARKER-7f3a"
    body = json.dumps({"id": marker, "type": marker}).encode()
    async with fault_stack(FunctionTools(), webhooks=False) as stack:
        signed, headers = signed_delivery(SECRET, body, msg_id="msg_" + marker)
        bad_envelope = await stack.post_webhook(signed, headers)
        forged = await stack.post_webhook(body, dict(headers, **{"webhook-signature": marker}))
        unsigned = await stack.post_webhook(body, {"webhook-id": marker})
    assert [a.status_code for a in (bad_envelope, forged, unsigned)] == [400, 401, 400]
    for answer in (bad_envelope, forged, unsigned):
        assert marker not in answer.text


@pytest.mark.parametrize("session_id", ["a/b", "..", "sess?x=1", "sess#frag"])
async def test_an_authentic_delivery_with_an_unusable_session_id_is_settled(
    session_id: str,
) -> None:
    """A signed delivery whose ``data.id`` cannot be a session id in a URL path is refused
    (400) or read under exactly that id, and never left for the sweep to retry forever."""
    async with fault_stack(FunctionTools(), webhooks=False) as stack:
        body, headers = signed_delivery(SECRET, action_required_event(session_id))
        answer = await stack.post_webhook(body, headers)
        await anyio.sleep(0.6)  # three sweeps
        stats = await stack.store.stats()
    assert answer.status_code in (200, 400)
    assert stats.unresolved_deliveries == 0
    for request in stack.fake.requests:
        assert request.path == f"/v1/agents/sessions/{session_id}", request.path


@pytest.mark.parametrize("name", ["webhook-id", "webhook-timestamp", "webhook-signature"])
async def test_a_repeated_webhook_header_is_refused(name: str) -> None:
    """A signed delivery with one of its ``webhook-*`` headers sent twice (the signed copy
    last) is refused with 400: the span, the log and the verifier must not each read a
    different copy. Nothing is recorded or run."""
    async with fault_stack(FunctionTools(), webhooks=False) as stack:
        sid = stack.fake.create_session([])
        body, headers = signed_delivery(SECRET, action_required_event(sid))
        repeated = [(name, "msg_other" if name == "webhook-id" else "1"), *headers.items()]
        answer = await stack.webhook_http.post(stack.webhook_url, content=body, headers=repeated)
        stats = await stack.store.stats()
    assert answer.status_code == 400
    assert name in answer.json()["error"]
    assert stats.unresolved_deliveries == 0 and stack.fake.requests == []
