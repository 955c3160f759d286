"""CPU per request of the package's ``AgentsClient`` on each HTTP stack:
``python -m benchmarks.http_clients [--requests N] [--rounds R]``.

The dispatcher makes two requests per call (read the session, submit the result), so the
client's CPU per request is a large share of a call's cost. Each variant is an
``AgentsClient`` around one HTTP client (64-connection pool):

- ``httpx``: ``httpx.AsyncClient`` (httpcore);
- ``httpx2``: ``httpx2.AsyncClient`` (the fork the official ``openai`` SDK uses);
- ``httpx+aiohttp``: ``httpx_aiohttp.HttpxAiohttpClient``, an ``httpx.AsyncClient`` on
  aiohttp's connection pool (the transport the official SDK offers as its faster client);
- ``aiohttp (the package's adapter)``: :class:`agentfn_asgi._aiohttp.AiohttpClient`, the
  few ``httpx.AsyncClient`` methods the client uses, straight on an aiohttp session;
- ``default``: what ``AgentsClient`` builds when no client is injected.

The lean Agents API (:mod:`benchmarks.bench_api`) runs in a child process; this process
sends ``--requests`` requests a round alternating ``GET /agents/sessions/{id}`` (parsed into
an ``AgentSession``) and ``POST .../events`` (a saved result's bytes, same key: a replay),
with 1 and with 64 in flight, after a warm-up. CPU is this process's user+system time over
the round. Rounds interleave the variants; medians are reported, with each variant's ratio
to ``httpx2`` round by round.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["VARIANTS", "main"]

API_KEY = "sk-bench"


def _limits(lib: Any) -> Any:
    return lib.Limits(max_connections=64, max_keepalive_connections=64)


def _httpx() -> Any:
    import httpx

    return httpx.AsyncClient(limits=_limits(httpx), timeout=httpx.Timeout(30.0, connect=5.0))


def _httpx2() -> Any:
    import httpx2

    return httpx2.AsyncClient(limits=_limits(httpx2), timeout=httpx2.Timeout(30.0, connect=5.0))


def _httpx_aiohttp() -> Any:
    import httpx
    from httpx_aiohttp import HttpxAiohttpClient

    return HttpxAiohttpClient(limits=_limits(httpx), timeout=httpx.Timeout(30.0, connect=5.0))


def _aiohttp_direct() -> Any:
    import httpx

    from agentfn_asgi._aiohttp import AiohttpClient

    return AiohttpClient(timeout=httpx.Timeout(30.0, connect=5.0), max_connections=64)


#: name -> a factory of the injected HTTP client (None: the package's own choice).
VARIANTS: dict[str, Callable[[], Any] | None] = {
    "httpx": _httpx,
    "httpx2": _httpx2,
    "httpx+aiohttp": _httpx_aiohttp,
    "aiohttp (the package's adapter)": _aiohttp_direct,
    "default": None,
}


def _serve() -> None:
    """Child process: the lean API with one session; prints ``url session call``."""
    from benchmarks.bench_api import BenchAPI

    async def main() -> None:
        api = BenchAPI()
        url = await api.start()
        sid, calls = api.create_session([("get_customer", {"customer_id": "cus_1"})])
        print(url, sid, calls[0][1], flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


async def _round(client: Any, sid: str, body: bytes, *, n: int, inflight: int) -> float:
    """CPU seconds per request over ``n`` requests with ``inflight`` at once."""
    left = list(range(n))

    async def worker() -> None:
        while left:
            i = left.pop()
            if i % 2:
                await client.retrieve_session(sid)
            else:
                await client.submit_raw_events(sid, body, idempotency_key="afn_bench")

    started = time.process_time()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    return (time.process_time() - started) / n


async def measure(url: str, sid: str, call_id: str, *, n: int, rounds: int) -> str:
    from agentfn_asgi.calls.records import CallKey
    from agentfn_asgi.client import AgentsClient
    from agentfn_asgi.results import encode_result, events_body

    saved = encode_result(
        CallKey(sid, "turn_1", call_id), {"found": True}, tool_name="get_customer"
    )
    body = events_body(saved.event_json)
    clients = {
        name: AgentsClient(
            api_key=API_KEY, base_url=url, http_client=None if make is None else make()
        )
        for name, make in VARIANTS.items()
    }
    default_http = type(clients["default"]._http)
    cpu: dict[tuple[str, int], list[float]] = {}
    try:
        for client in clients.values():
            await _round(client, sid, body, n=200, inflight=8)  # warm-up
        for r in range(rounds):
            names = list(clients)
            names = names[r % len(names) :] + names[: r % len(names)]
            for inflight in (1, 64):
                for name in names:
                    per = await _round(clients[name], sid, body, n=n, inflight=inflight)
                    cpu.setdefault((name, inflight), []).append(per)
            print(f"  round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    finally:
        for client in clients.values():
            await client.aclose()
            if client._owns_http is False:
                await client._http.aclose()
    lines = [
        f"`default` is `{default_http.__module__}.{default_http.__qualname__}`. "
        f"{n} requests a round, {rounds} rounds; CPU µs per request (median, min–max) and "
        "the median per-round ratio to httpx2.",
        "",
        "| client | 1 in flight: CPU µs/req | ratio | 64 in flight: CPU µs/req | ratio |",
        "|---|---:|---:|---:|---:|",
    ]
    for name in clients:
        cells = []
        for inflight in (1, 64):
            mine = cpu[(name, inflight)]
            base = cpu[("httpx2", inflight)]
            ratio = statistics.median(a / b for a, b in zip(mine, base, strict=True))
            cells.append(
                f"{statistics.median(mine) * 1e6:.0f} ({min(mine) * 1e6:.0f}–"
                f"{max(mine) * 1e6:.0f}) | {ratio:.2f}×"
            )
        lines.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        _serve()
        return
    server = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.http_clients", "--serve"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        url, sid, call_id = server.stdout.readline().split()
        table = asyncio.run(measure(url, sid, call_id, n=args.requests, rounds=args.rounds))
    finally:
        server.terminate()
        server.wait()
    print(table)


if __name__ == "__main__":
    main()
