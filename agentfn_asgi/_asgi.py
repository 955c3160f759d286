"""Small raw-ASGI helpers shared by the endpoints the package serves (no framework).

Reading a request body under a size cap and a time limit, answering JSON, reading a header
and the path below a mount point.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.types import Receive, Scope, Send

__all__ = [
    "BodyTooLargeError",
    "DisconnectedError",
    "header",
    "read_body",
    "send_json",
    "sub_path",
]


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


def sub_path(scope: Scope) -> str:
    """The path below the mount point (``root_path``), so ``Mount`` and plain routes both work."""
    path: str = scope.get("path", "")
    root: str = scope.get("root_path", "").rstrip("/")
    if root and (path == root or path.startswith(root + "/")):
        path = path[len(root) :]
    return path.rstrip("/")
