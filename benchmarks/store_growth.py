"""Store growth: the per-call cost of the SQLite store with 10^3 against 10^6 recorded calls.

Drives :class:`~agentfn_asgi.store.sql.sqlite.SQLiteStore` directly (no HTTP). Each file is
pre-filled in bulk with N submitted calls and N resolved deliveries (random ids, as real
ones are, so inserts land all over the B-trees); then one "call" is the store work the
dispatcher does for a delivery with one function call: ``record_delivery``,
``claim_call``, ``save_result``, ``mark_submitted``, ``mark_delivery_resolved`` and
``calls_for_session``, awaited one after the other. Rounds alternate small and large files.
"""

from __future__ import annotations

import asyncio
import secrets
import sqlite3
import time
from pathlib import Path

from agentfn_asgi.calls.records import CallKey, SavedResult
from agentfn_asgi.store.sql.sqlite import SQLiteStore

__all__ = ["measure_round", "prefill"]

_EVENT = (
    '{"type":"agent.session.input.tool_result","turn_id":"turn_x","call_id":"call_x",'
    '"success":true,"output":"{\\"found\\":true,\\"customer\\":{\\"id\\":\\"cus_1\\"}}"}'
)


# Named columns: the table gains columns over schema versions (the others keep defaults).
_INSERT_CALL = (
    "INSERT INTO calls (session_id, turn_id, call_id, tool_name, state, attempt, owner,"
    " lease_expires_at, created_at, updated_at, delivery_id, success, event_json,"
    " idempotency_key, error_type, source, full_output, next_attempt_at)"
    " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)"
)


async def prefill(path: Path, rows: int, *, batch: int = 50_000) -> None:
    """Create the schema through the store, then insert ``rows`` calls and deliveries."""
    store = SQLiteStore(str(path))
    await store.open()
    await store.close()
    now = time.time()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = OFF")
        done = 0
        while done < rows:
            n = min(batch, rows - done)
            calls = []
            deliveries = []
            for _ in range(n):
                sid = "sess_" + secrets.token_hex(10)
                did = "wh_" + secrets.token_hex(16)
                call = "call_" + secrets.token_hex(8)
                calls.append(
                    (sid, "turn_" + secrets.token_hex(6), call, "get_customer", "submitted", 1,
                     "bench", now - 1, now - 60, now - 1, did, 1, _EVENT,
                     "afn-submit-" + secrets.token_hex(24), None, "ran", None, now - 1)
                )  # fmt: skip
                deliveries.append((did, sid, now - 60))
            conn.execute("BEGIN")
            conn.executemany(_INSERT_CALL, calls)
            conn.executemany(
                "INSERT INTO deliveries (delivery_id, session_id, received_at, resolved) "
                "VALUES (?, ?, ?, 1)",
                deliveries,
            )
            conn.execute("COMMIT")
            done += n
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


async def measure_round(path: Path, calls: int) -> float:
    """Seconds per call for ``calls`` sequential calls' worth of store work on ``path``."""
    store = SQLiteStore(str(path))
    await store.open()
    try:
        started = time.perf_counter()
        for _ in range(calls):
            sid = "sess_" + secrets.token_hex(10)
            did = "wh_" + secrets.token_hex(16)
            key = CallKey(sid, "turn_" + secrets.token_hex(6), "call_" + secrets.token_hex(8))
            await store.record_delivery(did, sid)
            await store.claim_call(
                key, tool_name="get_customer", owner="bench", lease_seconds=30, delivery_id=did
            )
            await store.save_result(
                key,
                owner="bench",
                attempt=1,
                result=SavedResult(True, _EVENT, "afn-submit-" + secrets.token_hex(24)),
            )
            await store.mark_submitted(key)
            await store.mark_delivery_resolved(did)
            await store.calls_for_session(sid)
        return (time.perf_counter() - started) / calls
    finally:
        await store.close()


async def _main() -> None:  # pragma: no cover - manual use
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        small, big = Path(tmp, "small.sqlite3"), Path(tmp, "big.sqlite3")
        await prefill(small, 1000)
        await prefill(big, 100_000)
        for _ in range(3):
            print(await measure_round(small, 1000) * 1e6, await measure_round(big, 1000) * 1e6)


if __name__ == "__main__":
    asyncio.run(_main())
