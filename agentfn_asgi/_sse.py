"""Server-Sent Events of the Agents API: decoding, and an open, typed event stream.

:meth:`AgentsClient.open_event_stream <agentfn_asgi.client.AgentsClient.open_event_stream>`
returns an :class:`EventStream`; :mod:`agentfn_asgi.stream` follows sessions with it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import TracebackType
from typing import Self

import httpx

from .errors import APIConnectionError, APIError, APITimeoutError
from .session_events import SessionEvent, parse_session_event

__all__ = ["EventStream", "iter_sse_data"]


async def iter_sse_data(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """Decode Server-Sent Events from text lines; yield each event's ``data`` text.

    WHATWG rules: ``:`` starts a comment; ``field: value`` loses one leading space; several
    ``data`` lines join with ``\\n``; a blank line dispatches; an event without data is
    dropped; ``event``, ``id`` and ``retry`` are ignored (the JSON ``type`` decides).
    """
    data: list[str] = []
    first = True
    async for raw in lines:
        line = raw.rstrip("\r\n")
        if first:
            line = line.removeprefix("\ufeff")
            first = False
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if field == "data":
            data.append(value.removeprefix(" "))
    if data:
        # The body ended without the final blank line; the event is still complete.
        yield "\n".join(data)


class EventStream:
    """An open ``GET …/events`` response (see :meth:`AgentsClient.open_event_stream
    <agentfn_asgi.client.AgentsClient.open_event_stream>`): the server has accepted the
    subscription; iterate for typed events, and close it (``async with`` or :meth:`aclose`).

    A streamed ``error`` is yielded as :class:`~agentfn_asgi.session_events.ErrorEvent`; ``data:
    [DONE]`` or the end of the body ends iteration; a malformed event raises
    :class:`~agentfn_asgi.errors.APIError`; a cut connection raises
    :class:`~agentfn_asgi.errors.APIConnectionError` (a read timeout
    :class:`~agentfn_asgi.errors.APITimeoutError`).
    """

    def __init__(
        self,
        response: httpx.Response,
        *,
        timeout_errors: tuple[type[Exception], ...] = (httpx.TimeoutException,),
        transport_errors: tuple[type[Exception], ...] = (httpx.TransportError,),
    ) -> None:
        self._response = response
        self._timeout_errors = timeout_errors
        self._transport_errors = transport_errors
        self.request_id = response.headers.get("x-request-id")

    def __aiter__(self) -> AsyncIterator[SessionEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[SessionEvent]:
        try:
            async for data in iter_sse_data(self._response.aiter_lines()):
                if data == "[DONE]":
                    return
                try:
                    yield parse_session_event(data)
                except ValueError as exc:
                    raise APIError(
                        f"malformed event in stream: {exc}", request_id=self.request_id
                    ) from exc
        except self._timeout_errors as exc:
            raise APITimeoutError(f"stream read timed out: {exc}") from exc
        except self._transport_errors as exc:
            raise APIConnectionError(f"stream interrupted: {exc!r}") from exc

    async def aclose(self) -> None:
        """Release the connection (safe to call twice)."""
        await self._response.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
