"""A waiting line on one limit, at scale: ``python -m benchmarks.waiting_line``.

One of the curves ``make bench-scale`` (:mod:`benchmarks.scale`) runs; not part of ``make test``.

One session makes one turn of N parallel calls of one limited tool, and the package's own
:class:`~agentfn_asgi.dispatch.Dispatcher` (in this process, on a real store, the package's
fake Agents API reached in process over ``httpx.ASGITransport``) resolves it: one call runs,
the others wait in the line. Two tools:

- ``rate``: ``rate="10/s"`` (burst 1), a handler that returns at once: 10 starts/s at best;
- ``concurrency``: ``concurrency=2``, a handler that sleeps 0.2 s: 10 starts/s at best.

For each store (SQLite, PostgreSQL, Redis), tool and line length N (10, 100, 300, 1,000):
**line formed in**, the time to claim the N calls (``resolve`` returns once every claim is
decided: one runs, the others wait); then, from that moment, the next ``--starts`` calls
(all of them when N is smaller) are timed: **starts/s** from the first to the last counted
start, and **polls per start**, the store's admission requests (``admit_call``)
over the same time, with the batches that keep the other waiters' places
(``keep_places``) counted apart. Then the dispatcher stops (the rest of the line is
abandoned with the store, which is thrown away).

With ``--ping-line`` (600 by default; 0: none), a separate process pings the Redis server
every 5 ms while an extra Redis row of that line length runs: its p99 says what every other
client of that Redis (other replicas, other applications) sees while the line waits; with
it, the share of a CPU the Redis server used meanwhile (its ``INFO cpu``).

The targets (issue "waiting that costs per admission"): at least 9 starts/s at every N on
every store, polls per start at most a small constant, Redis PING p99 under 10 ms. Nothing
here is asserted by tests (``tests/test_benchmarks_waiting_line.py`` runs a tiny line once
and checks that every counted call started once).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx

from agentfn_asgi.client import AgentsClient
from agentfn_asgi.dispatch import Dispatcher, DispatchSettings
from agentfn_asgi.store import Store, open_store
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall
from agentfn_asgi.tools import FunctionTools

__all__ = ["LINES", "Row", "Starts", "build_tools", "main", "measure"]

#: The line lengths of the table.
LINES = (10, 100, 300, 1000)
STORES = ("sqlite", "postgres", "redis")
TOOLS = ("rate", "concurrency")
REDIS_URL = "redis://127.0.0.1:6379/0"
POSTGRES_URL = "postgresql://postgres@127.0.0.1:5432/test"
#: The concurrency tool's handler time: two slots of 0.2 s make 10 starts/s at best.
HOLD_SECONDS = 0.2


@dataclass(frozen=True, slots=True)
class Row:
    """One measured line: what it was and what it gave."""

    store: str
    tool: str
    line: int
    formed_s: float
    starts: int
    starts_per_s: float
    polls_per_start: float
    keeps_per_start: float
    ping_p99_ms: float | None = None
    #: The share of a CPU the Redis server used while it was pinged.
    redis_cpu: float | None = None
    #: What went wrong, when the line could not be measured (the store failed).
    error: str = ""


class Starts:
    """The start times (monotonic) of the runs; once :meth:`count_from` says from when, an
    event set when ``wanted`` runs started since then."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.since = float("inf")
        self.wanted = 0
        self.enough = asyncio.Event()

    def append(self, at: float) -> None:
        self.times.append(at)
        self._check()

    def count_from(self, since: float, wanted: int) -> None:
        self.since, self.wanted = since, wanted
        self._check()

    def counted(self) -> list[float]:
        return [t for t in self.times if t >= self.since][: self.wanted]

    def _check(self) -> None:
        if self.since < float("inf") and self.counted_so_far() >= self.wanted:
            self.enough.set()

    def counted_so_far(self) -> int:
        return sum(1 for t in self.times if t >= self.since)


def build_tools(started: Starts) -> FunctionTools:
    """The two limited tools; each run notes its start in ``started``."""
    tools = FunctionTools()

    @tools.function(rate="10/s")
    async def rated(n: int) -> str:
        """A rated call."""
        started.append(time.monotonic())
        return str(n)

    @tools.function(concurrency=2)
    async def held(n: int) -> str:
        """A call holding one of two slots for a while."""
        started.append(time.monotonic())
        await asyncio.sleep(HOLD_SECONDS)
        return str(n)

    return tools


