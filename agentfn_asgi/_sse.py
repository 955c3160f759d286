"""Server-Sent Events of the Agents API: decoding, and an open, typed event stream.

:meth:`AgentsClient.open_event_stream <agentfn_asgi.client.AgentsClient.open_event_stream>`
returns an :class:`EventStream`; :mod:`agentfn_asgi.stream` follows sessions with it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from types import TracebackType
from typing import Self

import httpx
from pydantic import ValidationError

from .errors import APIConnectionError, APIError, APITimeoutError
from .session_events import SessionEvent, UnreadableEvent, parse_session_event

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
    [DONE]`` or the end of the body ends iteration; a cut connection raises
    :class:`~agentfn_asgi.errors.APIConnectionError` (a read timeout
    :class:`~agentfn_asgi.errors.APITimeoutError`). An event that cannot be parsed, whatever
    the parser raised (a ``RecursionError`` for data nested too deeply included), raises
    :class:`~agentfn_asgi.errors.APIError` when iterating the stream itself, and is yielded
    as an :class:`~agentfn_asgi.session_events.UnreadableEvent` by :meth:`tolerant`.
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
        return self._strict()

    async def _strict(self) -> AsyncIterator[SessionEvent]:
        async with contextlib.aclosing(self.tolerant()) as events:
            async for event in events:
                if isinstance(event, UnreadableEvent):
                    raise APIError(
                        f"malformed event in stream: {event.reason}", request_id=self.request_id
                    )
                yield event

    async def tolerant(self) -> AsyncGenerator[SessionEvent | UnreadableEvent, None]:
        """Iterate like the stream itself, except that an event that cannot be parsed is
        yielded as an :class:`~agentfn_asgi.session_events.UnreadableEvent` and iteration
        goes on: what follows a stream must not stop for one strange event (a model can
        write arguments nested 100,000 levels deep, and the snapshot quotes them)."""
        try:
            async for data in iter_sse_data(self._response.aiter_lines()):
                if data == "[DONE]":
                    return
                try:
                    event: SessionEvent | UnreadableEvent = parse_session_event(data)
                except Exception as exc:  # whatever the parser raised: one bad event, not the end
                    event = UnreadableEvent(reason=_unreadable_reason(exc), size=len(data))
                yield event
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


def _unreadable_reason(exc: Exception) -> str:
    """Why an event could not be parsed, without quoting it (it may hold arguments)."""
    if isinstance(exc, RecursionError):
        return "nested too deeply to parse"
    if isinstance(exc, ValidationError):
        problems = exc.errors(include_url=False, include_input=False, include_context=False)
        where = "; ".join(
            f"{'.'.join(str(part) for part in problem['loc']) or 'event'}: {problem['msg']}"
            for problem in problems[:3]
        )
        return f"not a valid event ({where})"
    if isinstance(exc, ValueError):
        return f"not a readable JSON object ({type(exc).__name__}: {str(exc)[:160]})"
    return f"the parser failed ({type(exc).__name__})"
