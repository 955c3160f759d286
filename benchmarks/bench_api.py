"""A lean stand-in for the Agents API, built so it is never the bottleneck of a benchmark.

``FakeAgentsAPI`` (the public test kit) validates every request and keeps full histories;
that is right for tests and too slow to measure against. This one is a plain
:class:`asyncio.Protocol` HTTP/1.1 server (no ASGI, no h11) that answers exactly two routes:

- ``GET /v1/agents/sessions/{id}``: the session with its pending ``function_call`` actions;
- ``POST /v1/agents/sessions/{id}/events``: accepts ``tool_result`` events with 202.

It lives in the driver's process, so the driver learns the instant a result is accepted
(an in-process future, no polling). Correctness counters:

- a call is *accepted* once, on its first submission;
- a later submission with the same ``Idempotency-Key`` is a harmless replay (202);
- a later submission with another key, or none, is a *duplicate* (counted, answered with the
  real API's 400 "Unknown pending tool call").

``latency`` delays every answer (``loop.call_later``, no task per request) to simulate a
remote API.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["BenchAPI", "CallId", "ServerStats"]

CallId = tuple[str, str]  # (session_id, call_id)

_REASONS = {200: b"OK", 202: b"Accepted", 400: b"Bad Request", 404: b"Not Found"}
_MAX_HEAD = 64 * 1024


@dataclass(slots=True)
class _Session:
    session_id: str
    actions: dict[str, dict[str, Any]]  # call_id -> the function_call action, while pending
    cached: bytes | None = None

    def body(self) -> bytes:
        if self.cached is None:
            pending = list(self.actions.values())
            self.cached = json.dumps(
                {
                    "id": self.session_id,
                    "object": "agent.session",
                    "status": "requires_action" if pending else "idle",
                    "required_actions": pending,
                    "metadata": {},
                    "created_at": int(time.time()),
                    "agent": {"id": "agent_bench", "model": "gpt-bench", "tools": []},
                },
                separators=(",", ":"),
            ).encode()
        return self.cached


@dataclass(slots=True)
class ServerStats:
    """Counters since the last :meth:`BenchAPI.reset_stats`."""

    gets: int = 0
    posts: int = 0
    accepted: int = 0
    replays: int = 0
    duplicates: int = 0
    unknown: int = 0
    bytes_in: int = 0
    per_call_submissions: dict[CallId, int] = field(default_factory=dict)


class BenchAPI:
    """Sessions in memory, answered over loopback; see the module docstring."""

    def __init__(self, *, latency: float = 0.0) -> None:
        self.latency = latency
        self.sessions: dict[str, _Session] = {}
        self.accepted_at: dict[CallId, float] = {}
        self._keys: dict[CallId, str | None] = {}
        self._waiters: dict[CallId, asyncio.Future[float]] = {}
        self.stats = ServerStats()
        self._server: asyncio.Server | None = None
        self._transports: set[asyncio.Transport] = set()
        self.port = 0

    # -- driver side ------------------------------------------------------------------------
    def create_session(self, calls: list[tuple[str, dict[str, Any]]]) -> tuple[str, list[CallId]]:
        """A session requiring one ``function_call`` per ``(name, arguments)``; returns ids.

        A future per call is created at once, so the driver can await each result.
        """
        session_id = "sess_" + secrets.token_hex(10)
        turn_id = "turn_" + secrets.token_hex(6)
        actions: dict[str, dict[str, Any]] = {}
        ids: list[CallId] = []
        loop = asyncio.get_running_loop()
        for name, arguments in calls:
            call_id = "call_" + secrets.token_hex(8)
            actions[call_id] = {
                "type": "function_call",
                "turn_id": turn_id,
                "call_id": call_id,
                "name": name,
                "arguments": arguments,
            }
            ids.append((session_id, call_id))
            self._waiters[(session_id, call_id)] = loop.create_future()
        self.sessions[session_id] = _Session(session_id, actions)
        return session_id, ids

    def result_future(self, call: CallId) -> asyncio.Future[float]:
        """Resolves with the ``time.perf_counter()`` at which the call's result was accepted."""
        return self._waiters[call]

    def forget(self, calls: list[CallId]) -> None:
        """Drop bookkeeping of finished calls (keeps memory flat across long runs)."""
        for call in calls:
            self._waiters.pop(call, None)
            self._keys.pop(call, None)
            self.accepted_at.pop(call, None)
            self.stats.per_call_submissions.pop(call, None)
            self.sessions.pop(call[0], None)

    def reset_stats(self) -> ServerStats:
        """Return the counters so far and start new ones."""
        stats, self.stats = self.stats, ServerStats()
        return stats

    # -- server -----------------------------------------------------------------------------
    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on loopback; returns the base URL ``http://host:port/v1``."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Protocol(self), host, port, backlog=2048, reuse_address=True
        )
        self.port = self._server.sockets[0].getsockname()[1]
        return f"http://{host}:{self.port}/v1"

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for transport in list(self._transports):
                transport.close()
            await self._server.wait_closed()
            self._server = None

    def handle(
        self,
        method: str,
        target: str,
        headers: dict[str, str],
        body: bytes,
        respond: Callable[[int, bytes], None],
    ) -> None:
        path = target.partition("?")[0]
        parts = path.split("/")  # ["", "v1", "agents", "sessions", id, ("events")]
        if len(parts) < 5 or parts[1] != "v1" or parts[2] != "agents" or parts[3] != "sessions":
            respond(404, _error("not found", "not_found"))
            return
        session = self.sessions.get(parts[4])
        if session is None:
            respond(404, _error("No session found", "not_found"))
            return
        if method == "GET" and len(parts) == 5:
            self.stats.gets += 1
            respond(200, session.body())
        elif method == "POST" and len(parts) == 6 and parts[5] == "events":
            self.stats.posts += 1
            self.stats.bytes_in += len(body)
            self._events(session, headers.get("idempotency-key"), body, respond)
        else:
            respond(404, _error("not found", "not_found"))

    def _events(
        self,
        session: _Session,
        key: str | None,
        body: bytes,
        respond: Callable[[int, bytes], None],
    ) -> None:
        try:
            events = json.loads(body)["events"]
        except (ValueError, KeyError, TypeError):
            respond(400, _error("events must be a list", "invalid_request_error"))
            return
        now = time.perf_counter()
        for event in events:
            call_id = event.get("call_id")
            call = (session.session_id, call_id)
            stats = self.stats
            stats.per_call_submissions[call] = stats.per_call_submissions.get(call, 0) + 1
            if call_id in session.actions:
                del session.actions[call_id]
                session.cached = None
                self._keys[call] = key
                self.accepted_at[call] = now
                stats.accepted += 1
                waiter = self._waiters.get(call)
                if waiter is not None and not waiter.done():
                    waiter.set_result(now)
            elif call in self._keys:
                if key is not None and self._keys[call] == key:
                    stats.replays += 1
                else:
                    stats.duplicates += 1
                    respond(400, _error(f"Unknown pending tool call: {call_id}"))
                    return
            else:
                stats.unknown += 1
                respond(400, _error(f"Unknown pending tool call: {call_id}"))
                return
        respond(202, b"")