@contextlib.asynccontextmanager
async def _fresh_store(kind: str, tmp: Path) -> AsyncIterator[str]:
    """The URL of a new, empty store of ``kind``; thrown away after."""
    tag = secrets.token_hex(4)
    if kind == "sqlite":
        yield f"sqlite:///{tmp / f'line-{tag}.sqlite3'}"
        return
    if kind == "redis":
        url = f"{REDIS_URL}?key_prefix=afn-bench-line-{tag}:"
    else:
        url = f"{POSTGRES_URL}?schema=afn_bench_line_{tag}"
    try:
        yield url
    finally:
        store = open_store(url)
        try:
            await store.destroy()  # type: ignore[attr-defined]
        finally:
            await store.close()


def _counted(store: Store, name: str, counts: dict[str, int]) -> None:
    """Count the calls of ``store.<name>`` (when the store has it) into ``counts``."""
    method = getattr(store, name, None)
    if method is None:
        return
    counts[name] = 0

    async def counting(*args: Any, **kwargs: Any) -> Any:
        counts[name] += 1
        return await method(*args, **kwargs)

    setattr(store, name, counting)


async def measure(
    kind: str,
    tool: str,
    line: int,
    *,
    starts: int,
    tmp: Path,
    ping: bool = False,
) -> Row:
    """One line of ``line`` calls of ``tool`` on a fresh ``kind`` store; see the module."""
    started = Starts()
    tools = build_tools(started)
    name = "rated" if tool == "rate" else "held"
    async with _fresh_store(kind, tmp) as url, FakeAgentsAPI() as fake:
        store = open_store(url)
        counts: dict[str, int] = {}
        _counted(store, "admit_call", counts)
        _counted(store, "keep_places", counts)
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=fake), base_url="http://fake")
        client = AgentsClient(api_key=fake.api_key, base_url="http://fake/v1", http_client=http)
        dispatcher = Dispatcher(tools, client, store, settings=DispatchSettings())
        await dispatcher.start(recover=False)
        pinging: asyncio.subprocess.Process | None = None
        p99 = redis_cpu = None
        try:
            calls = [FakeCall(name, {"n": n}, call_id=f"c{n:05d}") for n in range(line)]
            session_id = fake.create_session([calls])
            began = time.monotonic()
            await dispatcher.resolve(session_id)  # every call claimed: the line is formed
            formed = time.monotonic()
            # Counted from here: the line's steady state, not the claims' burst before it.
            counted = min(starts, line - len(started.times))
            before = dict(counts)
            started.count_from(formed, counted)
            if ping:
                pinging = await _start_pinging()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(started.enough.wait(), timeout=30 + counted * 2)
            seen = started.counted()
            polls = counts.get("admit_call", 0) - before.get("admit_call", 0)
            keeps = counts.get("keep_places", 0) - before.get("keep_places", 0)
        finally:
            if pinging is not None:
                p99, redis_cpu = await _stop_pinging(pinging)
            await dispatcher.stop(drain_timeout=1.0)
            await client.aclose()
            await http.aclose()
            await store.close()
    # Between the first and the last counted start: the line's pace once it is formed.
    span = seen[-1] - seen[0] if len(seen) > 1 else 0.0
    return Row(
        store=kind,
        tool=tool,
        line=line,
        formed_s=formed - began,
        starts=len(seen),
        starts_per_s=(len(seen) - 1) / span if span > 0 else float("nan"),
        polls_per_start=polls / max(1, len(seen)),
        keeps_per_start=keeps / max(1, len(seen)),
        ping_p99_ms=p99,
        redis_cpu=redis_cpu,
    )


