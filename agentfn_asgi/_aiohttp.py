"""The HTTP client the package builds on aiohttp (a dependency of the package).

:class:`~agentfn_asgi.client.AgentsClient` uses a handful of ``httpx.AsyncClient`` features:
``build_request``, ``send`` (buffered or streamed), ``aclose``/``is_closed``, and of the
response ``status_code``, ``is_success``, ``headers``, ``content``, ``aread``, ``aclose`` and
``aiter_lines``. :class:`AiohttpClient` offers exactly those over one
``aiohttp.ClientSession``, without httpx's request and response machinery: measured at
about a third of the CPU per request of httpx on the same aiohttp pool (``httpx-aiohttp``)
and a fifth of httpx2's at 64 requests in flight (``benchmarks/http_clients.py``). aiohttp's
failures become httpx's exception classes, so the client's retry policy reads them as it
reads httpx's. An injected ``httpx.AsyncClient`` never goes through here, and neither does
a client behind a proxy (see :class:`~agentfn_asgi.client.AgentsClient`): aiohttp reads the
proxy variables differently from httpx and the ``openai`` SDK (no ``ALL_PROXY``, no
``https://`` proxy) and would add ``~/.netrc`` credentials, so this client never reads the
environment.

aiohttp has no write timeout (its read timeout starts once the body is written), so a
large body is sent under one of its own: each slice must be taken by the connection
within ``timeout.write``, as httpx bounds each write, or the attempt fails with
``httpx.WriteTimeout`` (retried) instead of hanging until the whole deadline.
"""

from __future__ import annotations

import asyncio
import codecs
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import httpx
from multidict import CIMultiDictProxy

__all__ = ["AiohttpClient"]

_TIMEOUTS: tuple[type[Exception], ...] = (
    aiohttp.ServerTimeoutError,
    aiohttp.ConnectionTimeoutError,
    aiohttp.SocketTimeoutError,
)


@dataclass(slots=True)
class _Request:
    method: str
    url: str
    content: bytes | bytearray | None
    headers: Mapping[str, str]


class _Response:
    """The part of ``httpx.Response`` the client reads."""

    __slots__ = ("_closed", "_raw", "content", "headers", "status_code")

    def __init__(self, raw: aiohttp.ClientResponse, content: bytes | None) -> None:
        self._raw = raw
        self.status_code = raw.status
        self.headers: CIMultiDictProxy[str] = raw.headers
        self.content = content if content is not None else b""
        self._closed = content is not None

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    async def aread(self) -> bytes:
        if not self._closed:
            with _MAPPED:
                self.content = await self._raw.read()
        return self.content

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._raw.release()

    async def aiter_lines(self) -> AsyncIterator[str]:
        """Text lines without their ending (``\\n``, ``\\r\\n`` or ``\\r``), as httpx's."""
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pending = ""
        with _MAPPED:
            async for chunk in self._raw.content.iter_any():
                pending += decoder.decode(chunk)
                lines = pending.splitlines(keepends=True)
                # The last line waits for more: it has no ending yet, or ends with a "\r"
                # whose "\n" may come in the next chunk (a CRLF split in two).
                last = lines[-1] if lines else "\n"
                pending = lines.pop() if not last.endswith("\n") else ""
                for line in lines:
                    yield line.rstrip("\r\n")
        pending += decoder.decode(b"", final=True)
        for line in pending.splitlines():
            yield line


