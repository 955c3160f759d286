"""Where one call's CPU goes, stage by stage: ``python -m benchmarks.profile_stages``.

Runs the saturation load (``--calls`` single-call deliveries, 64 in flight; ``--serial``: one
call at a time) against each ``--target`` in turn (repeatable; default ``ours``: SQLite,
h11 + asyncio; ``ours-uv`` is uvloop + httptools, ``ours-pg``/``ours-redis`` the other stores,
``inline-httpx2`` the hand-written baseline; ``--matrix`` profiles all of them) and, in
alternate rounds of the same load:

- an **unprofiled** round gives the target's CPU per call (user+system, psutil), the figure
  the benchmark tables report;
- a **sampled** round attaches ``py-spy`` (``--nonblocking``: the target is never paused)
  and sorts every sample into one stage by its stack (the innermost frame that names a
  stage wins; see :data:`STAGES`).

Each stage's CPU per call is its share of the samples times the unprofiled CPU per call
(median over the rounds), so the profiler's own overhead does not inflate the figures.
py-spy is a development dependency (``pip install py-spy``); it needs ptrace rights on the
target (root, or ``kernel.yama.ptrace_scope=0``).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from benchmarks.bench_api import BenchAPI
from benchmarks.driver import Driver, RoundResult, TargetProcess

__all__ = ["MATRIX", "STAGES", "classify", "main", "table"]

#: (stage, substrings of a py-spy frame ``function (file:line)``). A sample goes to the stage
#: of its innermost frame named here: the work of one step, wherever it is called from.
STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("record", ("record_delivery (",)),
    ("session read", ("retrieve_session (", "api.get (", "AsyncClient.get (")),
    ("claim", ("claim_call (",)),
    ("handler", ("FunctionTool.invoke (", "parse_arguments (", "get_customer (")),
    ("encode", ("encode_result (", "event_json (", "success_event (")),
    ("save", ("save_result (",)),
    ("submit", ("submit_raw_events (", "api.post (", "AsyncClient.post (")),
    ("mark", ("mark_submitted (", "mark_delivery_resolved (")),
    ("telemetry", ("agentfn_asgi/tracing/",)),
)
#: Samples outside every step above go to the first of these that the callback the event
#: loop was running (its outermost frames) belongs to.
CALLBACKS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "ASGI + verify (uvicorn, starlette, the app)",
        ("uvicorn/", "starlette/", "agentfn_asgi/app.py", "agentfn_asgi/_asgi.py"),
    ),
    ("store, inline batches on the loop", ("agentfn_asgi/store/",)),
    (
        "HTTP client, outside a request's task (socket callbacks)",
        ("aiohttp/", "httpcore", "httpx", "anyio/"),
    ),
    ("store driver callbacks (asyncpg, redis-py)", ("asyncpg/", "redis/")),
    ("dispatch bookkeeping", ("agentfn_asgi/dispatch/",)),
)
STORE_THREAD = "store thread (SQLite statements, commits)"
LOOP_OTHER = "event loop, other"
#: ``--matrix``: both server configurations, the three stores, the baseline on each server.
MATRIX = (
    "ours",
    "ours-uv",
    "ours-pg",
    "ours-pg-uv",
    "ours-redis",
    "ours-redis-uv",
    "inline-httpx2",
    "inline-httpx2-uv",
)
ORDER = [name for name, _ in STAGES] + [name for name, _ in CALLBACKS] + [STORE_THREAD, LOOP_OTHER]


_UVLOOP_RUNNER = "asyncio/runners.py"


def classify(line: str) -> tuple[str, int] | None:
    """One py-spy raw line (``thread (tid): name;frame;...;frame count``) -> (stage, n)."""
    stack, _, count = line.rstrip().rpartition(" ")
    if not stack or not count.isdigit():
        return None
    frames = stack.split(";")
    if "agentfn-sqlite" in frames[0]:
        return STORE_THREAD, int(count)
    # The frames below the callback the loop runs (the outer ones are uvicorn's start-up).
    # In the loop but in no callback: the loop's own work (select, scheduling). A stack
    # without the loop's frames was cut short by the non-blocking read: what it shows.
    runs = [i for i, frame in enumerate(frames) if frame.startswith("Handle._run (")]
    # uvloop runs callbacks from C: the callback's frames sit right under the runner's.
    runner = [i for i, frame in enumerate(frames) if _UVLOOP_RUNNER in frame]
    if runs:
        frames = frames[runs[-1] + 1 :]
    elif any(frame.startswith("BaseEventLoop._run_once (") for frame in frames):
        frames = []
    elif runner:
        frames = frames[runner[-1] + 1 :]
    else:
        frames = frames[1:]
    for frame in reversed(frames):
        for stage, needles in STAGES:
            if any(needle in frame for needle in needles):
                return stage, int(count)
    for frame in frames:
        for stage, needles in CALLBACKS:
            if any(needle in frame for needle in needles):
                return stage, int(count)
    return LOOP_OTHER, int(count)


def _spy(pid: int, out: Path, rate: int) -> subprocess.Popen[bytes]:
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    argv = [exe, "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw"]
    return subprocess.Popen(
        [*argv, "--threads", "--nonblocking", "-o", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def profile(
    target_args: list[str],
    *,
    calls: int,
    rounds: int,
    rate: int,
    keep: Path | None = None,
    serial: bool = False,
    code: Path | None = None,
) -> tuple[float, dict[str, float]]:
    """Run the rounds; returns the unprofiled CPU µs per call and each stage's share."""
    secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()
    api = BenchAPI()
    api_url = await api.start()
    driver = Driver(api, secret)
    cpu: list[float] = []
    shares: list[Counter[str]] = []

    async def load(driver: Driver, proc: TargetProcess) -> RoundResult:
        if serial:
            return await driver.serial(proc, calls)
        return await driver.burst(proc, sessions=calls, concurrency=64)

    with tempfile.TemporaryDirectory(prefix="agentfn-profile-") as tmp:
        proc = TargetProcess(
            "profiled", target_args, api_url=api_url, secret=secret, store_dir=tmp, code=code
        )
        proc.launch()
        try:
            await proc.wait_ready()
            await driver.serial(proc, 50)
            assert proc.proc is not None
            for i in range(rounds):
                plain = await load(driver, proc)
                cpu.append(plain.metrics["cpu_us_per_call"])
                out = Path(tmp, f"spy-{i}.txt")
                spy = _spy(proc.proc.pid, out, rate)
                await asyncio.sleep(0.5)  # py-spy attaches
                sampled = await load(driver, proc)
                spy.send_signal(signal.SIGINT)
                await asyncio.to_thread(spy.wait, 30)
                counts: Counter[str] = Counter()
                text = await asyncio.to_thread(out.read_text)
                if keep is not None:
                    await asyncio.to_thread(Path(keep, out.name).write_text, text)
                for line in text.splitlines():
                    found = classify(line)
                    if found is not None:
                        counts[found[0]] += found[1]
                shares.append(counts)
                lost = plain.lost + sampled.lost
                print(
                    f"  round {i + 1}/{rounds}: {cpu[-1]:.0f} µs/call unprofiled, "
                    f"{sum(counts.values())} samples, lost {lost}, "
                    f"dup {plain.duplicates + sampled.duplicates}",
                    file=sys.stderr,
                    flush=True,
                )
        finally:
            proc.stop()
            await api.stop()
    per_call = statistics.median(cpu)
    return per_call, {
        stage: statistics.median(c[stage] / max(sum(c.values()), 1) for c in shares)
        for stage in ORDER
    }


