"""Small raw-ASGI helpers shared by the endpoints the package serves.

Routing an app's exact paths (starlette's router, without its slash redirect and with our
own 404 and 405), reading a request body under a size cap and a time limit, answering JSON,
reading a header.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from starlette.routing import Route, Router
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = [
    "BodyTooLargeError",
    "DisconnectedError",
    "Refusal",
    "exact_router",
    "header",
    "read_body",
    "send_json",
]

#: Answers a method a path does not take: ``refuse(scope, receive, send, allow)``.
Refusal = Callable[[Scope, Receive, Send, str], Awaitable[None]]


def exact_router(
    routes: Iterable[tuple[str, ASGIApp, str]], not_found: ASGIApp, not_allowed: Refusal
) -> Router:
    """Starlette's router over ``(path, app, allow)``: each exact path answered by the plain
    ASGI ``app`` for the methods ``allow`` lists (``"GET, HEAD"``, the ``Allow`` header of
    the path's 405, answered by ``not_allowed``), any other path by ``not_found``. No slash
    redirect: a webhook sender counts a 3xx as a failed delivery."""
    endpoints = [_Endpoint(path, app, allow, not_allowed) for path, app, allow in routes]
    return Router(endpoints, redirect_slashes=False, default=not_found)


class _Endpoint(Route):
    """``"/"`` also matches the mount point itself (below a ``root_path`` its exact path
    leaves an empty path); HEAD is allowed only where listed."""

    def __init__(self, path: str, app: ASGIApp, allow: str, refuse: Refusal) -> None:
        super().__init__(path, app, methods=allow.split(", "), include_in_schema=False)
        self.app = app  # as is: starlette takes a bound method for request -> response
        self.allow, self.allowed, self.refuse = allow, frozenset(allow.split(", ")), refuse
        if path == "/":
            self.path_regex = re.compile("^/?$")

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] in self.allowed:
            await self.app(scope, receive, send)
        else:
            await self.refuse(scope, receive, send, self.allow)


class BodyTooLargeError(Exception):
    """The request body is (or announced itself as) larger than the cap."""


class DisconnectedError(Exception):
    """The client went away before the body was received."""


async def send_json(
    send: Send, status: int, payload: dict[str, Any], *, head: bool = False, **headers: str
) -> None:
    """Answer ``status`` with compact JSON; ``retry_after="5"`` becomes ``retry-after: 5``.
    ``head``: the answer to a HEAD request (the same headers, no body)."""
    body = json.dumps(payload, separators=(",", ":")).encode()
    raw_headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    raw_headers += [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": b"" if head else body})


async def read_body(
    receive: Receive,
    scope: Scope,
    *,
    limit: int,
    timeout: float,  # noqa: ASYNC109 - a body read limit, not a caller timeout
) -> bytes:
    """The whole body, refused early when ``content-length`` announces more than ``limit``.

    Raises BodyTooLargeError, TimeoutError (not received within ``timeout`` seconds) or
    DisconnectedError.
    """
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                continue
            if declared > limit:
                raise BodyTooLargeError
    chunks: list[bytes] = []
    size = 0
    async with asyncio.timeout(timeout):
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise DisconnectedError
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise BodyTooLargeError
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def header(scope: Scope, name: bytes, *, limit: int = 256) -> str | None:
    """The first header ``name`` (lower case bytes), cut to ``limit`` characters: it is
    untrusted, and may end up in a span attribute or a log line."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value[:limit].decode("latin-1"))
    return None
