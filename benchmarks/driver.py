"""The load driver: target processes, the scenarios, and what one round measures.

Process layout (2 cores): the driver and the lean Agents API (:mod:`benchmarks.bench_api`)
share one process and one event loop, so the driver sees each accepted result the instant
it happens; each target runs in its own process under uvicorn. Only one target is driven at
a time, the others sit idle, so the machine's two cores are split driver+API / target.

One round of a scenario against one target yields a :class:`RoundResult`: calls per second,
webhook ack latency p50/p99, delivery-to-result latency p50/p99, the target's CPU time per
call and peak RSS, and the correctness counters (lost calls, duplicate submissions).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from agentfn_asgi.demo import free_port
from benchmarks.bench_api import BenchAPI, CallId
from benchmarks.handlers import BIG_RESULT_SIZE
from benchmarks.sender import Delivery, Sender

__all__ = [
    "Driver",
    "RoundResult",
    "Scenario",
    "TargetProcess",
    "percentile",
]

_REPO = Path(__file__).resolve().parent.parent

Plan = Callable[["Driver", "TargetProcess"], Awaitable["RoundResult"]]


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) by linear interpolation; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


class TargetProcess:
    """One target app under uvicorn in a child process, with its CPU and memory readings."""

    def __init__(
        self,
        name: str,
        args: list[str],
        *,
        api_url: str,
        secret: str,
        store_dir: str,
        code: Path | None = None,
    ):
        self.name = name
        # Another checkout's agentfn_asgi (``benchmarks.ab``): run from there, with this
        # checkout's benchmarks package linked in.
        self._cwd = code or _REPO
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/webhooks"
        self._argv = [
            sys.executable,
            "-m",
            "benchmarks.target_app",
            "--name",
            name,
            *args,
            "--port",
            str(self.port),
            "--api",
            api_url,
            "--secret",
            secret,
            "--store-dir",
            store_dir,
        ]
        self._popen: subprocess.Popen[bytes] | None = None
        self.proc: psutil.Process | None = None

    def launch(self) -> None:
        """Start the process (returns at once; see :meth:`wait_ready`)."""
        self._popen = subprocess.Popen(self._argv, cwd=self._cwd)
        self.proc = psutil.Process(self._popen.pid)

    async def counters(self) -> dict[str, float]:
        """The store round-trip counters (:mod:`benchmarks.roundtrips`); empty when not counted."""
        if "--count-round-trips" not in self._argv:
            return {}
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(b"GET /bench/counters HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            raw = await reader.read()
        finally:
            writer.close()
        counts: dict[str, float] = json.loads(raw.partition(b"\r\n\r\n")[2])
        return counts

    async def wait_ready(self) -> None:
        """Poll ``GET /ready`` until the app answers 200 (30 s at most)."""
        assert self._popen is not None
        async with asyncio.timeout(30.0):
            while True:
                if self._popen.poll() is not None:
                    raise RuntimeError(f"target {self.name} exited: {self._popen.returncode}")
                with contextlib.suppress(OSError):
                    reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                    writer.write(b"GET /ready HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
                    line = await reader.readline()
                    writer.close()
                    if b" 200 " in line:
                        return
                await asyncio.sleep(0.1)

    def stop(self) -> None:
        if self._popen is not None and self._popen.poll() is None:
            self._popen.terminate()
            try:
                self._popen.wait(10)
            except subprocess.TimeoutExpired:
                self._popen.kill()
                self._popen.wait()

    def cpu_seconds(self) -> float:
        assert self.proc is not None
        times = self.proc.cpu_times()
        return float(times.user + times.system)

    def rss(self) -> int:
        assert self.proc is not None
        return int(self.proc.memory_info().rss)

    def reset_peak(self) -> None:
        """Reset the kernel's peak-RSS mark (VmHWM) to the current RSS (Linux)."""
        assert self.proc is not None
        with contextlib.suppress(OSError), open(f"/proc/{self.proc.pid}/clear_refs", "w") as fh:
            fh.write("5")

    def peak_rss(self) -> int:
        assert self.proc is not None
        try:
            with open(f"/proc/{self.proc.pid}/status") as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return self.rss()