def _ping_forever(interval: float = 0.005) -> None:
    """(The pinging process.) PING Redis every ``interval`` until stdin closes; then print
    the p99 latency in milliseconds and the share of a CPU the server used meanwhile (the
    whole server's: on a shared Redis, other clients' work counts too)."""
    import threading

    import redis

    client = redis.Redis.from_url(REDIS_URL)

    def busy() -> float:
        cpu = client.info("cpu")
        return float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])

    since, busy_before = time.monotonic(), busy()
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    latencies: list[float] = []
    while not stop.is_set():
        began = time.perf_counter()
        client.ping()
        latencies.append(time.perf_counter() - began)
        time.sleep(interval)
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else 0.0
    share = (busy() - busy_before) / max(1e-9, time.monotonic() - since)
    print(f"{p99 * 1000:.3f} {share:.4f}")


async def _start_pinging() -> asyncio.subprocess.Process:
    """A process pinging Redis (:func:`_ping_forever`) until its stdin closes."""
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "benchmarks.waiting_line",
        "--ping-process",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )


async def _stop_pinging(process: asyncio.subprocess.Process) -> tuple[float, float]:
    """Its PING p99 (ms), and the share of a CPU the Redis server used meanwhile."""
    assert process.stdin is not None
    process.stdin.close()
    out, _ = await process.communicate()
    p99, share = [*out.decode().split(), "nan", "nan"][:2]
    return float(p99), float(share)


async def _measured(kind: str, tool: str, line: int, **options: Any) -> Row:
    """:func:`measure`, or a row saying why it could not be measured."""
    try:
        return await measure(kind, tool, line, **options)
    except Exception as exc:  # a store overwhelmed by the line is a result too
        error = f"{type(exc).__name__}: {str(exc)[:80]}"
        nan = float("nan")
        return Row(kind, tool, line, nan, 0, nan, nan, 0.0, error=error)


def _table(rows: list[Row]) -> str:
    lines = [
        "| store | tool | N | line formed in | starts | starts/s | admission polls per start "
        "| keeps per start | Redis PING p99 | Redis CPU |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ping = "" if r.ping_p99_ms is None else f"{r.ping_p99_ms:.1f} ms"
        cpu = "" if r.redis_cpu is None else f"{r.redis_cpu:.0%}"
        if r.error:
            lines.append(f"| {r.store} | {r.tool} | {r.line} | failed: {r.error} |")
            continue
        lines.append(
            f"| {r.store} | {r.tool} | {r.line} | {r.formed_s:.1f} s | {r.starts} "
            f"| {r.starts_per_s:.1f} "
            f"| {r.polls_per_start:.1f} | {r.keeps_per_start:.2f} | {ping} | {cpu} |"
        )
    return "\n".join(lines)


async def run(
    *,
    stores: tuple[str, ...] = STORES,
    tools: tuple[str, ...] = TOOLS,
    lines: tuple[int, ...] = LINES,
    starts: int = 60,
    ping_line: int | None = 600,
) -> list[Row]:
    """Every row of the table (and the PING rows), printed as they come."""
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in stores:
            for tool in tools:
                for line in lines:
                    row = await _measured(kind, tool, line, starts=starts, tmp=Path(tmp))
                    rows.append(row)
                    print(_table([row]).splitlines()[-1], flush=True)
                if kind == "redis" and ping_line:
                    row = await _measured(
                        kind, tool, ping_line, starts=starts, tmp=Path(tmp), ping=True
                    )
                    rows.append(row)
                    print(_table([row]).splitlines()[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.waiting_line", description=__doc__)
    parser.add_argument("--store", action="append", choices=STORES, help="(repeatable)")
    parser.add_argument("--tool", action="append", choices=TOOLS, help="(repeatable)")
    parser.add_argument("--line", action="append", type=int, help="line length (repeatable)")
    parser.add_argument("--starts", type=int, default=60, help="calls timed per line")
    parser.add_argument("--ping-line", type=int, default=600, help="0: no PING rows")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--ping-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ping_process:
        _ping_forever()
        return
    print(_table([]))
    rows = asyncio.run(
        run(
            stores=tuple(args.store or STORES),
            tools=tuple(args.tool or TOOLS),
            lines=tuple(args.line or LINES),
            starts=args.starts,
            ping_line=args.ping_line,
        )
    )
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    rates = [r.starts_per_s for r in rows if r.starts > 1 and not r.error]
    if rates:
        print(f"\nslowest line: {min(rates):.1f} starts/s; median {statistics.median(rates):.1f}")


if __name__ == "__main__":
    main()
