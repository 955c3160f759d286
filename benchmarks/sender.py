"""The webhook sender: signed ``agent.session.action_required`` deliveries over raw HTTP/1.1.

A hand-rolled keep-alive client on asyncio streams (a few microseconds a request) rather
than httpx, so the driver spends its core on the Agents API side and on bookkeeping, not on
an HTTP library. Like OpenAI's sender it treats anything but a 2xx, a connection error or a
timeout as a failed attempt and retries with the same ``webhook-id`` (and a fresh signature).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import time
from dataclasses import dataclass

from agentfn_asgi.signing import signed_headers

__all__ = ["Delivery", "Sender", "SenderConnection"]

USER_AGENT = "OpenAI/1.0 (+https://platform.openai.com/docs/webhooks)"


@dataclass(slots=True)
class Delivery:
    """What the driver learns about one delivery."""

    session_id: str
    sent_at: float  # perf_counter() at the start of the first attempt
    ack_latency: float  # of the successful attempt, seconds
    attempts: int
    status: int


class SenderConnection:
    """One keep-alive connection; reconnects after an error or ``connection: close``."""

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
        self._reader = self._writer = None

    async def post(self, path: str, headers: dict[str, str], body: bytes) -> int:
        """Send one POST and read the whole answer; returns the status code."""
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection(self.host, self.port)
        assert self._reader is not None
        head = [f"POST {path} HTTP/1.1", f"host: {self.host}:{self.port}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        head.append(f"content-length: {len(body)}")
        self._writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        try:
            raw = await self._reader.readuntil(b"\r\n\r\n")
            lines = raw.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            fields = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                fields[name.strip().lower()] = value.strip()
            if "content-length" in fields:
                await self._reader.readexactly(int(fields["content-length"]))
            elif fields.get("transfer-encoding", "").lower() == "chunked":
                await self._read_chunked()
            if fields.get("connection", "").lower() == "close":
                await self.close()
        except BaseException:
            await self.close()
            raise
        return status

    async def _read_chunked(self) -> None:
        assert self._reader is not None
        while True:
            size = int((await self._reader.readline()).split(b";")[0].strip(), 16)
            await self._reader.readexactly(size + 2)
            if size == 0:
                return


class Sender:
    """Signs and sends deliveries to ``url`` (``http://127.0.0.1:PORT/path``)."""

    def __init__(
        self, url: str, secret: str, *, timeout: float = 30.0, retry_delay: float = 1.0
    ) -> None:
        rest = url.removeprefix("http://")
        hostport, _, path = rest.partition("/")
        host, _, port = hostport.partition(":")
        self.host, self.port, self.path = host, int(port), "/" + path
        self.secret = secret
        self.timeout = timeout
        self.retry_delay = retry_delay
        self.max_attempts = 6
        self.retries = 0
        self.failures = 0
        self._idle: list[SenderConnection] = []

    def connection(self) -> SenderConnection:
        return SenderConnection(self.host, self.port)

    async def close(self) -> None:
        for conn in self._idle:
            await conn.close()
        self._idle.clear()

    async def deliver(self, session_id: str, conn: SenderConnection | None = None) -> Delivery:
        """Deliver one event until a 2xx (or give up); uses ``conn`` or a pooled connection."""
        body = json.dumps(
            {
                "id": "evt_" + secrets.token_hex(12),
                "object": "event",
                "created_at": int(time.time()),
                "type": "agent.session.action_required",
                "data": {"id": session_id, "required_action": {"type": "function_call"}},
            },
            separators=(",", ":"),
        ).encode()
        msg_id = "wh_" + secrets.token_hex(16)
        pooled = conn is None
        if conn is None:
            conn = self._idle.pop() if self._idle else self.connection()
        sent_at = time.perf_counter()
        status = 0
        attempt = 0
        try:
            while attempt < self.max_attempts:
                attempt += 1
                headers = {
                    "content-type": "application/json",
                    "user-agent": USER_AGENT,
                    **signed_headers(self.secret, body, msg_id=msg_id),
                }
                started = time.perf_counter()
                try:
                    async with asyncio.timeout(self.timeout):
                        status = await conn.post(self.path, headers, body)
                except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError):
                    status = 0
                if 200 <= status < 300:
                    return Delivery(
                        session_id, sent_at, time.perf_counter() - started, attempt, status
                    )
                self.retries += 1
                await asyncio.sleep(self.retry_delay * attempt)
            self.failures += 1
            return Delivery(session_id, sent_at, float("nan"), attempt, status)
        finally:
            if pooled:
                self._idle.append(conn)