class AiohttpClient:
    """A pooled aiohttp session with the ``httpx.AsyncClient`` surface the client uses."""

    #: A ``bytearray`` body is sent as it is (no ``bytes`` copy of a large result).
    sends_bytearray = True

    def __init__(self, *, timeout: httpx.Timeout | float, max_connections: int) -> None:
        self._timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self._ssl: ssl.SSLContext = httpx.create_ssl_context()

    @property
    def is_closed(self) -> bool:
        return self._closed

    def _open(self) -> aiohttp.ClientSession:
        # Created on first use, inside the running loop that will use it.
        t = self._timeout
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=self._max_connections, keepalive_timeout=5.0, ssl=self._ssl
            ),
            timeout=aiohttp.ClientTimeout(
                total=None, connect=t.pool, sock_connect=t.connect, sock_read=t.read
            ),
            # Never the environment: behind a proxy the package builds an httpx client (see
            # the module doc); aiohttp would also read ~/.netrc on every request.
            trust_env=False,
            auto_decompress=True,
        )
        return self._session

    def build_request(
        self,
        method: str,
        url: str,
        *,
        content: bytes | bytearray | None = None,
        headers: Mapping[str, str] | None = None,
        params: Mapping[str, str] | None = None,
    ) -> _Request:
        if params:
            url = str(httpx.URL(url, params=dict(params)))
        return _Request(method, url, content, dict(headers or {}))

    async def send(self, request: _Request, *, stream: bool = False) -> _Response:
        if self._closed:
            raise RuntimeError("the HTTP client is closed")
        session = self._session or self._open()
        data: Any = request.content
        if data is not None and len(data) >= _STREAM_MIN:
            return await self._send_large(session, request, data, stream=stream)
        return await self._send(session, request, data, request.headers, stream=stream)

    async def _send_large(
        self,
        session: aiohttp.ClientSession,
        request: _Request,
        data: bytes | bytearray,
        *,
        stream: bool,
    ) -> _Response:
        # Handed over in slices of the one body: aiohttp would otherwise join it with the
        # request head (on Python < 3.12.9), a second full copy of a 4 MiB result.
        headers = {**request.headers, "Content-Length": str(len(data))}
        write = self._timeout.write
        try:
            async with asyncio.timeout(None) as watchdog:
                slices = _slices(memoryview(data), watchdog, write)
                return await self._send(session, request, slices, headers, stream=stream)
        except TimeoutError as exc:
            if watchdog.expired():
                raise httpx.WriteTimeout(f"no slice of the body taken within {write:g} s") from exc
            raise

    async def _send(
        self,
        session: aiohttp.ClientSession,
        request: _Request,
        data: Any,
        headers: Mapping[str, str],
        *,
        stream: bool,
    ) -> _Response:
        with _MAPPED:
            raw = await session.request(
                request.method, request.url, data=data, headers=headers, allow_redirects=False
            )
            if stream:
                return _Response(raw, None)
            try:
                body = await raw.read()
            finally:
                raw.release()
        return _Response(raw, body)

    async def aclose(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()


#: Bodies at least this large are sent slice by slice (see :meth:`AiohttpClient.send`).
_STREAM_MIN = 1024 * 1024
_SLICE = 256 * 1024


async def _slices(
    body: memoryview, watchdog: asyncio.Timeout, write: float | None
) -> AsyncIterator[memoryview]:
    """``body`` slice by slice, each to be taken within ``write`` seconds (none if None)."""
    loop = asyncio.get_running_loop()
    for start in range(0, len(body), _SLICE):
        if write is not None:
            watchdog.reschedule(loop.time() + write)
        yield body[start : start + _SLICE]
    watchdog.reschedule(None)  # the body is written: the answer has the read timeout


class _Mapped:
    """aiohttp's failures as httpx's classes (what the client's retry policy reads)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _: Any) -> None:
        if exc is None or not isinstance(exc, aiohttp.ClientError | OSError):
            return
        if isinstance(exc, aiohttp.ConnectionTimeoutError):  # no connection: nothing sent
            raise httpx.ConnectTimeout(str(exc) or type(exc).__name__) from exc
        if isinstance(exc, _TIMEOUTS):
            raise httpx.TimeoutException(str(exc) or type(exc).__name__) from exc
        if isinstance(exc, aiohttp.ClientConnectorError | ConnectionRefusedError):
            raise httpx.ConnectError(str(exc)) from exc
        raise httpx.ReadError(str(exc) or type(exc).__name__) from exc


_MAPPED = _Mapped()
