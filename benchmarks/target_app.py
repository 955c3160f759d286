"""One benchmark target in its own process: ``python -m benchmarks.target_app --kind ...``.

Kinds:

- ``ours``: :class:`~agentfn_asgi.app.AgentWebhookApp` in Starlette at ``/webhooks``, with a
  SQLite store (WAL, the package default) in ``--store-dir``. Options: ``--client httpx2``
  (``httpx2.alias_httpx()`` before anything imports httpx: the package then runs on
  httpx2's classes), ``--max-connections N`` (inject an ``httpx.AsyncClient`` with that pool
  size), ``--inject httpx|httpx-aiohttp`` (inject that client, 64 connections, instead of the
  one the package builds: with ``--client httpx2`` ``httpx`` means httpx2's),
  ``--tracing api|sdk`` (a ``Telemetry`` on the global no-op providers, or on an SDK
  ``TracerProvider`` + ``BatchSpanProcessor`` + a null exporter and an SDK ``MeterProvider``).
- ``inline``: the hand-written baseline of :mod:`benchmarks.baseline_app`, ``--client httpx``
  or ``httpx2``.

``--store sqlite|memory|postgres|redis`` picks agentfn-asgi's store: PostgreSQL at
``127.0.0.1:5432/test`` in the schema ``agentfn_bench_<name>``, Redis at ``127.0.0.1:6379``
under the key prefix ``agentfn-bench:<name>:`` (so the test suite's data is never touched);
the store is emptied when the process starts. ``--count-round-trips`` wraps the store's
driver (:mod:`benchmarks.roundtrips`) and serves the counters at ``GET /bench/counters``.

Every target is served the same way: uvicorn, one worker, no access log, and either
``--server h11`` (asyncio loop, h11: pure Python) or ``--server uvloop`` (uvloop,
httptools). Nothing but the standard library is imported at module level, so the httpx2
alias can be installed first.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

__all__ = ["build_app", "main"]

API_KEY = "sk-bench"


def _telemetry(mode: str) -> Any:
    if mode == "none":
        return None
    from agentfn_asgi.tracing import Telemetry

    if mode == "api":
        return Telemetry()
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class NullExporter(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            self.exported = getattr(self, "exported", 0) + len(spans)
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(NullExporter()))
    meters = MeterProvider(metric_readers=[InMemoryMetricReader()])
    return Telemetry(tracer_provider=provider, meter_provider=meters)


def _bounded_client(httpx: Any, *, max_in_flight: int | None, **options: Any) -> Any:
    """An ``httpx.AsyncClient`` that lets at most ``max_in_flight`` requests into its pool.

    Waiting on an ``asyncio.Semaphore`` is O(1); waiting inside httpcore's pool costs a scan
    of every queued request against every connection each time a request finishes.
    """
    import asyncio

    class BoundedAsyncClient(httpx.AsyncClient):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__(**options)
            self._slots = asyncio.Semaphore(max_in_flight) if max_in_flight else None

        async def send(self, request: Any, **kwargs: Any) -> Any:
            if self._slots is None:
                return await super().send(request, **kwargs)
            async with self._slots:
                return await super().send(request, **kwargs)

    return BoundedAsyncClient()


def store_url(kind: str, name: str, store_dir: str) -> str:
    """The store URL of target ``name`` on ``kind``, in its own schema or key prefix."""
    if kind == "memory":
        return "memory://"
    if kind == "postgres":
        schema = "agentfn_bench_" + "".join(c if c.isalnum() else "_" for c in name)
        return f"postgresql://127.0.0.1:5432/test?schema={schema}"
    if kind == "redis":
        return f"redis://127.0.0.1:6379/0?key_prefix=agentfn-bench:{name}:"
    return f"sqlite:///{os.path.join(store_dir, name + '.sqlite3')}"


def _empty(url: str) -> None:
    """Delete what an earlier run left in this target's schema or key prefix, with the
    drivers themselves: a store left by another commit (``benchmarks.ab``) may be of a
    version this code refuses to open."""
    if not url.startswith(("postgresql:", "redis:")):
        return
    import asyncio
    from urllib.parse import parse_qs, urlsplit

    parts = urlsplit(url)
    query = {name: values[0] for name, values in parse_qs(parts.query).items()}

    async def empty() -> None:
        if parts.scheme == "postgresql":
            import asyncpg

            dsn = parts._replace(query="").geturl()
            connection = await asyncpg.connect(dsn)
            try:
                schema = query["schema"].replace('"', '""')
                await connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            finally:
                await connection.close()
            return
        import redis.asyncio as aioredis

        client = aioredis.Redis.from_url(parts._replace(query="").geturl())
        try:
            keys = [key async for key in client.scan_iter(match=query["key_prefix"] + "*")]
            for at in range(0, len(keys), 500):
                await client.delete(*keys[at : at + 500])
        finally:
            await client.aclose()

    asyncio.run(empty())


def build_app(args: argparse.Namespace) -> Any:
    """The ASGI app for ``args`` (see the module docstring)."""
    if args.kind == "inline":
        from benchmarks.baseline_app import build_inline_app

        return build_inline_app(
            client=args.client, api_url=args.api, api_key=API_KEY, secret=args.secret
        )
    if args.client == "httpx2":
        import httpx2

        httpx2.alias_httpx()
    import httpx
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, PlainTextResponse
    from starlette.routing import Route

    from agentfn_asgi.app import AgentWebhookApp
    from agentfn_asgi.client import AgentsClient
    from agentfn_asgi.dispatch import DispatchSettings
    from agentfn_asgi.integrations.starlette import webhook_routes
    from agentfn_asgi.tools import FunctionTools
    from benchmarks.handlers import HANDLERS

    tools = FunctionTools()
    for handler in HANDLERS.values():
        tools.function(handler)
    http_client: Any = None
    if args.inject != "none":
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        timeout = httpx.Timeout(30.0, connect=5.0)
        if args.inject == "httpx-aiohttp":
            from httpx_aiohttp import HttpxAiohttpClient

            http_client = HttpxAiohttpClient(timeout=timeout, limits=limits)
        else:
            http_client = httpx.AsyncClient(timeout=timeout, limits=limits)
    elif args.max_connections or args.max_in_flight:
        connections = args.max_connections or 64
        http_client = _bounded_client(
            httpx,
            max_in_flight=args.max_in_flight or None,
            timeout=httpx.Timeout(30.0, connect=5.0),
            limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        )
    client = AgentsClient(api_key=API_KEY, base_url=args.api, http_client=http_client)
    store = store_url(args.store, args.name, args.store_dir)
    _empty(store)
    webhooks = AgentWebhookApp(
        tools,
        webhook_secret=args.secret,
        client=client,
        store=store,
        telemetry=_telemetry(args.tracing),
        settings=DispatchSettings(max_concurrency=args.max_concurrency),
    )

    async def ready(_request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    async def counters(_request: Request) -> JSONResponse:
        from benchmarks.roundtrips import COUNTS

        return JSONResponse(dict(COUNTS))

    return Starlette(
        routes=[
            *webhook_routes(webhooks, "/webhooks"),
            Route("/ready", ready),
            Route("/bench/counters", counters),
        ],
        lifespan=webhooks.lifespan,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kind", choices=["ours", "inline"], required=True)
    parser.add_argument("--name", default="target")
    parser.add_argument("--client", choices=["httpx", "httpx2"], default="httpx")
    parser.add_argument("--max-connections", type=int, default=0)
    parser.add_argument("--max-in-flight", type=int, default=0)
    parser.add_argument("--inject", choices=["none", "httpx", "httpx-aiohttp"], default="none")
    parser.add_argument("--max-concurrency", type=int, default=1024)
    parser.add_argument("--tracing", choices=["none", "api", "sdk"], default="none")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--api", required=True, help="Agents API base URL ending in /v1")
    parser.add_argument("--secret", required=True)
    parser.add_argument("--store-dir", default=".")
    parser.add_argument("--profile", default="", help="cProfile output (SIGUSR1 dumps it)")
    parser.add_argument(
        "--store", choices=["sqlite", "memory", "postgres", "redis"], default="sqlite"
    )
    parser.add_argument("--server", choices=["h11", "uvloop"], default="h11")
    parser.add_argument("--count-round-trips", action="store_true")
    args = parser.parse_args(argv)
    if args.count_round_trips:
        from benchmarks.roundtrips import install

        install(args.store)
    app = build_app(args)
    import uvicorn

    def serve() -> None:
        uvicorn.run(
            app,
            host="127.0.0.1",
            port=args.port,
            loop="uvloop" if args.server == "uvloop" else "asyncio",
            http="httptools" if args.server == "uvloop" else "h11",
            lifespan="on",
            log_level="warning",
            access_log=False,
            backlog=2048,
        )

    if not args.profile:
        serve()
        return
    import cProfile

    # Diagnosis only (never in reported runs): the event loop thread's profile, written when
    # the process is terminated.
    profiler = cProfile.Profile()
    import signal

    def _stop(*_: object) -> None:
        profiler.disable()
        profiler.dump_stats(args.profile)
        os._exit(0)

    signal.signal(signal.SIGUSR1, _stop)
    profiler.enable()
    serve()


if __name__ == "__main__":
    main(sys.argv[1:])
