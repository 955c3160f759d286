# ruff: noqa: S608 - the SQL here interpolates only the schema names the tests generate.
"""The operators' reads at any size (what ``status``, ``calls`` and the operator page show).

Counted from the tallies and read from indexes in the listing's order, never by reading or
sorting every row (the plans say so on SQLite and PostgreSQL); on SQLite run off the event
loop's thread; paged completely and stably, however the calls tie or arrive meanwhile.
"""

from __future__ import annotations

import sqlite3
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agentfn_asgi import operator as operator_module
from agentfn_asgi.calls.records import CallKey, CallQuery
from agentfn_asgi.operator import CallFilter, Operator
from agentfn_asgi.store import SQLiteStore, Store
from agentfn_asgi.store.sql.dialect import SQLITE, postgres_dialect
from agentfn_asgi.store.sql.schema import STEPS
from agentfn_asgi.store.sql.statements import (
    LIST_DELIVERIES,
    LIST_UNRESOLVED,
    STATS,
    list_calls_statement,
)

from .conftest import POSTGRES_URL, FakeClock, claim, require_service, result

pytestmark = pytest.mark.anyio

#: Every listing the CLI and the page ask for: list_calls' filters, alone and with a cursor.
LISTINGS: tuple[tuple[str, ...], ...] = (
    (),
    ("before",),
    ("state",),
    ("state", "before"),
    ("tool_name",),
    ("tool_name", "before"),
    ("state", "tool_name", "before"),
    ("since",),
    ("in_doubt",),
    ("session_id",),
)
#: Listings whose order is not the index's: a session's calls (its own few, sorted) and
#: the calls in doubt (the claims, few, from their own index). Bounded all the same.
SORTED_FEW = {("session_id",), ("in_doubt",)}
PARAMS: dict[str, object] = {
    "namespace": "",
    "limit": 51,
    "state": "submitted",
    "tool_name": "lookup",
    "session_id": "s0",
    "since": 0.0,
    "takeover_before": 0.0,
    "before_at": 1e12,
    "before_session": "s",
    "before_turn": "t",
    "before_call": "c",
}
COUNTS_AND_LISTS = {"stats": STATS, "deliveries": LIST_DELIVERIES, "unresolved": LIST_UNRESOLVED}


async def _fill(store: Store, clock: FakeClock, n: int, *, start: int = 0) -> list[CallKey]:
    """``n`` calls (numbered from ``start``), three to a tie of first-seen times, a third
    still claimed, the rest submitted (every seventh a failure); a delivery each."""
    keys = []
    for i in range(start, start + n):
        if i % 3 == 0:
            clock.advance(1)
        key = CallKey(f"s{i % 5}", "t", f"c{i:04}")
        await store.record_delivery(f"d{i}", key.session_id)
        assert (await claim(store, "o", key)).value == "claimed"
        if i % 3:
            await store.save_result(key, owner="o", attempt=1, result=result(success=i % 7 > 0))
            await store.mark_submitted(key)
        keys.append(key)
    return keys


def _sqlite_plan(path: Path, template: str) -> str:
    with sqlite3.connect(path) as raw:
        rows = raw.execute("EXPLAIN QUERY PLAN " + SQLITE.render(template).text, PARAMS)
        plan = " | ".join(str(row[3]) for row in rows)
    raw.close()
    return plan


async def test_sqlite_counts_and_lists_read_indexes_and_tallies_never_every_row(
    tmp_path: Path, clock: FakeClock
) -> None:
    """No operator's read scans a table: the counts read the tallies and the indexes of
    what they count, every list is an index in its own order (no sort of every row)."""
    path = tmp_path / "store.sqlite3"
    store = SQLiteStore(path, clock=clock)
    await _fill(store, clock, 60)
    await store.close()
    for filters in LISTINGS:
        plan = _sqlite_plan(path, list_calls_statement(filters))
        assert "SCAN calls" not in plan, (filters, plan)
        assert filters in SORTED_FEW or "TEMP B-TREE" not in plan, (filters, plan)
    for name, template in COUNTS_AND_LISTS.items():
        plan = _sqlite_plan(path, template)
        assert "SCAN calls" not in plan and "SCAN deliveries" not in plan, (name, plan)
        assert "TEMP B-TREE" not in plan, (name, plan)


