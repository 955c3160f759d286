"""Property-based fuzz of the webhook endpoint (issue 8, hostile input).

Random and mutated methods, headers, bodies, encodings, sizes, chunkings, timestamps and
signatures are fed to the real ``AgentWebhookApp`` as raw ASGI requests (raw header bytes,
any chunking: more than an HTTP client would let through). For every input:

- the answer is a deliberate 200/400/401/405/413, never a 5xx;
- anything not authentic (unsigned, mis-signed, stale, re-signed with another secret) is
  refused with 4xx and leaves the store unchanged (no delivery recorded);
- no handler ever runs: the one session with a pending call (``sess_fuzz``) is only named
  by forgeries, and authentic deliveries name sessions that do not exist.

``AGENTFN_FUZZ_EXAMPLES`` sets the number of examples (200 by default, 5000 in
``make fuzz-long``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.from_thread
import httpx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from starlette.types import Message

from agentfn_asgi.app import AgentWebhookApp
from agentfn_asgi.client import AgentsClient
from agentfn_asgi.dispatch import DispatchSettings
from agentfn_asgi.errors import WebhookVerificationError
from agentfn_asgi.signing import WebhookVerifier, signed_headers
from agentfn_asgi.store import Store, open_store
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall, action_required_event, webhook_event
from agentfn_asgi.tools import FunctionTools

pytestmark = pytest.mark.reliability

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
OTHER_SECRET = "whsec_dGhpcyBpcyBub3QgdGhlIHJpZ2h0IHNlY3JldA=="
API_KEY = "sk-fuzz"
NOW = 1_750_000_000  # the app's clock is frozen here: timestamps are exact
CAP = 4096  # a small max_body_size so oversized bodies are cheap to generate
TARGET = "sess_fuzz"  # the only session with a pending call; named only by forgeries
EXAMPLES = int(os.environ.get("AGENTFN_FUZZ_EXAMPLES", "200"))
ALLOWED = {200, 400, 401, 405, 413}

Headers = list[tuple[bytes, bytes]]


@dataclass
class Harness:
    """The app under test, its fake API and store, living on a portal's event loop."""

    app: AgentWebhookApp
    fake: FakeAgentsAPI
    store: Store
    http: httpx.AsyncClient
    runs: list[str] = field(default_factory=list)

    @classmethod
    async def create(cls) -> Harness:
        runs: list[str] = []
        tools = FunctionTools()

        @tools.function
        def lookup(order_id: str) -> str:
            """Must never run during the fuzz."""
            runs.append(order_id)
            return "ran"

        fake = FakeAgentsAPI(api_key=API_KEY, webhook_secret=SECRET)
        fake.create_session(
            [[FakeCall("lookup", {"order_id": "o1"}, call_id="c1")]], session_id=TARGET
        )
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=fake))
        client = AgentsClient(
            api_key=API_KEY, base_url="http://fake.test/v1", http_client=http, max_retries=0
        )
        store = open_store("memory://", clock=lambda: NOW)
        app = AgentWebhookApp(
            tools,
            webhook_secret=SECRET,
            client=client,
            store=store,
            max_body_size=CAP,
            clock=lambda: NOW,
            settings=DispatchSettings(recovery_interval=0.2, recovery_grace=0.0),
        )
        await app.startup()
        return cls(app, fake, store, http, runs)

    async def request(self, method: str, headers: Headers, chunks: list[bytes]) -> int:
        """One raw ASGI request; the response status."""
        messages = [
            {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
            for i, chunk in enumerate(chunks)
        ] or [{"type": "http.request", "body": b"", "more_body": False}]
        sent: list[Message] = []

        async def receive() -> Message:
            return messages.pop(0) if messages else {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            sent.append(message)

        scope = {"type": "http", "method": method, "path": "/", "root_path": "", "headers": headers}
        with anyio.fail_after(5):
            await self.app(scope, receive, send)
        [start] = [m for m in sent if m["type"] == "http.response.start"]
        status: int = start["status"]
        return status

    async def deliveries(self) -> int:
        return (await self.store.stats()).deliveries

    async def close(self) -> None:
        await self.app.shutdown()
        await self.http.aclose()
        await self.fake.aclose()


# -- strategies ------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _dump(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


@st.composite
def bodies(draw: st.DrawFn, session_id: str) -> bytes:
    """A body: garbage, any JSON, an envelope (of any type, in any encoding), or oversized."""
    kind = draw(st.sampled_from(["bytes", "json", "envelope", "odd_envelope", "encoded", "big"]))
    event = action_required_event(session_id, event_id="evt_fuzz", created_at=NOW)
    if kind == "bytes":
        return draw(st.binary(max_size=300))
    if kind == "json":
        return _dump(draw(json_values))
    if kind == "envelope":
        return _dump(event)
    if kind == "odd_envelope":
        data = draw(st.dictionaries(st.text(max_size=8), json_values, max_size=3))
        data["id"] = draw(st.sampled_from([session_id, 7, None, "", [session_id]]))
        kind_of = draw(
            st.sampled_from(["agent.session.action_required", "agent.session.idle", "x"])
        )
        return _dump(webhook_event(kind_of, data, created_at=draw(st.integers())))
    if kind == "encoded":
        codec = draw(st.sampled_from(["utf-16", "utf-16-be", "utf-32", "utf-8-sig", "latin-1"]))
        text = json.dumps({**event, "note": draw(st.text(max_size=20))}, ensure_ascii=False)
        return text.encode(codec, errors="replace")
    return _dump(event) + b" " * draw(st.integers(CAP - 100, CAP + 2000))


def _mutate(draw: st.DrawFn, raw: bytes) -> bytes:
    if not raw:
        return draw(st.binary(min_size=1, max_size=8))
    at = draw(st.integers(0, len(raw) - 1))
    op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
    if op == "flip":
        return raw[:at] + bytes([raw[at] ^ draw(st.integers(1, 255))]) + raw[at + 1 :]
    if op == "insert":
        return raw[:at] + draw(st.binary(min_size=1, max_size=4)) + raw[at:]
    if op == "delete":
        return raw[:at] + raw[at + 1 :]
    return raw[:at]


header_bytes = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=40).map(lambda t: t.encode("utf-8")),
    st.sampled_from([b"", b" ", b"v1,", b"v1,AAAA", b"v2,abc", b"0", b"-1", b"1e9", b"9" * 30]),
)
header_names = st.sampled_from(
    [
        b"webhook-id",
        b"webhook-timestamp",
        b"webhook-signature",
        b"content-type",
        b"content-length",
        b"svix-id",
        b"x-junk",
    ]
)


