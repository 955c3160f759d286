"""A call's history is bounded on SQLite and PostgreSQL (issue 22): its first
``HISTORY_HEAD`` and last ``HISTORY_TAIL`` events are kept and the ones between counted, so
a call refused thousands of times stays as small, and as cheap to append to and to read, as
one refused a few dozen times. Sizes and counts are asserted, never times."""

from __future__ import annotations

import sqlite3
from typing import Any

import pytest

from agentfn_asgi.calls.records import CallKey, CallRecord
from agentfn_asgi.calls.states import HISTORY_HEAD, HISTORY_TAIL
from agentfn_asgi.store import SQLiteStore, Store

from .conftest import KEY, LEASE, POSTGRES_URL, FakeClock, StoreFactory, result

pytestmark = pytest.mark.anyio

SQL = pytest.mark.parametrize(
    "store_factory", ["sqlite", pytest.param("postgres", marks=pytest.mark.backends)], indirect=True
)
KEPT = HISTORY_HEAD + HISTORY_TAIL


async def stored_history_size(store: Store, key: CallKey) -> int:
    """Characters the database holds for the history of ``key`` (what a read loads)."""
    query = (
        "SELECT coalesce(length(history), 0) + coalesce(length(history_tail), 0) FROM {p}calls"
        " WHERE namespace = '' AND session_id = $1 AND turn_id = $2 AND call_id = $3"
    )
    values = (key.session_id, key.turn_id, key.call_id)
    if isinstance(store, SQLiteStore):
        with sqlite3.connect(store.path) as raw:
            row: Any = raw.execute(query.format(p="").replace("$", "?"), values).fetchone()
        return int(row[0])
    import asyncpg

    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        prefix = f'"{store._schema}".'  # type: ignore[attr-defined]  # the test's own schema
        return int(await conn.fetchval(query.format(p=prefix), *values))
    finally:
        await conn.close()


async def refused(store: Store, key: CallKey, times: int) -> CallRecord:
    """Claim and save ``key``, then record ``times`` refused submissions; its record."""
    await store.claim_call(key, tool_name="t", owner="o", lease_seconds=LEASE)
    await store.save_result(key, owner="o", attempt=1, result=result())
    for _ in range(times):
        await store.submission_failed(key, detail="HTTP 503 service_unavailable", retry_at=0.0)
    record = await store.get_call(key, history=True)
    assert record is not None
    return record


@SQL
async def test_two_thousand_refused_submissions_keep_fifty_events_and_a_count(
    store_factory: StoreFactory, clock: FakeClock
) -> None:
    """2,000 refusals (2,002 events): the first 10 and the last 40 are kept, 1,952 counted as
    dropped, and the database holds exactly as much for it as for a call refused 60 times
    (same event shapes, same clock): appending and reading no longer grow with the count."""
    store = await store_factory()
    record = await refused(store, KEY, 2_000)
    kinds = [event.kind for event in record.history]
    assert len(kinds) == KEPT and record.history_dropped == 2_002 - KEPT
    assert kinds[:3] == ["claimed", "saved", "submit_failed"]
    assert set(kinds[2:]) == {"submit_failed"}
    assert record.failures == 2_000
    few = await refused(store, CallKey("sess_1", "turn_1", "few"), 60)
    assert (len(few.history), few.history_dropped) == (KEPT, 62 - KEPT)
    assert await stored_history_size(store, KEY) == await stored_history_size(store, few.key)
    # The last event is the last one appended, and the next one pushes the oldest out.
    await store.mark_submitted(KEY, detail="HTTP 202, 1 request")
    final = await store.get_call(KEY, history=True)
    assert final is not None
    assert final.history[-1].kind == "submitted" and final.history_dropped == 2_003 - KEPT
    assert final.history[:HISTORY_HEAD] == record.history[:HISTORY_HEAD]
    assert final.history[HISTORY_HEAD:-1] == record.history[HISTORY_HEAD + 1 :]


@SQL
async def test_every_history_length_up_to_the_bound_and_past_it(
    store_factory: StoreFactory, clock: FakeClock
) -> None:
    """Event by event: all kept up to 50, then first 10 + last 40 with the count between,
    matching the rule (every event has its own time, so each one is recognisable)."""
    store = await store_factory()
    await store.claim_call(KEY, tool_name="t", owner="o", lease_seconds=LEASE)
    await store.save_result(KEY, owner="o", attempt=1, result=result())
    appended = [("claimed", ""), ("saved", "source=ran success")]
    for n in range(70):
        clock.advance(1)
        await store.submission_failed(KEY, detail=f"#{n}", retry_at=0.0)
        appended.append(("submit_failed", f"#{n}"))
        record = await store.get_call(KEY, history=True)
        assert record is not None
        expected = (
            appended
            if len(appended) <= KEPT
            else (appended[:HISTORY_HEAD] + appended[-HISTORY_TAIL:])
        )
        assert [(e.kind, e.detail) for e in record.history] == expected, n
        assert record.history_dropped == len(appended) - len(expected)