@pytest.mark.backends
async def test_postgres_counts_and_lists_read_indexes_and_tallies_never_every_row(
    clock: FakeClock,
) -> None:
    """On PostgreSQL with 20,000 calls (analyzed): no sequential scan of the calls or the
    deliveries, and no sort, in any count or list of the operators."""
    try:
        import asyncpg

        from agentfn_asgi.store.sql.postgres import PostgresStore
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        require_service("postgres", str(exc))
    schema = f"agentfn_test_{uuid.uuid4().hex[:16]}"
    store = PostgresStore(POSTGRES_URL, schema=schema, clock=clock)
    await store.open()
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        await conn.execute(
            f"""INSERT INTO "{schema}".calls (session_id, turn_id, call_id, tool_name, state,
                attempt, lease_expires_at, created_at, updated_at, success)
            SELECT 's' || (i % 500), 't', 'c' || i, CASE WHEN i % 3 = 0 THEN 'other'
                ELSE 'lookup' END, CASE WHEN i % 100 = 0 THEN 'claimed' ELSE 'submitted' END,
                1, i, i, i, i % 7 > 0 FROM generate_series(1, 20000) AS i"""
        )
        await conn.execute(
            f"""INSERT INTO "{schema}".deliveries (delivery_id, session_id, received_at,
                resolved) SELECT 'd' || i, 's', i, i % 1000 > 0 FROM generate_series(1, 20000) i"""
        )
        await conn.execute(f'ANALYZE "{schema}".calls, "{schema}".deliveries, "{schema}".tallies')
        dialect = postgres_dialect(schema)
        templates: dict[object, str] = {f: list_calls_statement(f) for f in LISTINGS}
        templates.update(COUNTS_AND_LISTS)
        for name, template in templates.items():
            query = dialect.render(template)
            rows = await conn.fetch("EXPLAIN " + query.text, *query.arguments(PARAMS))
            plan = " | ".join(row[0] for row in rows)
            assert "Seq Scan on calls" not in plan, (name, plan)
            assert "Seq Scan on deliveries" not in plan, (name, plan)
            assert name in SORTED_FEW or "Sort" not in plan, (name, plan)
        stats = await store.stats()
        assert stats.calls_by_state["submitted"] == 19800
        # Failures: multiples of 7 (2,857) but not of 100 (28 of them are claimed).
        assert (stats.successes, stats.failures, stats.deliveries) == (16971, 2829, 20000)
    finally:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        await conn.close()
        await store.close()


@pytest.fixture
def traced(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, str]]:
    """Every statement any SQLite connection runs from now on, with the thread it ran on."""
    seen: list[tuple[int, str]] = []
    connect = sqlite3.connect

    def traced_connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        conn: sqlite3.Connection = connect(*args, **kwargs)
        conn.set_trace_callback(lambda text: seen.append((threading.get_ident(), text)))
        return conn

    monkeypatch.setattr(sqlite3, "connect", traced_connect)
    return seen