def table(profiles: dict[str, tuple[float, dict[str, float]]]) -> str:
    """Stage rows, one column per target: µs per call (share)."""
    names = list(profiles)
    lines = ["| stage | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for stage in ORDER:
        cells = [
            f"{cpu * shares[stage]:.0f} ({shares[stage] * 100:.0f} %)"
            for cpu, shares in (profiles[n] for n in names)
        ]
        if any(profiles[n][1][stage] for n in names):
            lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    total = [f"**{profiles[n][0]:.0f}**" for n in names]
    lines.append("| **total (unprofiled CPU per call)** | " + " | ".join(total) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    from benchmarks.run import TARGETS

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", action="append", choices=sorted(TARGETS))
    parser.add_argument("--matrix", action="store_true", help="every server config and store")
    parser.add_argument("--calls", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--keep", type=Path, help="copy py-spy's raw stacks into this folder")
    parser.add_argument("--serial", action="store_true", help="one call at a time instead")
    parser.add_argument(
        "--before", metavar="REF", help="also profile each target on the package at git REF"
    )
    args = parser.parse_args(argv)
    if os.name != "posix":
        raise SystemExit("py-spy attaches to a process: Linux or macOS only")
    targets = args.target or ["ours"]
    if args.matrix:
        targets = [*MATRIX]
    profiles = {}
    with tempfile.TemporaryDirectory(prefix="agentfn-before-") as tmp:
        code = None
        if args.before:
            from benchmarks.ab import _export

            code = Path(tmp, "code")
            _export(args.before, code)
        runs: list[tuple[str, Path | None]] = [(name, None) for name in targets]
        if code is not None:
            runs = [
                run for name in targets for run in ((f"{name}@{args.before}", code), (name, None))
            ]
        for label, where in runs:
            name = label.partition("@")[0]
            print(f"== {label}", file=sys.stderr, flush=True)
            keep = None
            if args.keep is not None:
                keep = Path(args.keep, label)
                keep.mkdir(parents=True, exist_ok=True)
            profiles[label] = asyncio.run(
                profile(
                    TARGETS[name],
                    calls=args.calls,
                    rounds=args.rounds,
                    rate=args.rate,
                    keep=keep,
                    serial=args.serial,
                    code=where,
                )
            )
    load = "serial" if args.serial else f"saturation, {args.calls} calls a round"
    print(f"### CPU µs per call by stage ({load})\n\n{table(profiles)}")


if __name__ == "__main__":
    main()
