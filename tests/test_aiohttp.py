"""The client the package builds on aiohttp (``agentfn_asgi._aiohttp``), over real loopback
against the fake Agents API: the same requests, answers and errors as on httpx."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from agentfn_asgi._aiohttp import AiohttpClient
from agentfn_asgi.client import AgentsClient
from agentfn_asgi.errors import APIConnectionError, APITimeoutError, NotFoundError, RateLimitError
from agentfn_asgi.session_events import SessionIdleEvent
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall, serve_fake

from .support.ports import free_port

pytestmark = pytest.mark.anyio


async def _no_sleep(_: float) -> None:
    return None


@pytest.fixture
async def served() -> AsyncIterator[tuple[FakeAgentsAPI, str]]:
    fake = FakeAgentsAPI()
    async with serve_fake(fake) as base_url:
        yield fake, base_url


def _session(fake: FakeAgentsAPI) -> tuple[str, dict[str, Any]]:
    sid = fake.create_session([[FakeCall("lookup", {"id": 1})]])
    action = fake.required_actions(sid)[0]
    event = {
        "type": "agent.session.input.tool_result",
        "turn_id": action["turn_id"],
        "call_id": action["call_id"],
        "success": True,
        "output": "found",
    }
    return sid, event


async def test_the_owned_client_is_the_aiohttp_one() -> None:
    """With aiohttp installed (extra ``fast``), the client the package builds uses it."""
    async with AgentsClient(api_key="k") as client:
        assert isinstance(client._http, AiohttpClient)
    assert client._http.is_closed


async def test_read_submit_and_stream_over_loopback(served: tuple[FakeAgentsAPI, str]) -> None:
    """A session read, a submission (headers and body byte for byte) and a stream."""
    fake, base_url = served
    sid, event = _session(fake)
    async with AgentsClient(api_key="sk-test", base_url=base_url) as client:
        session = await client.retrieve_session(sid)
        assert [c.name for c in session.function_calls] == ["lookup"]
        headers = fake.requests[-1].headers
        assert headers["authorization"] == "Bearer sk-test"
        assert headers["openai-beta"] == "agents=v1"
        assert headers["user-agent"].startswith("agentfn-asgi/")
        listener = asyncio.create_task(_collect(client, sid))
        while not fake.sessions[sid].listeners:
            await asyncio.sleep(0.001)
        await client.submit_events(sid, [event], idempotency_key="k1")
        events = await asyncio.wait_for(listener, 10)
    submit = next(r for r in fake.requests if r.route == "submit")
    assert submit.headers["idempotency-key"] == "k1"
    assert submit.headers["content-type"] == "application/json"
    assert isinstance(events[-1], SessionIdleEvent)


async def _collect(client: AgentsClient, sid: str) -> list[Any]:
    return [e async for e in client.stream_events(sid, include_obfuscation=False)]


async def test_error_answers_are_mapped_and_retried(served: tuple[FakeAgentsAPI, str]) -> None:
    """A 429 with Retry-After is retried then raised as ours; a 404 is NotFoundError."""
    fake, base_url = served
    sid, _ = _session(fake)
    fake.fail_next("retrieve", 2, 429, retry_after=0)
    async with AgentsClient(
        api_key="sk-test", base_url=base_url, max_retries=1, sleep=_no_sleep
    ) as client:
        with pytest.raises(RateLimitError):
            await client.retrieve_session(sid)
        with pytest.raises(NotFoundError):
            await client.retrieve_session("sess_missing")


async def test_a_refused_connection_is_retried_then_a_connection_error() -> None:
    """aiohttp's connector error becomes httpx's class, then our APIConnectionError."""
    port = free_port()  # nothing listens there
    retries: list[str] = []
    async with AgentsClient(
        api_key="k",
        base_url=f"http://127.0.0.1:{port}/v1",
        max_retries=1,
        sleep=_no_sleep,
        on_retry=lambda event: retries.append(event.reason),
    ) as client:
        with pytest.raises(APIConnectionError):
            await client.retrieve_session("sess_1")
    assert retries == ["connection"]


async def test_a_slow_answer_is_a_timeout_of_httpx_class() -> None:
    """The read timeout maps to ``httpx.TimeoutException`` (the retry policy's timeout)."""

    writers: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)  # reads nothing, answers nothing

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    http = AiohttpClient(timeout=httpx.Timeout(0.1), max_connections=4)
    try:
        request = http.build_request("GET", f"http://127.0.0.1:{port}/x", params={"a": "b c"})
        assert request.url.endswith("/x?a=b+c")
        with pytest.raises(httpx.TimeoutException):
            await http.send(request)
    finally:
        await http.aclose()
        for writer in writers:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_a_large_body_arrives_whole_with_its_length(
    served: tuple[FakeAgentsAPI, str],
) -> None:
    """A body over a MiB goes out slice by slice (no joined copy) under a Content-Length,
    and arrives byte for byte."""
    from agentfn_asgi.results import event_json, events_body

    fake, base_url = served
    sid, event = _session(fake)
    text = event_json({**event, "output": "r" * (3 * 1024 * 1024)})
    body = events_body(text)
    async with AgentsClient(api_key="sk-test", base_url=base_url) as client:
        await client.submit_raw_events(sid, body, idempotency_key="big")
    submit = next(r for r in fake.requests if r.route == "submit")
    assert submit.headers["content-length"] == str(len(body))
    assert "transfer-encoding" not in submit.headers
    assert fake.idempotency["big"] == (sid, bytes(body))