async def test_sqlite_reads_of_the_operators_run_off_the_event_loop_thread(
    tmp_path: Path, clock: FakeClock, traced: list[tuple[int, str]]
) -> None:
    """The overview's counts, the calls and deliveries lists, a call's lookup and the
    approvals list: each statement runs on another thread than the loop's (a read of a big
    file never stalls the webhooks the loop answers), and answers what was just written."""
    store = SQLiteStore(tmp_path / "store.sqlite3", clock=clock)
    keys = await _fill(store, clock, 6)
    loop_thread = threading.get_ident()
    reads: dict[str, Callable[[], Any]] = {
        "tallies": store.stats,
        "ORDER BY created_at DESC": lambda: store.list_calls(CallQuery(limit=5)),
        "ORDER BY received_at DESC": lambda: store.list_deliveries(limit=5),
        "ORDER BY created_at, session_id, turn_id": lambda: store.find_calls(keys[0].call_id),
        "ORDER BY lease_expires_at, session_id": lambda: store.waiting_approvals(limit=5),
    }
    answers = []
    for marker, read in reads.items():
        traced.clear()
        answers.append(await read())
        ran = [thread for thread, text in traced if marker in text]
        assert ran and loop_thread not in ran, (marker, traced)
    stats, listed, deliveries, found, _ = answers
    assert stats.calls_by_state["submitted"] == 4 and stats.deliveries == 6
    assert len(listed) == 5 and {r.key for r in listed} <= set(keys)
    assert len(deliveries) == 5 and [r.key for r in found] == [keys[0]]
    await store.close()
    with pytest.raises(Exception, match="closed"):
        await store.stats()


async def test_a_version_1_sqlite_file_is_counted_once_when_it_takes_step_2(
    tmp_path: Path, clock: FakeClock
) -> None:
    """A file of the release before (no tallies: it counted every row) gains them counted
    from its rows, the triggers keep them from then on, and its lists their indexes."""
    path = tmp_path / "store.sqlite3"
    store = SQLiteStore(path, clock=clock)
    await _fill(store, clock, 12)
    before = await store.stats()
    await store.close()
    with sqlite3.connect(path) as raw:  # back to version 1: as the release before made it
        for (name,) in raw.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'"):
            raw.execute(f"DROP TRIGGER {name}")
        for name in (
            "calls_listed",
            "calls_state",
            "calls_tool",
            "deliveries_listed",
            "calls_line",
        ):
            raw.execute(f"DROP INDEX {name}")
        raw.execute("DROP INDEX deliveries_unresolved")
        raw.execute("DROP TABLE tallies")
        raw.execute("ALTER TABLE calls DROP COLUMN counted")
        raw.execute("CREATE INDEX deliveries_received ON deliveries (namespace, received_at)")
        raw.execute("UPDATE schema_version SET version = 1, readable_from = 1")
        # Written by the release before, with nothing to count it.
        raw.execute("UPDATE calls SET state = 'stale' WHERE call_id = 'c0000'")
    raw.close()
    again = SQLiteStore(path, clock=clock)
    stats = await again.stats()
    assert stats.calls_by_state["stale"] == 1
    assert stats.calls_by_state["claimed"] == before.calls_by_state["claimed"] - 1
    assert (stats.successes, stats.failures) == (before.successes, before.failures)
    assert stats.deliveries == before.deliveries == 12
    await claim(again, "o", CallKey("new", "t", "c"))
    assert (await again.stats()).calls_by_state["claimed"] == stats.calls_by_state["claimed"] + 1
    with sqlite3.connect(path) as raw:
        assert raw.execute("SELECT * FROM schema_version").fetchall() == [(len(STEPS), 2)]
        names = {n for (n,) in raw.execute("SELECT name FROM sqlite_master WHERE type='index'")}
    raw.close()
    assert {"calls_listed", "calls_state", "deliveries_listed"} <= names
    assert "deliveries_received" not in names
    await again.close()


async def _all_pages(view: Operator, query: CallFilter) -> list[list[str]]:
    """Every page of ``query`` (call ids), following ``next_cursor`` to the end."""
    pages, cursor = [], None
    while True:
        page = await view.calls(
            CallFilter(state=query.state, outcome=query.outcome, limit=query.limit, cursor=cursor)
        )
        pages.append([c.call_id for c in page.calls])
        if page.next_cursor is None:
            return pages
        cursor = page.next_cursor
        assert len(pages) < 1000


