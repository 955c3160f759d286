"""Cost that does not grow, four curves in one run: ``python -m benchmarks.scale``.

``make bench-scale`` runs it (not part of ``make test``; PostgreSQL and Redis must be
running). One table per curve, in turn:

1. **CPU per call against stored calls** (``stored``): each store is filled with 10^3,
   10^4, 10^5 and 10^6 calls and as many deliveries (SQLite and PostgreSQL in bulk, as
   ``benchmarks.page_reads`` does; Redis through the store's own operations, to 10^5 only:
   its fill takes minutes per 10^5 and 10^6 would take most of an hour), then the store
   work of one single-call delivery (record, claim, save, mark submitted, mark resolved,
   list the session's calls) is timed ``--calls`` times in a row, three rounds: the
   process's CPU per call and the wall time per call, with the ratio to 10^3.
2. **Starts per second against line length** (``line``): ``benchmarks.waiting_line``
   (a ``rate="10/s"`` and a ``concurrency=2`` tool, lines of 10 to 1,000, every store).
3. **Ack latency while the page is read** (``page``): ``benchmarks.page_reads`` at 10^6
   stored calls (Redis 10^5): the overview and the first page of calls, and webhook ack
   latency with and without the page read every second.
4. **Healthy sessions behind failing ones** (``failing``): an app on SQLite against the
   package's fake Agents API over loopback receives N deliveries whose session reads fail
   (HTTP 500, five times each), then one healthy delivery: the time from the healthy
   delivery's send to its result's acceptance, for N = 0, 100 and 1,000.

Targets (issue "cost that does not grow"): CPU per call flat in the stored calls; at
least 9 starts/s at every line length; with 10^6 stored calls the overview and the first
page under 100 ms and ack p99 under 20 ms while the page is read; with 1,000 failing
deliveries queued, the healthy session answered within 1 s. Nothing here is asserted by
tests: ``--quick`` (``tests/test_benchmarks_scale.py``) runs each curve at a toy size, to
keep the module working.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from agentfn_asgi import FunctionTools
from agentfn_asgi.calls.records import CallKey, SavedResult
from agentfn_asgi.store import open_store
from agentfn_asgi.testing import FakeCall, action_required_event, connect, signed_delivery
from benchmarks import page_reads, waiting_line

__all__ = ["CURVES", "main", "run"]

CURVES = ("stored", "line", "page", "failing")
STORES = ("sqlite", "postgres", "redis")
STORED = (1_000, 10_000, 100_000, 1_000_000)
REDIS_STORED = (1_000, 10_000, 100_000)
FAILING = (0, 100, 1_000)
#: Seconds the healthy session is waited for (NaN in the table after that).
_FAILING_TIMEOUT = 60.0

_EVENT = page_reads._EVENT


# -- 1. CPU per call against stored calls -------------------------------------------------


@dataclass(frozen=True, slots=True)
class StoredRow:
    """The store work of one delivery on a store holding ``stored`` calls."""

    store: str
    stored: int
    cpu_us: float
    wall_us: float
    fill_s: float


async def _fill(kind: str, n: int, tmp: str) -> str:
    """A fresh store of ``kind`` holding ``n`` calls; its URL."""
    if kind == "sqlite":
        path = str(Path(tmp, f"stored-{n}.sqlite3"))
        await page_reads._fill_sqlite(path, n)
        return f"sqlite:///{path}"
    if kind == "postgres":
        await page_reads._fill_postgres(n)
        return page_reads.PG_URL
    await page_reads._fill_redis(n)
    await _redis_quiet()
    return page_reads.REDIS_URL


async def _redis_quiet() -> None:
    """Wait for the snapshot a fill sets off (Redis forks a child that writes every key,
    on the same cores): timed during it, one call costs several times what it does after."""
    import redis.asyncio as redis

    client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
    try:
        while True:
            info = await client.info("persistence")
            if not info.get("rdb_bgsave_in_progress") and not info.get("aof_rewrite_in_progress"):
                return
            await asyncio.sleep(0.2)
    finally:
        await client.aclose()


async def store_work(url: str, calls: int) -> tuple[float, float]:
    """CPU and wall seconds per call of ``calls`` single-call deliveries' store work."""
    store = open_store(url)
    await store.open()
    try:
        cpu, wall = time.process_time(), time.perf_counter()
        for i in range(calls):
            sid = f"sess_scale_{i}_{time.monotonic_ns()}"
            did = f"wh_scale_{i}_{time.monotonic_ns()}"
            key = CallKey(sid, "turn_scale", f"call_{i}")
            await store.record_delivery(did, sid)
            await store.claim_call(
                key, tool_name="get_customer", owner="bench", lease_seconds=30, delivery_id=did
            )
            await store.save_result(
                key,
                owner="bench",
                attempt=1,
                result=SavedResult(True, _EVENT, f"afn-submit-scale-{i}-{time.monotonic_ns()}"),
            )
            await store.mark_submitted(key)
            await store.mark_delivery_resolved(did)
            await store.calls_for_session(sid)
        return (time.process_time() - cpu) / calls, (time.perf_counter() - wall) / calls
    finally:
        await store.close()


