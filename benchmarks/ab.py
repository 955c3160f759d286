"""A/B of one lever: ``python -m benchmarks.ab --before REF [--after REF] [--target ours-pg]
[--serial] [--calls-each N]``.

Exports the package at git ``REF`` (``git archive``) into a temporary directory and runs the
same load, in interleaved rounds (before, after, after, before, ...), against the target
built from that code and from this checkout's (or from ``--after REF``'s): calls/s, CPU per
call and store round trips per call, with the per-round ratios after / before. The
saturation load sends single-call sessions; ``--calls-each N`` gives each session one turn
of N parallel calls (one delivery). How each lever in ``README.md`` was measured.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.bench_api import BenchAPI
from benchmarks.driver import Driver, RoundResult, TargetProcess
from benchmarks.report import ratio_summary, summarise

__all__ = ["main"]

_REPO = Path(__file__).resolve().parent.parent
KEYS = (
    "calls_per_s",
    "cpu_us_per_call",
    "store_round_trips_per_call",
    "ack_p99_ms",
    "d2r_p50_ms",
    "api_posts_per_call",
)


def _export(ref: str, into: Path) -> None:
    into.mkdir()
    archive = subprocess.run(
        ["git", "archive", ref, "agentfn_asgi"], cwd=_REPO, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    (into / "benchmarks").symlink_to(_REPO / "benchmarks")


async def _ab(
    ref: str,
    target: str,
    calls: int,
    rounds: int,
    serial: bool,
    *,
    after: str | None = None,
    calls_each: int = 1,
) -> str:
    from benchmarks.run import TARGETS

    secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    api = BenchAPI()
    api_url = await api.start()
    driver = Driver(api, secret)
    results: dict[str, list[RoundResult]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="agentfn-ab-") as tmp:
        code = Path(tmp, "before")
        _export(ref, code)
        after_code = None
        if after is not None:
            after_code = Path(tmp, "after")
            _export(after, after_code)
        procs = {
            side: TargetProcess(
                f"{target}-{side}",
                TARGETS[target],
                api_url=api_url,
                secret=secret,
                store_dir=tmp,
                code=code if side == "before" else after_code,
            )
            for side in ("before", "after")
        }
        try:
            for proc in procs.values():
                proc.launch()
            await asyncio.gather(*(p.wait_ready() for p in procs.values()))
            for proc in procs.values():
                await driver.serial(proc, 30)
            for i in range(rounds):
                order = ("before", "after") if i % 2 == 0 else ("after", "before")
                for side in order:
                    proc = procs[side]
                    if serial:
                        result = await driver.serial(proc, calls)
                    else:
                        result = await driver.burst(
                            proc,
                            sessions=max(1, calls // calls_each),
                            calls_each=calls_each,
                            concurrency=64,
                        )
                    results[side].append(result)
                    m = result.metrics
                    print(
                        f"  round {i + 1}/{rounds} {side:6s} {m['calls_per_s']:7.1f} calls/s "
                        f"{m['cpu_us_per_call']:6.0f} µs/call "
                        f"{m['store_round_trips_per_call']:5.1f} RT/call "
                        f"lost {result.lost} dup {result.duplicates}",
                        file=sys.stderr,
                        flush=True,
                    )
        finally:
            for proc in procs.values():
                proc.stop()
            await api.stop()
    lines = [
        f"A/B on {target} ({'serial' if serial else 'saturation'}, {calls} calls"
        f"{f' in turns of {calls_each}' if calls_each > 1 else ''}, {rounds} rounds): "
        f"before = {ref}, after = {after or 'this checkout'}",
        "",
        "| metric | before | after | after / before (per round) |",
        "|---|---:|---:|---:|",
    ]
    for key in KEYS:
        b = summarise([r.metrics[key] for r in results["before"]])
        a = summarise([r.metrics[key] for r in results["after"]])
        ratio = ratio_summary(
            [r.metrics[key] for r in results["after"]],
            [r.metrics[key] for r in results["before"]],
        )
        lines.append(
            f"| {key} | {b['median']:.1f} | {a['median']:.1f} | {ratio['median']:.2f} "
            f"({ratio['min']:.2f}–{ratio['max']:.2f}) |"
        )
    lost = sum(r.lost for side in results.values() for r in side)
    dup = sum(r.duplicates for side in results.values() for r in side)
    lines.append(f"\nlost {lost}, duplicates {dup}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--before", required=True, help="git ref of the code before the lever")
    parser.add_argument("--target", default="ours")
    parser.add_argument("--calls", type=int, default=800)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--after", help="git ref of the code after (default: this checkout)")
    parser.add_argument("--calls-each", type=int, default=1, help="calls per session's turn")
    parser.add_argument("--serial", action="store_true")
    args = parser.parse_args(argv)
    print(
        asyncio.run(
            _ab(
                args.before,
                args.target,
                args.calls,
                args.rounds,
                args.serial,
                after=args.after,
                calls_each=args.calls_each,
            )
        )
    )


if __name__ == "__main__":
    main()