@dataclass(slots=True)
class RoundResult:
    """The metrics of one round of one scenario against one target."""

    metrics: dict[str, float] = field(default_factory=dict)
    lost: int = 0
    duplicates: int = 0


@dataclass(frozen=True, slots=True)
class Scenario:
    """A named load pattern; ``plan`` runs one round against one target."""

    name: str
    description: str
    plan: Plan
    rounds: int
    targets: tuple[str, ...]


class Driver:
    """Owns the bench API and the sender; runs rounds of scenarios against targets."""

    def __init__(self, api: BenchAPI, secret: str, *, result_timeout: float = 60.0) -> None:
        self.api = api
        self.secret = secret
        self.result_timeout = result_timeout
        self._own = psutil.Process()

    # -- measurement around one round -------------------------------------------------------
    async def measure(
        self,
        target: TargetProcess,
        calls: list[CallId],
        send: Callable[[Sender], Awaitable[list[Delivery]]],
        *,
        latency: float = 0.0,
    ) -> RoundResult:
        """Run ``send``, wait for every call's result, and compute the round's metrics."""
        api = self.api
        api.latency = latency
        api.reset_stats()
        sender = Sender(target.url, self.secret)
        counts_before = await target.counters()
        target.reset_peak()
        rss_before = target.rss()
        cpu_before = target.cpu_seconds()
        own_before = self._own.cpu_times()
        started = time.perf_counter()
        try:
            deliveries = await send(sender)
            futures = [api.result_future(c) for c in calls]
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.result_timeout):
                    await asyncio.gather(*futures, return_exceptions=True)
            done_at = [f.result() for f in futures if f.done() and not f.cancelled()]
            finished = max(done_at) if done_at else time.perf_counter()
            # Let trailing bookkeeping (mark submitted, resolve delivery) land in the CPU count.
            await asyncio.sleep(0.1)
        finally:
            await sender.close()
            api.latency = 0.0
        cpu = target.cpu_seconds() - cpu_before
        own = self._own.cpu_times()
        counts_after = await target.counters()
        stats = api.reset_stats()
        wall = max(finished - started, 1e-9)
        sent_at = {d.session_id: d.sent_at for d in deliveries}
        d2r = [
            api.accepted_at[c] - sent_at[c[0]]
            for c in calls
            if c in api.accepted_at and c[0] in sent_at
        ]
        acks = [d.ack_latency for d in deliveries if not math.isnan(d.ack_latency)]
        lost = sum(1 for c in calls if c not in api.accepted_at)
        # Throughput in the second half of the completions against the first: a collapse
        # under a growing backlog shows as a ratio well below 1.
        ordered = sorted(done_at)
        half_ratio = math.nan
        if len(ordered) >= 20:
            mid = len(ordered) // 2
            first = ordered[mid] - started
            second = ordered[-1] - ordered[mid]
            if first > 0 and second > 0:
                half_ratio = ((len(ordered) - mid) / second) / (mid / first)
        metrics = {
            "calls": float(len(calls)),
            "wall_s": wall,
            "calls_per_s": len(calls) / wall,
            "ack_p50_ms": percentile(acks, 0.5) * 1e3,
            "ack_p99_ms": percentile(acks, 0.99) * 1e3,
            "d2r_p50_ms": percentile(d2r, 0.5) * 1e3,
            "d2r_p99_ms": percentile(d2r, 0.99) * 1e3,
            "cpu_us_per_call": cpu / max(len(calls), 1) * 1e6,
            "target_cpu_util": cpu / wall,
            "peak_rss_mib": target.peak_rss() / 2**20,
            "rss_growth_mib": (target.peak_rss() - rss_before) / 2**20,
            "driver_cpu_util": (own.user + own.system - own_before.user - own_before.system) / wall,
            "second_half_rate_ratio": half_ratio,
            "sender_retries": float(sender.retries),
            "replays": float(stats.replays),
            "api_posts_per_call": stats.posts / max(len(calls), 1),
            "api_gets_per_call": stats.gets / max(len(calls), 1),
        }
        for key in ("round_trips", "statements", "commits"):
            done = counts_after.get(key, math.nan) - counts_before.get(key, math.nan)
            metrics[f"store_{key}_per_call"] = done / max(len(calls), 1)
        api.forget(calls)
        return RoundResult(metrics, lost=lost, duplicates=stats.duplicates + stats.unknown)

    # -- load patterns ----------------------------------------------------------------------
    def sessions(self, n: int, calls_each: int, tool: str) -> tuple[list[str], list[CallId]]:
        """``n`` sessions with ``calls_each`` pending calls of ``tool`` each."""
        sids: list[str] = []
        calls: list[CallId] = []
        for i in range(n):
            sid, ids = self.api.create_session(
                [(tool, _arguments(tool, i * calls_each + j)) for j in range(calls_each)]
            )
            sids.append(sid)
            calls.extend(ids)
        return sids, calls

    async def serial(
        self, target: TargetProcess, n: int, tool: str = "get_customer"
    ) -> RoundResult:
        """One call at a time: deliver, wait for its result, then the next."""
        sids, calls = self.sessions(n, 1, tool)

        async def send(sender: Sender) -> list[Delivery]:
            conn = sender.connection()
            out = []
            try:
                for sid, call in zip(sids, calls, strict=True):
                    out.append(await sender.deliver(sid, conn))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(
                            asyncio.shield(self.api.result_future(call)), self.result_timeout
                        )
            finally:
                await conn.close()
            return out

        return await self.measure(target, calls, send)

    async def open_loop(
        self, target: TargetProcess, *, rate: float, duration: float, latency: float
    ) -> RoundResult:
        """Deliveries at a fixed rate whatever the answers (a connection each when busy)."""
        n = max(1, int(rate * duration))
        sids, calls = self.sessions(n, 1, "get_customer")

        async def send(sender: Sender) -> list[Delivery]:
            start = time.perf_counter()
            tasks = []
            for i, sid in enumerate(sids):
                delay = start + i / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(sender.deliver(sid)))
            return list(await asyncio.gather(*tasks))

        return await self.measure(target, calls, send, latency=latency)

    async def burst(
        self,
        target: TargetProcess,
        *,
        sessions: int,
        calls_each: int = 1,
        concurrency: int = 64,
        tool: str = "get_customer",
    ) -> RoundResult:
        """``sessions`` deliveries through ``concurrency`` sender connections, as fast as acked.

        For the inline baseline an ack means the result was submitted, so this is a closed
        loop with ``concurrency`` calls in flight; for agentfn-asgi the ack comes first and
        the backlog of recorded deliveries grows while the calls are worked off.
        """
        sids, calls = self.sessions(sessions, calls_each, tool)

        async def send(sender: Sender) -> list[Delivery]:
            queue = list(reversed(sids))
            out: list[Delivery] = []

            async def worker() -> None:
                conn = sender.connection()
                try:
                    while queue:
                        out.append(await sender.deliver(queue.pop(), conn))
                finally:
                    await conn.close()

            await asyncio.gather(*(worker() for _ in range(min(concurrency, len(sids)))))
            return out

        return await self.measure(target, calls, send)


def _arguments(tool: str, i: int) -> dict[str, Any]:
    if tool == "big_report":
        return {"size": BIG_RESULT_SIZE}
    if tool == "slow_lookup":
        return {"customer_id": f"cus_{i}", "seconds": 1.0}
    return {"customer_id": f"cus_{i}"}