@dataclass(frozen=True)
class Delivery:
    method: str
    headers: Headers
    body: bytes
    chunks: list[bytes]
    forged: bool  # built to name TARGET without a valid signature


@st.composite
def deliveries(draw: st.DrawFn) -> Delivery:
    """A request to the endpoint; see the module docstring."""
    authentic_wanted = draw(st.booleans())
    # Only forgeries may name the session whose call is pending.
    session_id = "sess_absent" if authentic_wanted else TARGET
    body = draw(bodies(session_id))
    msg_id = "msg_" + draw(st.text("abcdef0123456789", min_size=1, max_size=12))
    headers = signed_headers(SECRET, body, msg_id=msg_id, timestamp=NOW)
    raw: dict[bytes, bytes] = {k.encode(): v.encode() for k, v in headers.items()}
    if not authentic_wanted:
        attack = draw(
            st.sampled_from(
                ["unsigned", "random", "body", "signature", "timestamp", "id", "secret", "drop"]
            )
        )
        if attack == "unsigned":
            raw = {}
        elif attack == "random":
            raw = dict(draw(st.lists(st.tuples(header_names, header_bytes), max_size=6)))
        elif attack == "body":
            body = _mutate(draw, body)
        elif attack == "signature":
            raw[b"webhook-signature"] = _mutate(draw, raw[b"webhook-signature"])
        elif attack == "timestamp":
            offset = draw(st.sampled_from([301, -301, 10**6, -(10**6)]) | st.integers())
            raw[b"webhook-timestamp"] = str(max(NOW + offset, 0)).encode()
        elif attack == "id":
            raw[b"webhook-id"] = _mutate(draw, raw[b"webhook-id"])
        elif attack == "secret":
            raw.update(
                (k.encode(), v.encode())
                for k, v in signed_headers(OTHER_SECRET, body, msg_id=msg_id, timestamp=NOW).items()
            )
        else:
            del raw[draw(st.sampled_from(sorted(raw)))]
    extra = draw(st.lists(st.tuples(header_names, header_bytes), max_size=2))
    header_list = list(raw.items())
    if not authentic_wanted:
        header_list += extra  # extra copies may override signed values: still a forgery
    else:
        header_list += [(k, v) for k, v in extra if not k.startswith(b"webhook-")]
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=4)))
    chunks = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    method = draw(st.sampled_from(["POST"] * 8 + ["GET", "PUT", "DELETE", "PATCH", "HEAD"]))
    return Delivery(method, header_list, body, chunks, forged=not authentic_wanted)


def authentic(delivery: Delivery) -> bool:
    """Whether the app would accept the signature: the same header view, verified apart."""
    view = {k.decode("latin-1"): v.decode("latin-1") for k, v in delivery.headers}
    try:
        WebhookVerifier(SECRET, clock=lambda: NOW).verify(delivery.body, view)
    except WebhookVerificationError:
        return False
    return True


# -- the property ------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_endpoint_answers_every_input_deliberately() -> None:
    """Any method, headers, body and chunking: 200/400/401/405/413 only; forgeries are
    refused, record nothing, and no handler runs (see the module docstring)."""
    with anyio.from_thread.start_blocking_portal(backend="asyncio") as portal:
        harness = portal.call(Harness.create)

        def call(fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
            return portal.call(fn, *args)

        seen: set[tuple[int, bool]] = set()
        try:

            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            )
            @given(delivery=deliveries())
            def check(delivery: Delivery) -> None:
                is_authentic = authentic(delivery)
                if delivery.forged:
                    assume(not is_authentic)  # a mutation that happened to change nothing
                before = call(harness.deliveries)
                status = call(harness.request, delivery.method, delivery.headers, delivery.chunks)
                assert status in ALLOWED, status
                after = call(harness.deliveries)
                if delivery.method != "POST":
                    assert status == 405
                elif status == 413:
                    oversized = len(delivery.body) > CAP
                    assert oversized or any(k == b"content-length" for k, _ in delivery.headers)
                elif not is_authentic:
                    assert status in (400, 401)
                if not (is_authentic and status == 200):
                    assert after == before
                seen.add((status, is_authentic))

            check()
            if EXAMPLES >= 100:
                # The strategies reach every answer, for forgeries and authentic input alike.
                assert {(200, True), (400, True), (400, False), (401, False)} <= seen, seen
                assert {405, 413} <= {status for status, _ in seen}, seen
            portal.call(anyio.sleep, 0.3)  # anything scheduled would have run by now
            assert harness.runs == []
            assert harness.fake.submissions == []
            assert len(harness.fake.required_actions(TARGET)) == 1
            assert portal.call(harness.store.calls_for_session, TARGET) == []
        finally:
            portal.call(harness.close)
