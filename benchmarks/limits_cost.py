"""What flow control costs when its limits are never reached: ``python -m benchmarks.limits_cost``.

Two targets, each one process under uvicorn exactly like ``benchmarks.target_app``'s
``ours`` (Starlette, the package's default SQLite store in a temp dir, the package's own
client): ``plain`` registers ``get_customer`` as it is, ``limited`` registers the same
handler with ``concurrency=``, ``rate=`` and ``burst=`` far above anything the load reaches,
so every call takes the limited path (a slot, a token) and none ever waits. The saturation
load of ``benchmarks.run`` (single-call deliveries through 64 sender connections, each sending
its next delivery as soon as the last was acknowledged) runs against them in interleaved
rounds (plain, limited, limited, plain, ...); each round's ratio of target CPU per call
limited / plain is reported, their median against the target of at most 1.10. The driver,
the lean Agents API and the sender are ``benchmarks.driver``'s (used, not changed).

``--serve`` is the target side (what the driver starts); timings are never asserted by tests.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import secrets
import statistics
import sys
import tempfile
from typing import Any

from agentfn_asgi.tools import FunctionTools
from benchmarks.bench_api import BenchAPI
from benchmarks.driver import Driver, RoundResult, TargetProcess

__all__ = ["LIMITS", "TARGET_RATIO", "build_app", "build_tools", "main", "run"]

#: The ratio of CPU per call, limited / plain, the limits may cost at most.
TARGET_RATIO = 1.10

#: Limits no run reaches: more slots than the app ever runs calls at once (its
#: ``max_concurrency`` is 1024), more tokens than calls in a run.
LIMITS: dict[str, Any] = {"concurrency": 100_000, "rate": "100000/s", "burst": 100_000}

_API_KEY = "sk-bench"


def build_tools(*, limited: bool) -> FunctionTools:
    """``benchmarks.handlers.get_customer`` alone, registered with :data:`LIMITS` when
    ``limited``."""
    from benchmarks.handlers import get_customer

    tools = FunctionTools()
    if limited:
        tools.add(get_customer, **LIMITS)
    else:
        tools.add(get_customer)
    return tools


def build_app(*, limited: bool, api_url: str, secret: str, store_path: str) -> Any:
    """The target app: ``benchmarks.target_app``'s ``ours`` serving :func:`build_tools`."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    from agentfn_asgi.app import AgentWebhookApp
    from agentfn_asgi.client import AgentsClient
    from agentfn_asgi.dispatch import DispatchSettings
    from agentfn_asgi.integrations.starlette import webhook_routes

    webhooks = AgentWebhookApp(
        build_tools(limited=limited),
        webhook_secret=secret,
        client=AgentsClient(api_key=_API_KEY, base_url=api_url),
        store=f"sqlite:///{store_path}",
        settings=DispatchSettings(max_concurrency=1024),
    )

    async def ready(_request: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    return Starlette(
        routes=[*webhook_routes(webhooks, "/webhooks"), Route("/ready", ready)],
        lifespan=webhooks.lifespan,
    )


def _serve(args: argparse.Namespace) -> None:
    import uvicorn

    app = build_app(
        limited=args.limited,
        api_url=args.api,
        secret=args.secret,
        store_path=os.path.join(args.store_dir, args.name + ".sqlite3"),
    )
    # Served as benchmarks.target_app serves every target.
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        loop="asyncio",
        http="h11",
        lifespan="on",
        log_level="warning",
        access_log=False,
        backlog=2048,
    )


class _Target(TargetProcess):
    """A :class:`~benchmarks.driver.TargetProcess` running this module's ``--serve``."""

    def __init__(self, name: str, *, api_url: str, secret: str, store_dir: str) -> None:
        super().__init__(name, [], api_url=api_url, secret=secret, store_dir=store_dir)
        self._argv = [
            sys.executable,
            "-m",
            "benchmarks.limits_cost",
            "--serve",
            *(["--limited"] if name == "limited" else []),
            "--name",
            name,
            "--port",
            str(self.port),
            "--api",
            api_url,
            "--secret",
            secret,
            "--store-dir",
            store_dir,
        ]


