"""Run the benchmarks: ``python -m benchmarks.run [--quick] [--scenario NAME ...]``.

Every scenario runs interleaved rounds (target A, B, C, A, B, C, ...) in one run and reports
the median and min–max of each metric, plus per-round ratios agentfn-asgi / baseline. The
results go to ``benchmarks/results/`` as JSON and markdown; the markdown is printed.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import os
import platform
import secrets
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.bench_api import BenchAPI
from benchmarks.driver import Driver, RoundResult, TargetProcess
from benchmarks.handlers import BIG_RESULT_SIZE
from benchmarks.report import Check, markdown, ratio_summary, summarise

__all__ = ["TARGETS", "main", "run"]

RESULTS_DIR = Path(__file__).resolve().parent / "results"
BASELINE = "inline-httpx2"

UV = ["--server", "uvloop"]  # uvicorn on uvloop + httptools; the default is asyncio + h11
COUNT = ["--count-round-trips"]

#: Target name -> ``benchmarks.target_app`` arguments. A ``-uv`` suffix: served by uvicorn
#: on uvloop + httptools; without it, on asyncio + h11.
TARGETS: dict[str, list[str]] = {
    "ours": ["--kind", "ours", *COUNT],
    "inline-httpx": ["--kind", "inline", "--client", "httpx"],
    "inline-httpx2": ["--kind", "inline", "--client", "httpx2"],
    "ours-uv": ["--kind", "ours", *COUNT, *UV],
    "inline-httpx2-uv": ["--kind", "inline", "--client", "httpx2", *UV],
    "ours-pg": ["--kind", "ours", "--store", "postgres", *COUNT],
    "ours-pg-uv": ["--kind", "ours", "--store", "postgres", *COUNT, *UV],
    "ours-redis": ["--kind", "ours", "--store", "redis", *COUNT],
    "ours-redis-uv": ["--kind", "ours", "--store", "redis", *COUNT, *UV],
    "ours-tracing-api": ["--kind", "ours", "--tracing", "api"],
    "ours-tracing-sdk": ["--kind", "ours", "--tracing", "sdk"],
    "ours-httpx-bounded16": ["--kind", "ours", "--max-in-flight", "16"],
    "ours-httpx2": ["--kind", "ours", "--client", "httpx2"],
    "ours-on-httpx": ["--kind", "ours", "--inject", "httpx"],
    "ours-on-httpx2": ["--kind", "ours", "--client", "httpx2", "--inject", "httpx"],
    "ours-on-httpx-aiohttp": ["--kind", "ours", "--inject", "httpx-aiohttp"],
    "ours-httpx2-bounded16": ["--kind", "ours", "--client", "httpx2", "--max-in-flight", "16"],
    "ours-memory-store": ["--kind", "ours", "--store", "memory"],
}
MAIN = ("ours", "inline-httpx", "inline-httpx2")
#: The targets on PostgreSQL and Redis: relaunched (their store emptied) for each scenario.
STORE_TARGETS = ("ours-pg", "ours-pg-uv", "ours-redis", "ours-redis-uv")


def baselines_of(name: str, names: tuple[str, ...]) -> list[str]:
    """The hand-written targets in ``names`` served like ``name`` (same server config)."""
    uv = name.endswith("-uv")
    return [n for n in names if n.startswith("inline") and n.endswith("-uv") == uv]


RoundFn = Callable[[Driver, TargetProcess], Awaitable[RoundResult]]


def _scenarios(quick: bool) -> dict[str, tuple[str, RoundFn, int, tuple[str, ...]]]:
    """name -> (description, one round, rounds, targets)."""
    serial_n = 150 if quick else 300
    burst_n = 600 if quick else 1500
    variant_n = 400 if quick else burst_n  # tracing and client variants: several targets
    open_s = 3.0 if quick else 8.0
    turns = 2 if quick else 5
    r = 3 if quick else 5
    # Both server configurations; the quick run leaves out the httpx (not httpx2) baseline.
    both = ("ours", "inline-httpx2", "ours-uv", "inline-httpx2-uv")
    main = both if quick else (*both[:2], "inline-httpx", *both[2:])
    stores = (*STORE_TARGETS, "inline-httpx2", "inline-httpx2-uv")

    async def serial(d: Driver, t: TargetProcess) -> RoundResult:
        return await d.serial(t, serial_n)

    async def open_loop(d: Driver, t: TargetProcess) -> RoundResult:
        return await d.open_loop(t, rate=50.0, duration=open_s, latency=0.025)

    async def saturation(d: Driver, t: TargetProcess) -> RoundResult:
        return await d.burst(t, sessions=burst_n, concurrency=64)

    async def variant(d: Driver, t: TargetProcess) -> RoundResult:
        return await d.burst(t, sessions=variant_n, concurrency=64)

    async def turn64(d: Driver, t: TargetProcess) -> RoundResult:
        return await d.burst(t, sessions=turns, calls_each=64, concurrency=1)

    async def slow(d: Driver, t: TargetProcess) -> RoundResult:
        return await d.burst(t, sessions=1000, concurrency=64, tool="slow_lookup")

    async def big(d: Driver, t: TargetProcess) -> RoundResult:
        return await d.serial(t, 3, tool="big_report")

    clients = (
        "ours",
        "ours-on-httpx",
        "ours-on-httpx2",
        "ours-on-httpx-aiohttp",
        "ours-memory-store",
        BASELINE,
    )
    return {
        "serial": (f"One call at a time, {serial_n} calls a round.", serial, r, main),
        "open-loop": (
            f"50 deliveries/s for {open_s:.0f} s, 25 ms simulated API latency on every "
            "Agents API answer.",
            open_loop,
            2 if quick else 5,
            MAIN,
        ),
        "saturation": (
            f"{burst_n} single-call deliveries through 64 sender connections, each sending "
            "its next delivery as soon as the last was acknowledged (64 in flight).",
            saturation,
            r,
            main,
        ),
        "store-serial": (
            f"One call at a time, {serial_n} calls a round, agentfn-asgi on PostgreSQL and on "
            "Redis (each store emptied before the scenario), both server configurations.",
            serial,
            2 if quick else 3,
            stores,
        ),
        "store-saturation": (
            f"{burst_n} single-call deliveries, 64 in flight, agentfn-asgi on PostgreSQL and "
            "on Redis (each store emptied before the scenario), both server configurations.",
            saturation,
            2 if quick else 3,
            stores,
        ),
        "turn64": (
            f"{turns} sessions one after the other, each one turn with 64 parallel calls "
            "and one delivery.",
            turn64,
            r,
            MAIN,
        ),
        "slow1000": (
            "1,000 sessions with one 1 s handler each, delivered through 64 connections.",
            slow,
            1 if quick else 2,
            MAIN,
        ),
        "big-result": (
            f"3 calls a round returning {BIG_RESULT_SIZE / 2**20:.2f} MiB of text each, after "
            "one unmeasured such round; RSS growth is the peak over the round above the RSS "
            "before it.",
            big,
            2 if quick else 3,
            MAIN,
        ),
        "tracing": (
            f"The saturation load ({variant_n} deliveries, 64 in flight) against agentfn-asgi "
            "without telemetry, with Telemetry on the API's no-op providers, and with an SDK "
            "TracerProvider (BatchSpanProcessor, null exporter) and MeterProvider.",
            variant,
            2 if quick else 4,
            ("ours", "ours-tracing-api", "ours-tracing-sdk"),
        ),
        "http-client": (
            f"The saturation load ({variant_n} deliveries, 64 in flight) against agentfn-asgi "
            "on the client it builds (aiohttp) and on an injected httpx.AsyncClient, "
            "httpx2.AsyncClient and httpx-aiohttp HttpxAiohttpClient (64 connections each); "
            "and, to price durability, on the in-memory store.",
            variant,
            2 if quick else 3,
            clients,
        ),
    }


async def _run_rounds(
    driver: Driver,
    procs: dict[str, TargetProcess],
    description: str,
    fn: RoundFn,
    rounds: int,
    names: tuple[str, ...],
    warm: RoundFn | None = None,
) -> dict[str, Any]:
    for name in names:  # warm-up: connections, lazy imports, caches
        await driver.serial(procs[name], 20)
        if warm is not None:  # the scenario's own load once, unmeasured (steady state)
            await warm(driver, procs[name])
    per_target: dict[str, list[RoundResult]] = {name: [] for name in names}
    for i in range(rounds):
        # Rotate the order each round (A B C, B C A, ...) so no target always runs first.
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            result = await fn(driver, procs[name])
            per_target[name].append(result)
            m = result.metrics
            print(
                f"  round {i + 1}/{rounds} {name:24s} {m['calls_per_s']:7.1f} calls/s "
                f"ack p99 {m['ack_p99_ms']:7.1f} ms  d2r p50 {m['d2r_p50_ms']:8.1f} ms "
                f"lost {result.lost} dup {result.duplicates}",
                file=sys.stderr,
                flush=True,
            )
    targets: dict[str, Any] = {}
    for name, results in per_target.items():
        keys = results[0].metrics.keys()
        targets[name] = {
            "metrics": {k: summarise([r.metrics[k] for r in results]) for k in keys},
            "lost": sum(r.lost for r in results),
            "duplicates": sum(r.duplicates for r in results),
        }
    ratios: dict[str, Any] = {}
    pairs: list[tuple[str, str]] = []
    for mine in names:
        if mine.startswith("inline"):
            continue
        # Each of ours against the hand-written endpoint served the same way ...
        pairs += [(mine, base) for base in baselines_of(mine, names)]
        # ... and a variant of ours (tracing, client, store) against plain ours.
        if mine != "ours" and "ours" in names and not mine.endswith("-uv"):
            pairs.append((mine, "ours"))
    for mine, base in pairs:
        ratios[f"{mine} / {base}"] = {
            key: ratio_summary(
                [r.metrics[key] for r in per_target[mine]],
                [r.metrics[key] for r in per_target[base]],
            )
            for key in ("calls_per_s", "cpu_us_per_call", "d2r_p50_ms", "ack_p99_ms")
        }
    return {"description": description, "targets": targets, "ratios": ratios}


async def _store_growth(quick: bool, tmp: str) -> dict[str, Any]:
    from benchmarks.store_growth import measure_round, prefill

    big_n = 100_000 if quick else 1_000_000
    small, big = Path(tmp, "growth-small.sqlite3"), Path(tmp, "growth-big.sqlite3")
    started = time.perf_counter()
    await prefill(small, 1000)
    await prefill(big, big_n)
    fill_s = time.perf_counter() - started
    calls, rounds = (500, 3) if quick else (1000, 5)
    smalls: list[float] = []
    bigs: list[float] = []
    for _ in range(rounds):
        smalls.append(await measure_round(small, calls) * 1e6)
        bigs.append(await measure_round(big, calls) * 1e6)
    s, b, ratio = summarise(smalls), summarise(bigs), ratio_summary(bigs, smalls)
    table = (
        "| recorded calls | µs per call (median, min–max) |\n|---:|---:|\n"
        f"| 1,000 | {s['median']:.0f} ({s['min']:.0f}–{s['max']:.0f}) |\n"
        f"| {big_n:,} | {b['median']:.0f} ({b['min']:.0f}–{b['max']:.0f}) |\n\n"
        f"Growth (per-round ratio): {ratio['median']:.3f} ({ratio['min']:.3f}–{ratio['max']:.3f})"
        f"; pre-filling took {fill_s:.0f} s."
    )
    return {
        "description": (
            f"SQLite store work of one single-call delivery (record, claim, save, mark "
            f"submitted, resolve, list session calls), {calls} sequential calls a round, "
            f"files pre-filled with 1,000 and {big_n:,} calls; rounds alternate."
        ),
        "rows": big_n,
        "small_us": s,
        "big_us": b,
        "growth": ratio,
        "table": table,
    }


async def _micro(quick: bool) -> dict[str, Any]:
    from benchmarks.micro import run_micro

    rows = await run_micro(0.2 if quick else 1.0)
    lines = ["| operation | best µs | median µs |", "|---|---:|---:|"]
    lines += [f"| {r['name']} | {r['best_us']:.1f} | {r['median_us']:.1f} |" for r in rows]
    return {
        "description": "Best and median of 5 timed runs, µs per operation, in-process.",
        "rows": rows,
        "table": "\n".join(lines),
    }


def _med(results: dict[str, Any], scenario: str, target: str, key: str) -> float:
    try:
        value: float = results["scenarios"][scenario]["targets"][target]["metrics"][key]["median"]
    except KeyError:
        return math.nan
    return value


def _ratio(results: dict[str, Any], scenario: str, label: str, key: str) -> float:
    try:
        value: float = results["scenarios"][scenario]["ratios"][label][key]["median"]
    except KeyError:
        return math.nan
    return value


def _check(scenario: str, target: str, value: float, ok: bool, text: str) -> Check:
    return Check(scenario, target, text, None if math.isnan(value) else ok)


def checks(results: dict[str, Any]) -> list[Check]:
    """Each target of the issue against this run's numbers, on both server configurations."""
    out: list[Check] = []
    sc = results["scenarios"]

    def counters(name: str, target: str) -> tuple[int, int]:
        t = sc.get(name, {}).get("targets", {}).get(target, {})
        return t.get("lost", 0), t.get("duplicates", 0)

    for uv, ack_limit in (("", 20.0), ("-uv", 10.0)):
        ours, base = f"ours{uv}", f"{BASELINE}{uv}"
        label = f"{ours} / {base}"
        if "serial" in sc:
            v = _ratio(results, "serial", label, "calls_per_s")
            out.append(_check("serial", f"{ours}: calls/s ≥ 1.1× {base}", v, v >= 1.1, f"{v:.2f}×"))
        if "saturation" in sc:
            v = _ratio(results, "saturation", label, "calls_per_s")
            out.append(
                _check("saturation", f"{ours}: calls/s ≥ 2.0× {base}", v, v >= 2.0, f"{v:.2f}×")
            )
            v = _ratio(results, "saturation", label, "cpu_us_per_call")
            cpu = _med(results, "saturation", ours, "cpu_us_per_call")
            out.append(
                _check(
                    "saturation",
                    f"{ours}: CPU per call ≤ 0.5× {base}",
                    v,
                    v <= 0.5,
                    f"{v:.2f}× ({cpu / 1e3:.2f} ms)",
                )
            )
            p99 = _med(results, "saturation", ours, "ack_p99_ms")
            out.append(
                _check(
                    "saturation",
                    f"{ours}: ack p99 ≤ {ack_limit:.0f} ms",
                    p99,
                    p99 <= ack_limit,
                    f"{p99:.1f} ms",
                )
            )
            half = _med(results, "saturation", ours, "second_half_rate_ratio")
            out.append(
                _check(
                    "saturation",
                    f"{ours}: no collapse (2nd/1st half ≥ 0.8)",
                    half,
                    half >= 0.8,
                    f"{half:.2f}",
                )
            )
        for store in ("pg", "redis"):
            mine = f"ours-{store}{uv}"
            if "store-saturation" in sc:
                v = _ratio(results, "store-saturation", f"{mine} / {base}", "calls_per_s")
                rt = _med(results, "store-saturation", mine, "store_round_trips_per_call")
                out.append(
                    _check(
                        "store-saturation",
                        f"{mine}: calls/s ≥ 1.2× {base}",
                        v,
                        v >= 1.2,
                        f"{v:.2f}× ({rt:.1f} round trips/call)",
                    )
                )
    lost = dup = 0
    for name, scenario in sc.items():
        for target in scenario.get("targets", {}):
            one_lost, one_dup = counters(name, target)
            lost, dup = lost + one_lost, dup + one_dup
    out.append(
        Check("all", "0 lost, 0 duplicates, every target", f"{lost}, {dup}", not lost and not dup)
    )
    if "open-loop" in sc:
        p50 = _med(results, "open-loop", "ours", "ack_p50_ms")
        p99 = _med(results, "open-loop", "ours", "ack_p99_ms")
        out.append(_check("open-loop", "ack p50 ≤ 2 ms", p50, p50 <= 2, f"{p50:.2f} ms"))
        out.append(_check("open-loop", "ack p99 ≤ 8 ms", p99, p99 <= 8, f"{p99:.2f} ms"))
        v = _ratio(results, "open-loop", f"ours / {BASELINE}", "d2r_p50_ms")
        out.append(_check("open-loop", "d→r p50 ≤ 1.1× inline-httpx2", v, v <= 1.1, f"{v:.2f}×"))
    if "turn64" in sc:
        v = _ratio(results, "turn64", f"ours / {BASELINE}", "calls_per_s")
        out.append(_check("turn64", "calls/s ≥ 1.2× inline-httpx2", v, v >= 1.2, f"{v:.2f}×"))
    if "slow1000" in sc:
        wall = _med(results, "slow1000", "ours", "wall_s")
        out.append(_check("slow1000", "wall ≤ 2 s", wall, wall <= 2, f"{wall:.2f} s"))
        growth = _med(results, "slow1000", "ours", "rss_growth_mib")
        out.append(
            _check("slow1000", "bounded memory", growth, growth < 100, f"+{growth:.1f} MiB peak")
        )
    if "store-growth" in sc:
        g = sc["store-growth"]["growth"]["median"]
        out.append(_check("store-growth", "per-call cost growth ≤ 10 %", g, g <= 1.10, f"{g:.3f}×"))
    if "big-result" in sc:
        growth = _med(results, "big-result", "ours", "rss_growth_mib") * 2**20 / BIG_RESULT_SIZE
        out.append(
            _check("big-result", "RSS growth ≤ 3× result", growth, growth <= 3, f"{growth:.2f}×")
        )
    if "tracing" in sc:
        for variant, limit in (("ours-tracing-sdk", 0.90), ("ours-tracing-api", 0.98)):
            v = _ratio(results, "tracing", f"{variant} / ours", "calls_per_s")
            out.append(
                _check(
                    "tracing", f"{variant} ≥ {limit:.2f}× throughput", v, v >= limit, f"{v:.2f}×"
                )
            )
    return out