async def test_paging_is_complete_and_stable_through_ties_and_new_calls(
    store: Store, clock: FakeClock
) -> None:
    """Pages of 7 give every call once, newest first, through calls first seen at the same
    time (ties broken by the key); calls arriving between pages (newer) neither repeat nor
    push an older one out of the pages still to come."""
    await _fill(store, clock, 40)
    records = await store.list_calls(CallQuery(limit=1000))
    order = [r.key.call_id for r in records]
    view = Operator(store, location="test")
    first = await view.calls(CallFilter(limit=7))
    seen = [c.call_id for c in first.calls]
    cursor = first.next_cursor
    arrived = 0
    while cursor is not None:
        clock.advance(1)
        await claim(store, "o", CallKey("late", "t", f"late{arrived}"))
        arrived += 1
        page = await view.calls(CallFilter(limit=7, cursor=cursor))
        seen += [c.call_id for c in page.calls]
        cursor = page.next_cursor
    assert seen == order and len(order) == 40
    ties = [r.created_at for r in records]
    assert len(set(ties)) < len(ties)  # the pages did cut through ties


async def test_a_rare_outcome_is_paged_completely_in_bounded_reads(
    store: Store, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The failures among many successes: a page reads about OUTCOME_READ_BUDGET calls at
    most, so some pages come back short (even empty) with a cursor; following the cursors
    gives every failure exactly once, newest first."""
    monkeypatch.setattr(operator_module, "OUTCOME_READ_BUDGET", 4)
    keys = await _fill(store, clock, 60)
    failed = [k.call_id for k in keys if int(k.call_id[1:]) % 3 and int(k.call_id[1:]) % 7 == 0]
    view = Operator(store, location="test")
    reads = 0
    list_calls = store.list_calls

    async def counted(query: CallQuery) -> Any:
        nonlocal reads
        reads += 1
        return await list_calls(query)

    monkeypatch.setattr(store, "list_calls", counted)
    pages = await _all_pages(view, CallFilter(outcome="failed", limit=2))
    listed = [call for page in pages for call in page]
    assert sorted(listed) == sorted(failed) and len(listed) == len(set(listed))
    assert any(len(page) < 2 for page in pages[:-1])  # cut short by the budget
    assert reads <= len(pages) * (4 // 3 + 1)  # batches of limit + 1, to the budget


@pytest.mark.backends
async def test_postgres_tallies_of_many_connections_fold_into_one_row_at_prune(
    clock: FakeClock,
) -> None:
    """Each server process counts in its own row (writers never wait on one counter); a
    prune folds them into one per count, and the counts read the same before and after."""
    try:
        import asyncpg

        from agentfn_asgi.store.sql.postgres import PostgresStore
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        require_service("postgres", str(exc))
    schema = f"agentfn_test_{uuid.uuid4().hex[:16]}"
    stores = [PostgresStore(POSTGRES_URL, schema=schema, clock=clock) for _ in range(3)]
    try:
        for n, store in enumerate(stores):
            await _fill(store, clock, 7, start=7 * n)
        before = await stores[0].stats()
        rows = await _tally_rows(asyncpg, schema)
        assert len({shard for _, shard in rows}) >= 3  # one shard per process that wrote
        assert await stores[1].prune(deliveries_before=0, calls_before=0) == 0
        assert await stores[2].stats() == before
        assert {shard for _, shard in await _tally_rows(asyncpg, schema)} == {0}
        assert before.deliveries == 21 and before.calls_by_state["submitted"] == 14
        assert (before.successes, before.failures) == (12, 2)
    finally:
        await stores[0].destroy()
        for store in stores:
            await store.close()


async def _tally_rows(asyncpg: Any, schema: str) -> list[tuple[str, int]]:
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        rows = await conn.fetch(f'SELECT name, shard FROM "{schema}".tallies')
    finally:
        await conn.close()
    return [(row[0], row[1]) for row in rows]