async def stored_curve(
    stores: tuple[str, ...], sizes: tuple[int, ...], redis_sizes: tuple[int, ...], calls: int
) -> list[StoredRow]:
    rows: list[StoredRow] = []
    with tempfile.TemporaryDirectory(prefix="agentfn-scale-") as tmp:
        for kind in stores:
            for n in redis_sizes if kind == "redis" else sizes:
                started = time.perf_counter()
                url = await _fill(kind, n, tmp)
                filled = time.perf_counter() - started
                await store_work(url, max(1, calls // 10))  # warm: connections, caches
                rounds = [await store_work(url, calls) for _ in range(3)]
                row = StoredRow(
                    kind,
                    n,
                    statistics.median(r[0] for r in rounds) * 1e6,
                    statistics.median(r[1] for r in rounds) * 1e6,
                    filled,
                )
                rows.append(row)
                print(f"  {kind} {n:,}: {row.cpu_us:.0f} µs CPU/call, fill {filled:.0f} s")
                if kind == "sqlite":  # the next size is filled afresh: free the disk
                    await asyncio.to_thread(
                        Path(url.removeprefix("sqlite:///")).unlink, missing_ok=True
                    )
    return rows


def stored_table(rows: list[StoredRow]) -> str:
    lines = [
        "| store | stored calls | CPU µs per call | × at the smallest | wall µs per call "
        "| × at the smallest | fill s |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    first: dict[str, StoredRow] = {}
    for r in rows:
        base = first.setdefault(r.store, r)
        lines.append(
            f"| {r.store} | {r.stored:,} | {r.cpu_us:.0f} | {r.cpu_us / base.cpu_us:.2f} "
            f"| {r.wall_us:.0f} | {r.wall_us / base.wall_us:.2f} | {r.fill_s:.0f} |"
        )
    return "\n".join(lines)


# -- 4. healthy sessions behind failing ones -----------------------------------------------


@dataclass(frozen=True, slots=True)
class FailingRow:
    """A healthy delivery sent after ``failing`` deliveries whose session reads fail."""

    failing: int
    queued_s: float  # sending the failing deliveries (each acked)
    answered_s: float  # the healthy delivery's send to its result accepted


async def _healthy_behind_failing(tools: FunctionTools, n: int, tmp: str) -> FailingRow:
    store = f"sqlite:///{Path(tmp, 'failing.sqlite3')}"
    async with connect(tools, store=store, webhooks=False, loopback=True) as conn:
        fake = conn.fake
        senders = asyncio.Semaphore(64)

        async def deliver(sid: str) -> None:
            body, headers = signed_delivery(fake.webhook_secrets, action_required_event(sid))
            async with senders:
                response = await conn.post_webhook(body, headers)
            assert response.status_code == 200, response.status_code

        failing = []
        for _ in range(n):
            sid = fake.create_session([[FakeCall("get_customer")]], deliver=False)
            fake.fail_next("retrieve", 5, 500, session_id=sid)
            failing.append(sid)
        healthy = fake.create_session([[FakeCall("get_customer")]], deliver=False)
        started = time.perf_counter()
        await asyncio.gather(*(deliver(sid) for sid in failing))
        queued = time.perf_counter() - started
        sent = time.perf_counter()
        await deliver(healthy)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_FAILING_TIMEOUT):
                while not any(s.session_id == healthy for s in fake.submissions):  # noqa: ASYNC110
                    await asyncio.sleep(0.002)  # the fake's submissions, looked at as they come
                return FailingRow(n, queued, time.perf_counter() - sent)
        return FailingRow(n, queued, float("nan"))


async def failing_curve(counts: tuple[int, ...]) -> list[FailingRow]:
    tools = FunctionTools()

    @tools.function
    async def get_customer(customer_id: str = "c") -> dict[str, str]:
        """Look up a customer."""
        return {"id": customer_id}

    rows: list[FailingRow] = []
    for n in counts:
        with tempfile.TemporaryDirectory(prefix="agentfn-scale-") as tmp:
            rows.append(await _healthy_behind_failing(tools, n, tmp))
        print(f"  {n:,} failing: healthy answered in {rows[-1].answered_s:.3f} s", flush=True)
    return rows


def failing_table(rows: list[FailingRow]) -> str:
    lines = [
        "| failing deliveries queued first | sent (and acked) in | healthy session answered in |",
        "|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r.failing:,} | {r.queued_s:.2f} s | {r.answered_s:.3f} s |")
    return "\n".join(lines)


# -- the run ---------------------------------------------------------------------------------


async def run(curves: tuple[str, ...], *, quick: bool, stores: tuple[str, ...]) -> list[str]:
    """Run ``curves`` in turn; the markdown table of each, printed as it is done."""
    tables: list[str] = []

    def show(title: str, table: str) -> None:
        text = f"### {title}\n\n{table}\n"
        print(f"\n{text}", flush=True)
        tables.append(text)

    if "stored" in curves:
        print("CPU per call against stored calls ...", flush=True)
        if quick:
            rows = await stored_curve(("sqlite",), (100, 1_000), (), calls=20)
        else:
            rows = await stored_curve(stores, STORED, REDIS_STORED, calls=1_000)
        show("CPU per call against stored calls", stored_table(rows))
    if "line" in curves:
        print("starts per second against line length ...", flush=True)
        if quick:
            with tempfile.TemporaryDirectory(prefix="agentfn-scale-") as tmp:
                lines = [await waiting_line.measure("sqlite", "rate", 6, starts=6, tmp=Path(tmp))]
        else:
            lines = await waiting_line.run(stores=stores)
        show("Starts per second against line length", waiting_line._table(lines))
    if "page" in curves:
        print("ack latency while the page is read ...", flush=True)
        rows_page: list[str] = []
        with tempfile.TemporaryDirectory(prefix="agentfn-scale-") as tmp:
            for kind in ("sqlite",) if quick else stores:
                n = 1_000 if quick else 100_000 if kind == "redis" else 1_000_000
                async with page_reads._store(kind, n, tmp) as url:
                    found = await page_reads.measure(
                        url,
                        reads=1 if quick else 5,
                        seconds=1.0 if quick else 20.0,
                        rate=20.0 if quick else 50.0,
                    )
                rows_page.append(page_reads._row(kind, n, found))
        show("Ack latency while the page is read", "\n".join([page_reads._HEADER, *rows_page]))
    if "failing" in curves:
        print("healthy sessions behind failing ones ...", flush=True)
        failing = await failing_curve((0, 20) if quick else FAILING)
        show("Healthy sessions behind failing ones", failing_table(failing))
    return tables


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.scale", description=__doc__)
    parser.add_argument("--curve", action="append", choices=CURVES, help="(repeatable)")
    parser.add_argument("--store", action="append", choices=STORES, help="(repeatable)")
    parser.add_argument("--quick", action="store_true", help="toy sizes, SQLite only: seconds")
    args = parser.parse_args(argv)
    logging.getLogger("agentfn_asgi").setLevel(logging.WARNING)  # not a line per call
    asyncio.run(
        run(tuple(args.curve or CURVES), quick=args.quick, stores=tuple(args.store or STORES))
    )


if __name__ == "__main__":
    main()
