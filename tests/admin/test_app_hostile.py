"""Hostile input against the raw ASGI app: whatever the path, query, headers, cookies and
body, the answer is never a 500 and always carries the security headers."""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import MutableMapping
from typing import Any

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentfn_asgi.admin import AdminApp

from .conftest import NOW, TOKEN
from .memory_view import MemoryOperatorView, seed

ROUTES = [
    "",
    "/",
    "/calls",
    "/call",
    "/attention",
    "/deliveries",
    "/settle",
    "/login",
    "/logout",
    "/style.css",
]
FIELDS = ["state", "session", "tool", "since", "limit", "cursor", "id", "content", "all", "refresh"]
FIELDS += ["next", "csrf", "call", "mode", "value", "confirm", "token", "settled"]
EXAMPLES = int(os.environ.get("AGENTFN_FUZZ_EXAMPLES", "200"))

latin1 = st.text(st.characters(max_codepoint=255), max_size=60)
values = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["in_doubt", "quarantined", "15m", "0", "501", "1", "yes", "output", "rerun"]),
    st.sampled_from(["call_refund_91", "sess_8d1f", "call_x_1", "sess_e0c4", "//evil", "NaN"]),
)
encoded = st.dictionaries(st.sampled_from(FIELDS), values, max_size=6).map(
    lambda fields: urllib.parse.urlencode(fields).encode()
)


@st.composite
def requests(draw: st.DrawFn) -> dict[str, Any]:
    root = draw(st.sampled_from(["", "/openai/admin"]))
    route = draw(st.one_of(st.sampled_from(ROUTES), st.text(max_size=30).map(lambda t: "/" + t)))
    headers: list[tuple[bytes, bytes]] = []
    if draw(st.booleans()):
        headers.append((b"authorization", f"Bearer {TOKEN}".encode()))
    elif draw(st.booleans()):
        headers.append((b"authorization", draw(latin1).encode("latin-1")))
    if draw(st.booleans()):
        headers.append((b"cookie", b"agentfn_admin=" + draw(latin1).encode("latin-1")))
    content_type = draw(
        st.sampled_from(
            ["application/x-www-form-urlencoded", "text/plain", "", "multipart/form-data"]
        )
    )
    headers.append((b"content-type", content_type.encode()))
    headers.append((b"accept", draw(st.sampled_from([b"text/html", b"*/*", b""]))))
    return {
        "method": draw(
            st.sampled_from(["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "BREW"])
        ),
        "root_path": root,
        "path": root + route,
        "query_string": draw(st.one_of(encoded, st.binary(max_size=80))),
        "headers": headers,
        "body": draw(st.one_of(encoded, st.binary(max_size=200))),
    }


async def _call(app: AdminApp, request: dict[str, Any]) -> tuple[int, dict[bytes, bytes]]:
    body = request.pop("body")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "scheme": "http",
        "server": ("testserver", 80),
        "client": ("127.0.0.1", 5000),
        **request,
    }
    incoming = [{"type": "http.request", "body": body, "more_body": False}]
    sent: list[MutableMapping[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    await app(scope, receive, send)
    start = sent[0]
    return start["status"], dict(start["headers"])


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(request=requests())
def test_no_request_makes_a_500(request: dict[str, Any]) -> None:
    """Any method, path, query, header, cookie or body: a status below 500 with the CSP."""
    view = MemoryOperatorView()
    seed(view, NOW)
    app = AdminApp(view, tokens=[TOKEN], clock=lambda: NOW)
    status, headers = anyio.run(_call, app, request)
    assert status < 500, (status, request)
    assert b"frame-ancestors 'none'" in headers[b"content-security-policy"]


def test_lifespan_and_websocket_scopes_are_answered() -> None:
    """Served alone, the page completes the lifespan protocol and closes websockets."""
    app = AdminApp(MemoryOperatorView(), tokens=[TOKEN])

    async def run() -> list[str]:
        incoming = [{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}]
        sent: list[str] = []

        async def receive() -> dict[str, Any]:
            return incoming.pop(0)

        async def send(message: MutableMapping[str, Any]) -> None:
            sent.append(message["type"])

        await app({"type": "lifespan"}, receive, send)
        await app({"type": "websocket", "path": "/"}, receive, send)
        return sent

    assert anyio.run(run) == [
        "lifespan.startup.complete",
        "lifespan.shutdown.complete",
        "websocket.close",
    ]


def test_a_raw_non_utf8_query_before_login_is_redirected_not_a_500() -> None:
    """Regression (found by the fuzz test): the login redirect rebuilt the URL through
    Starlette, which decodes the query as UTF-8 and raised on byte 0x80."""
    app = AdminApp(MemoryOperatorView(), tokens=[TOKEN], clock=lambda: NOW)
    request = {
        "method": "GET",
        "root_path": "",
        "path": "/calls",
        "query_string": b"\x80",
        "headers": [(b"accept", b"text/html")],
        "body": b"",
    }
    status, headers = anyio.run(_call, app, request)
    assert status == 303
    assert headers[b"location"] == b"/login?next=%2Fcalls%3F%C2%80"
