"""Serve an ASGI app (the fake, or the app under test) on a free loopback port.

::

    async with serve_fake(fake) as base_url:        # "http://127.0.0.1:PORT/v1"
        client = AgentsClient(api_key="sk-test", base_url=base_url)

Needs uvicorn (the ``server`` extra), imported only when called.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Literal

from starlette.types import ASGIApp

from agentfn_asgi.errors import ConfigurationError

if TYPE_CHECKING:
    from agentfn_asgi.testing.fake import FakeAgentsAPI

__all__ = ["serve_app", "serve_fake"]


@contextlib.asynccontextmanager
async def serve_app(
    app: ASGIApp,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    lifespan: Literal["auto", "on", "off"] = "auto",
    graceful_shutdown: int = 2,
    access_log: bool = False,
) -> AsyncIterator[str]:
    """Run ``app`` under uvicorn on ``host`` (a free port unless ``port`` is given).

    Yields the root URL ``http://host:port``; on exit the server stops, waiting at most
    ``graceful_shutdown`` seconds for open connections. The process's signal handlers are
    left alone, so Ctrl-C still reaches the test runner. ``access_log`` turns on uvicorn's
    access log (logger ``uvicorn.access``), to test what a server's log would hold.
    """
    try:
        import uvicorn
    except ImportError as exc:  # pragma: no cover - uvicorn is a dev dependency
        raise ConfigurationError(
            "serving an app over loopback needs uvicorn: pip install 'agentfn-asgi[server]'"
        ) from exc

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY only on sockets that name it, and without
    # it every answer waited ~40 ms for the client's delayed ACK.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        host=host,
        port=bound_port,
        lifespan=lifespan,
        log_level="warning",
        access_log=access_log,
        timeout_graceful_shutdown=graceful_shutdown,
    )
    if access_log:  # its lines are INFO, which log_level="warning" would drop
        logging.getLogger("uvicorn.access").setLevel(logging.INFO)
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                await task  # surfaces the start-up error
                raise ConfigurationError(f"server for {app!r} exited during start-up")
            await asyncio.sleep(0.005)
        yield f"http://{host}:{bound_port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


@contextlib.asynccontextmanager
async def serve_fake(fake: FakeAgentsAPI, *, host: str = "127.0.0.1") -> AsyncIterator[str]:
    """Serve a :class:`FakeAgentsAPI` over loopback; yields its base URL ending in ``/v1``."""
    async with serve_app(fake, host=host) as root:
        try:
            yield root + "/v1"
        finally:
            # Open SSE streams would otherwise hold the shutdown for the grace period.
            for session in fake.sessions.values():
                session.close_streams()