def _error(message: str, code: str = "invalid_request_error") -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": "invalid_request_error", "code": code}}
    ).encode()


class _Protocol(asyncio.Protocol):
    """HTTP/1.1 with keep-alive and Content-Length bodies: all httpx and httpx2 send."""

    def __init__(self, api: BenchAPI) -> None:
        self.api = api
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.api._transports.add(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.transport is not None:
            self.api._transports.discard(self.transport)
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > _MAX_HEAD and self.transport is not None:
                    self.transport.close()
                return
            lines = bytes(self.buffer[:end]).decode("latin-1").split("\r\n")
            method, target, _version = lines[0].split(" ", 2)
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            total = end + 4 + int(headers.get("content-length", "0"))
            if len(self.buffer) < total:
                return
            body = bytes(self.buffer[end + 4 : total])
            del self.buffer[:total]
            self.api.handle(method, target, headers, body, self._respond)

    def _respond(self, status: int, body: bytes) -> None:
        head = (
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"x-request-id: req_bench\r\n\r\n" % (status, _REASONS.get(status, b"X"), len(body))
        )
        if self.api.latency > 0:
            self.loop.call_later(self.api.latency, self._write, head, body)
        else:
            self._write(head, body)

    def _write(self, head: bytes, body: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(head + body if len(body) < 65536 else head)
            if len(body) >= 65536:
                self.transport.write(body)