async def test_a_body_nobody_reads_is_a_write_timeout_and_retried() -> None:
    """A peer that takes the request head and then stops reading (a dropped path mid-
    upload): each slice of a large body must be taken within ``timeout.write``, so the
    attempt ends in httpx's ``WriteTimeout`` and is retried, as on httpx, instead of
    hanging until the whole deadline (aiohttp has no write timeout of its own)."""

    held: list[asyncio.StreamWriter] = []

    async def stop_reading(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        await reader.readuntil(b"\r\n\r\n")  # the head; the body is never read

    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)  # fills fast
    listener.bind(("127.0.0.1", 0))
    server = await asyncio.start_server(stop_reading, sock=listener)
    port = listener.getsockname()[1]
    retries: list[str] = []
    body = bytearray(b"x" * (32 * 1024 * 1024))  # more than every buffer on the way
    try:
        async with AgentsClient(
            api_key="k",
            base_url=f"http://127.0.0.1:{port}/v1",
            timeout=httpx.Timeout(30.0, write=0.3),
            max_retries=1,
            sleep=_no_sleep,
            on_retry=lambda event: retries.append(event.reason),
        ) as client:
            with pytest.raises(APITimeoutError):
                await asyncio.wait_for(
                    client.submit_raw_events("sess_1", body, idempotency_key="k1"), 10
                )
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()
    assert retries == ["timeout"]
    assert len(held) == 2  # the retry went out on a new connection


async def test_behind_a_proxy_the_owned_client_is_httpx_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A proxy named by the environment (``HTTPS_PROXY``, ``ALL_PROXY``...) is honoured as
    httpx and the ``openai`` SDK read it: the package builds an httpx client then. A lone
    ``NO_PROXY`` names no proxy; the aiohttp client never reads the environment."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    monkeypatch.setenv("NO_PROXY", "internal.example")
    async with AgentsClient(api_key="k") as client:
        assert isinstance(client._http, AiohttpClient)
    for name, proxy in (("ALL_PROXY", "http://127.0.0.1:1"), ("HTTPS_PROXY", "https://p:1")):
        monkeypatch.setenv(name, proxy)
        async with AgentsClient(api_key="k") as client:
            assert not isinstance(client._http, AiohttpClient), name
        monkeypatch.delenv(name)


async def test_requests_go_through_the_proxy_the_environment_names(
    served: tuple[FakeAgentsAPI, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``HTTP_PROXY`` set: the session read reaches the API through that proxy."""
    fake, base_url = served
    sid, _ = _session(fake)
    seen: list[bytes] = []
    opened: list[asyncio.StreamWriter] = []

    async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        opened.append(writer)
        head = await reader.readuntil(b"\r\n\r\n")
        seen.append(head.split(b"\r\n", 1)[0])
        method, target, rest = head.split(b" ", 2)
        url = httpx.URL(target.decode())  # absolute-form, as a client asks a proxy
        up_reader, up_writer = await asyncio.open_connection(url.host, url.port)
        opened.append(up_writer)
        up_writer.write(b" ".join([method, url.raw_path, rest]))
        await up_writer.drain()
        while chunk := await up_reader.read(1 << 16):
            writer.write(chunk)
            await writer.drain()
        up_writer.close()
        writer.close()

    proxy = await asyncio.start_server(forward, "127.0.0.1", 0)
    proxy_port = proxy.sockets[0].getsockname()[1]
    for name in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy_port}")
    try:
        async with AgentsClient(api_key="sk-test", base_url=base_url) as client:
            session = await client.retrieve_session(sid)
    finally:
        for writer in opened:  # kept alive by both ends: closed here
            writer.close()
        proxy.close()
        await proxy.wait_closed()
    assert session.id == sid
    assert seen == [f"GET {base_url}/agents/sessions/{sid} HTTP/1.1".encode()]


async def _raw_server(chunks: list[bytes]) -> tuple[asyncio.Server, int]:
    """A server that answers any request with ``chunks`` written apart (a pause between)."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        for n, chunk in enumerate(chunks):
            if n:
                await asyncio.sleep(0.05)
            writer.write(chunk)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_lines_split_between_a_cr_and_its_lf_are_one_line_ending() -> None:
    """A stream whose ``\\r\\n`` arrives in two pieces gives the lines httpx gives, not an
    extra empty line (which would end a server-sent event early)."""
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    pieces = [b"data: a\r", b"\ndata: b\r\n\r\n", b"data: c\r"]
    framed = [b"%x\r\n%s\r\n" % (len(p), p) for p in pieces]
    server, port = await _raw_server([head + framed[0], framed[1], framed[2] + b"0\r\n\r\n"])
    http = AiohttpClient(timeout=httpx.Timeout(5.0), max_connections=4)
    try:
        response = await http.send(
            http.build_request("GET", f"http://127.0.0.1:{port}/s"), stream=True
        )
        lines = [line async for line in response.aiter_lines()]
        await response.aclose()
    finally:
        await http.aclose()
        server.close()
        await server.wait_closed()
    assert lines == ["data: a", "data: b", "", "data: c"]