def _machine() -> dict[str, Any]:
    cpu = platform.processor() or "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions = []
    for dist in ("agentfn-asgi", "httpx", "httpcore", "httpx2", "uvicorn", "starlette", "sniffio"):
        try:
            versions.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            versions.append(f"{dist} absent")
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": ", ".join(versions),
        "load_before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


async def run(
    *, quick: bool, only: list[str] | None = None, partial: Path | None = None
) -> dict[str, Any]:
    """Run the selected scenarios; returns the results document (also written to
    ``partial`` after each scenario, so a failure late in a long run loses nothing)."""
    started = time.perf_counter()
    secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    scenarios = _scenarios(quick)
    names = only or [*scenarios, "store-growth", "micro"]
    unknown = set(names) - {*scenarios, "store-growth", "micro"}
    if unknown:
        raise SystemExit(f"unknown scenario(s) {sorted(unknown)}; known: {[*scenarios]}")
    results: dict[str, Any] = {"mode": "quick" if quick else "full", "machine": _machine()}
    results["scenarios"] = {}
    api = BenchAPI()
    api_url = await api.start()
    driver = Driver(api, secret)
    needed = sorted({t for n in names if n in scenarios for t in scenarios[n][3]})
    with tempfile.TemporaryDirectory(prefix="agentfn-bench-") as tmp:

        def target(name: str) -> TargetProcess:
            return TargetProcess(name, TARGETS[name], api_url=api_url, secret=secret, store_dir=tmp)

        procs = {name: target(name) for name in needed if name not in STORE_TARGETS}
        try:
            for proc in procs.values():
                proc.launch()
            await asyncio.gather(*(p.wait_ready() for p in procs.values()))
            for name in names:
                print(f"== {name}", file=sys.stderr, flush=True)
                fresh = [t for t in scenarios.get(name, ("", None, 0, ()))[3] if t in STORE_TARGETS]
                for t in fresh:  # a new process empties its store when it starts
                    if t in procs:
                        procs[t].stop()
                    procs[t] = target(t)
                    procs[t].launch()
                await asyncio.gather(*(procs[t].wait_ready() for t in fresh))
                if name == "store-growth":
                    results["scenarios"][name] = await _store_growth(quick, tmp)
                elif name == "micro":
                    results["scenarios"][name] = await _micro(quick)
                else:
                    description, fn, rounds, targets = scenarios[name]
                    # A big result's first round also grows caches and heaps once for good.
                    warm = fn if name == "big-result" else None
                    results["scenarios"][name] = await _run_rounds(
                        driver, procs, description, fn, rounds, targets, warm
                    )
                if partial is not None:
                    text = json.dumps(results, indent=1, default=str)
                    await asyncio.to_thread(partial.write_text, text)
        finally:
            for proc in procs.values():
                proc.stop()
            await api.stop()
    results["machine"]["load_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    results["elapsed_s"] = time.perf_counter() - started
    results["checks"] = [
        {"scenario": c.scenario, "target": c.target, "measured": c.measured, "verdict": c.verdict}
        for c in checks(results)
    ]
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short rounds (about 3 minutes)")
    parser.add_argument("--scenario", action="append", help="run only this scenario (repeatable)")
    parser.add_argument("--output", type=Path, default=RESULTS_DIR, help="results directory")
    args = parser.parse_args(argv)
    args.output.mkdir(parents=True, exist_ok=True)
    partial = args.output / "partial.json"
    results = asyncio.run(run(quick=args.quick, only=args.scenario, partial=partial))
    report = markdown(results, checks(results))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.output / f"bench-{stamp}.json").write_text(json.dumps(results, indent=1, default=str))
    (args.output / f"bench-{stamp}.md").write_text(report + "\n")
    (args.output / "latest.json").write_text(json.dumps(results, indent=1, default=str))
    (args.output / "latest.md").write_text(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