async def run(*, rounds: int, sessions: int) -> dict[str, Any]:
    """Interleaved rounds of the saturation load against both targets; the per-round CPU
    per call, the ratios, and the correctness counters."""
    secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    api = BenchAPI()
    api_url = await api.start()
    driver = Driver(api, secret)
    cpu: dict[str, list[float]] = {"plain": [], "limited": []}
    rates: dict[str, list[float]] = {"plain": [], "limited": []}
    lost = duplicates = 0
    with tempfile.TemporaryDirectory(prefix="agentfn-limits-") as tmp:
        targets = {
            name: _Target(name, api_url=api_url, secret=secret, store_dir=tmp)
            for name in ("plain", "limited")
        }
        try:
            for target in targets.values():
                target.launch()
            await asyncio.gather(*(t.wait_ready() for t in targets.values()))
            for target in targets.values():  # warm-up: connections, lazy imports, caches
                await driver.serial(target, 20)
                await driver.burst(target, sessions=min(sessions, 200), concurrency=64)
            for i in range(rounds):
                # A B, B A, ...: neither target always runs first.
                order = ["plain", "limited"] if i % 2 == 0 else ["limited", "plain"]
                for name in order:
                    result: RoundResult = await driver.burst(
                        targets[name], sessions=sessions, concurrency=64
                    )
                    lost += result.lost
                    duplicates += result.duplicates
                    cpu[name].append(result.metrics["cpu_us_per_call"])
                    rates[name].append(result.metrics["calls_per_s"])
                    print(
                        f"  round {i + 1}/{rounds} {name:8s} "
                        f"{result.metrics['cpu_us_per_call']:7.0f} µs CPU/call "
                        f"{result.metrics['calls_per_s']:7.1f} calls/s "
                        f"lost {result.lost} dup {result.duplicates}",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            for target in targets.values():
                target.stop()
            await api.stop()
    ratios = [lim / plain for lim, plain in zip(cpu["limited"], cpu["plain"], strict=True)]
    return {
        "cpu_us_per_call": cpu,
        "calls_per_s": rates,
        "ratios": ratios,
        "ratio_median": statistics.median(ratios),
        "lost": lost,
        "duplicates": duplicates,
    }


def main(argv: list[str] | None = None) -> None:
    """Run the comparison and print it (or, with ``--serve``, be one target)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--sessions", type=int, default=1500, help="deliveries a round")
    parser.add_argument("--quick", action="store_true", help="4 rounds of 600 deliveries")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--limited", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--name", default="plain", help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--api", default="", help=argparse.SUPPRESS)
    parser.add_argument("--secret", default="", help=argparse.SUPPRESS)
    parser.add_argument("--store-dir", default=".", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        _serve(args)
        return
    rounds, sessions = (4, 600) if args.quick else (args.rounds, args.sessions)
    results = asyncio.run(run(rounds=rounds, sessions=sessions))
    med = statistics.median
    plain, limited = results["cpu_us_per_call"]["plain"], results["cpu_us_per_call"]["limited"]
    ratios = results["ratios"]
    verdict = "within" if results["ratio_median"] <= TARGET_RATIO else "ABOVE"
    print(
        f"limits cost at saturation ({rounds} interleaved rounds of {sessions} deliveries, "
        "64 in flight, SQLite store)\n"
        f"  plain    {med(plain):7.0f} µs CPU/call  "
        f"{med(results['calls_per_s']['plain']):7.1f} calls/s\n"
        f"  limited  {med(limited):7.0f} µs CPU/call  "
        f"{med(results['calls_per_s']['limited']):7.1f} calls/s\n"
        f"  CPU per call, limited / plain: median {results['ratio_median']:.3f} "
        f"(rounds {min(ratios):.3f}–{max(ratios):.3f}), {verdict} the target "
        f"≤ {TARGET_RATIO:.2f}\n"
        f"  lost {results['lost']}, duplicates {results['duplicates']}"
    )
    if results["lost"] or results["duplicates"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
