"""SQLite specifics: WAL, schema versions, the writer thread (a free event loop,
group commit, shutdown), file locks shared by processes, clean errors."""

from __future__ import annotations

import asyncio
import gc
import itertools
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agentfn_asgi.calls.records import CallKey
from agentfn_asgi.errors import (
    ConfigurationError,
    StoreError,
    StoreRefusedError,
    StoreUnavailableError,
)
from agentfn_asgi.store import SQLiteStore
from agentfn_asgi.store.sql.dialect import SQLITE
from agentfn_asgi.store.sql.schema import STEPS
from agentfn_asgi.store.sql.statements import (
    ADMISSION,
    CALLS_FOR_SESSION,
    COUNT_WAITING_APPROVALS,
    PRUNE_CALLS,
    PRUNE_DELIVERIES,
    UNRESOLVED_DELIVERIES,
    WORKLIST_READS,
)

from .conftest import hold_for_approval

pytestmark = pytest.mark.anyio

KEY = CallKey("sess_1", "turn_1", "call_1")


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    return tmp_path / "data" / "agentfn.sqlite3"


@pytest.fixture
async def store(db_path: Path) -> AsyncIterator[SQLiteStore]:
    store = SQLiteStore(db_path)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def test_opens_in_wal_mode_with_schema_version(store: SQLiteStore, db_path: Path) -> None:
    """open() creates the file, switches it to WAL and makes the tables."""
    assert await asyncio.to_thread(db_path.exists)
    with sqlite3.connect(db_path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"deliveries", "calls"} <= tables


#: The columns of the calls table as 0.1.0 released schema 1. A released column is never
#: renamed or dropped in place (docs/versions.md: expand first, contract a release later).
RELEASED_CALL_COLUMNS = (
    "session_id", "turn_id", "call_id", "tool_name", "state", "attempt", "owner",
    "lease_expires_at", "created_at", "updated_at", "delivery_id", "nonce", "success",
    "event_json", "idempotency_key", "error_type", "source", "full_output",
    "quarantine_reason", "next_attempt_at", "failures", "namespace", "approval_id",
    "approval", "limiter", "history", "history_tail", "history_count",
)  # fmt: skip


async def test_the_released_columns_are_kept(store: SQLiteStore, db_path: Path) -> None:
    """Every column 0.1.0's schema 1 made is still there under its name, and a reason saved
    today lands in it: a 0.1.0 replica beside this one reads and writes the same columns.
    (A rename of quarantine_reason, left without a step, broke that.)"""
    await store.claim_call(KEY, tool_name="t", owner="a", lease_seconds=30)
    await store.quarantine(KEY, owner="a", attempt=1, reason="reconcile said unknown")
    with sqlite3.connect(db_path) as raw:
        columns = [row[1] for row in raw.execute("PRAGMA table_info(calls)")]
        (reason,) = raw.execute("SELECT quarantine_reason FROM calls").fetchone()
    assert [name for name in columns if name in RELEASED_CALL_COLUMNS] == list(
        RELEASED_CALL_COLUMNS
    )
    assert reason == "reconcile said unknown"


@pytest.mark.slow
def test_two_processes_claim_each_call_once(tmp_path: Path) -> None:
    """Two processes racing over the same 300 calls on one file claim each exactly once."""
    path = tmp_path / "shared.sqlite3"
    script = textwrap.dedent(
        """
        import asyncio, sys
        from agentfn_asgi.store import SQLiteStore
        from agentfn_asgi.calls.records import CallKey, ClaimStatus

        async def main() -> None:
            store = SQLiteStore(sys.argv[1])
            await store.open()
            print("ready", flush=True)
            sys.stdin.readline()
            outcomes = await asyncio.gather(*(
                store.claim_call(CallKey("s", "t", f"c{i}"), tool_name="t",
                                 owner=sys.argv[2], lease_seconds=60)
                for i in range(300)
            ))
            await store.close()
            won = [o.record.key.call_id for o in outcomes if o.status is ClaimStatus.CLAIMED]
            print(" ".join(won))

        asyncio.run(main())
        """
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(path), owner],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for owner in ("p1", "p2")
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
        outputs = [proc.communicate("go\n", timeout=60)[0] for proc in procs]
    finally:
        for proc in procs:  # never leave a child behind, whatever failed
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
    assert [proc.returncode for proc in procs] == [0, 0]
    won = [output.split() for output in outputs]
    assert len(won[0]) + len(won[1]) == 300
    assert set(won[0]).isdisjoint(won[1])


@pytest.mark.exclusive
async def test_event_loop_keeps_running_during_writes(store: SQLiteStore) -> None:
    """2000 writes run on the store's thread while an asyncio ticker keeps ticking."""
    ticks: list[float] = []
    stop = asyncio.Event()

    async def ticker() -> None:
        while not stop.is_set():
            ticks.append(time.perf_counter())
            await asyncio.sleep(0.001)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    started = time.perf_counter()
    for i in range(0, 2000, 100):
        await asyncio.gather(*(store.record_delivery(f"d{i + j}", "s") for j in range(100)))
    elapsed = time.perf_counter() - started
    stop.set()
    await task
    assert (await store.stats()).deliveries == 2000
    gaps = [b - a for a, b in itertools.pairwise(ticks)]
    assert len(ticks) >= 5
    assert max(gaps) < max(0.25, elapsed / 4)


async def test_waiting_for_a_lock_does_not_block_the_loop(
    store: SQLiteStore, db_path: Path
) -> None:
    """While another connection holds the write lock, the loop runs; the write then lands."""
    locked = threading.Event()
    release = threading.Event()

    def hold_lock() -> None:
        with sqlite3.connect(db_path, isolation_level=None) as raw:
            raw.execute("BEGIN IMMEDIATE")
            locked.set()
            release.wait(5)
            raw.execute("COMMIT")

    holder = threading.Thread(target=hold_lock)
    holder.start()
    assert await asyncio.to_thread(locked.wait, 5)
    write = asyncio.create_task(store.record_delivery("msg_1", "s"))
    ticks = 0
    for _ in range(20):
        await asyncio.sleep(0.01)
        ticks += 1
    assert not write.done()
    release.set()
    assert await write is True
    await asyncio.to_thread(holder.join)
    assert ticks == 20


@pytest.mark.exclusive
async def test_lock_held_past_busy_timeout_is_unavailable(db_path: Path) -> None:
    """A writer that cannot get the lock in time gets StoreUnavailableError, not sqlite3's.
    Operations queued together fail after one wait, not one wait each (16 × busy_timeout
    before), so neither callers nor close() are held up behind them."""
    store = SQLiteStore(db_path, busy_timeout=0.2)
    await store.open()

    def write_where(conn: sqlite3.Connection) -> int:
        conn.execute("UPDATE deliveries SET attempts = attempts + 1 WHERE delivery_id = 'd0'")
        return threading.get_ident()

    raw = sqlite3.connect(db_path, isolation_level=None)
    try:
        raw.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreUnavailableError, match="locked") as info:
            await store.record_delivery("msg_1", "s")
        assert isinstance(info.value.__cause__, sqlite3.OperationalError)
        start = time.monotonic()
        outcomes = await asyncio.gather(
            *(store.record_delivery(f"d{i}", "s") for i in range(16)), return_exceptions=True
        )
        waited = time.monotonic() - start
        assert all(isinstance(o, StoreUnavailableError) for o in outcomes), outcomes
        assert len({id(o) for o in outcomes}) == 16  # each caller its own exception
        assert waited < 8 * store.busy_timeout  # one or two waits, never sixteen
        raw.execute("COMMIT")
        assert await store.record_delivery("msg_1", "s") is True
    finally:
        raw.close()
        await store.close()


async def test_missing_directory_is_refused_not_created(tmp_path: Path) -> None:
    """Regression (issue 18): a path into a directory that does not exist (a typo in
    AGENTFN_STORE_URL) is a ConfigurationError naming the directory; nothing is created.
    The old code created the directory and an empty store."""
    missing = tmp_path / "nonexistent_dir"
    store = SQLiteStore(missing / "x.db")
    with pytest.raises(ConfigurationError, match=r"the directory .*nonexistent_dir does not exist"):
        await store.open()
    await store.close()
    assert not missing.exists()


def test_location_is_the_resolved_absolute_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative path is resolved against the working directory when the store is made
    (a later chdir does not move it); ``location`` shows it as a sqlite://// URL."""
    monkeypatch.chdir(tmp_path)
    store = SQLiteStore("agentfn.sqlite3", namespace="proj_1")
    monkeypatch.chdir("/")
    assert store.path == str(tmp_path / "agentfn.sqlite3")
    assert store.location == f"sqlite:///{tmp_path}/agentfn.sqlite3 (namespace proj_1)"
    assert SQLiteStore(tmp_path / "x.db").location == f"sqlite:///{tmp_path}/x.db"


async def test_directory_path_is_unavailable(tmp_path: Path) -> None:
    """A path that is a directory cannot be opened: StoreUnavailableError, no sqlite3 leak."""
    store = SQLiteStore(tmp_path)
    with pytest.raises(StoreUnavailableError):
        await store.open()
    with pytest.raises(StoreUnavailableError):
        await store.ping()
    await store.close()


async def test_unwritable_parent_recovers_once_fixed(tmp_path: Path) -> None:
    """A parent that is a file fails with StoreUnavailableError; once fixed, the store works."""
    blocker = tmp_path / "blocker"
    blocker.write_text("not a directory")
    store = SQLiteStore(blocker / "agentfn.sqlite3")
    try:
        with pytest.raises(StoreUnavailableError):
            await store.record_delivery("msg_1", "s")
        blocker.unlink()
        blocker.mkdir()
        assert await store.record_delivery("msg_1", "s") is True
    finally:
        await store.close()


async def test_not_a_database_is_a_store_error(tmp_path: Path) -> None:
    """A file that is not SQLite raises StoreError (a configuration fault, not an outage)."""
    path = tmp_path / "garbage.sqlite3"
    path.write_bytes(b"this is not a database, just some bytes" * 100)
    store = SQLiteStore(path)
    with pytest.raises(StoreError) as info:
        await store.open()
    assert not isinstance(info.value, StoreUnavailableError)
    assert isinstance(info.value.__cause__, sqlite3.DatabaseError)
    await store.close()


async def _opened(db_path: Path) -> sqlite3.Connection:
    """The file made by a store and closed again, opened raw."""
    store = SQLiteStore(db_path)
    await store.open()
    await store.close()
    return sqlite3.connect(db_path)


async def test_unreadable_schema_is_refused(db_path: Path) -> None:
    """A file a later release made unreadable to this one (a contract step) is refused
    with a StoreError naming both versions, and left as it is."""
    (await _opened(db_path)).close()
    ahead = len(STEPS) + 2
    with sqlite3.connect(db_path) as raw:
        raw.execute("UPDATE schema_version SET version = ?, readable_from = ?", (ahead, ahead - 1))
    raw.close()
    store = SQLiteStore(db_path)
    with pytest.raises(
        StoreError, match=f"schema version {ahead}, readable from version {ahead - 1}"
    ):
        await store.open()
    await store.close()
    with sqlite3.connect(db_path) as raw:
        assert raw.execute("SELECT * FROM schema_version").fetchall() == [(ahead, ahead - 1)]
    raw.close()


async def test_a_new_file_has_the_tables_and_indexes_of_the_newest_schema(db_path: Path) -> None:
    """The first step makes the calls table with its columns in this order and exactly
    these indexes, and records this release's version, readable from 1."""
    with await _opened(db_path) as raw:
        assert raw.execute("SELECT * FROM schema_version").fetchall() == [(len(STEPS), 2)]
        indexes = {
            name
            for (name,) in raw.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
            )
        }
        names = [row[1] for row in raw.execute("PRAGMA table_info(calls)")]
    raw.close()
    assert names[-11:] == [
        "quarantine_reason",
        "next_attempt_at",
        "failures",
        "namespace",
        "approval_id",
        "approval",
        "limiter",
        "counted",
        "history",
        "history_tail",
        "history_count",
    ]
    assert indexes == {
        "deliveries_due",
        "deliveries_listed",
        "deliveries_unresolved",
        "calls_listed",
        "calls_state",
        "calls_tool",
        "calls_claimed",
        "calls_due",
        "calls_finished",
        "calls_approval",
        "calls_waiting",
        "calls_approved",
        "calls_limiter",
        "calls_line",
        "calls_waiters",
    }


async def test_recovery_and_prune_queries_use_the_partial_indexes(
    store: SQLiteStore, db_path: Path
) -> None:
    """SQLite uses a partial index only when a query repeats its condition term for term; the
    shared predicates make every recovery and prune query do so."""
    params = {
        "due_before": 0.0,
        "takeover_before": 0.0,
        "upto": 0.0,
        "after_at": 0.0,
        "after_session": "s",
        "after_turn": "t",
        "after_call": "c",
        "namespace": "",
        "before": 0.0,
        "limit": 10,
        "batch": 10,
        # flow control's admission: one call's limiter and place
        "limiter": "report",
        "session_id": "s",
        "turn_id": "t",
        "call_id": "c",
        "created_at": 0.0,
        "holders_bound": 2,
        "ahead_bound": 2,
    }
    expected = {
        UNRESOLVED_DELIVERIES: ("deliveries_due",),
        WORKLIST_READS["unsubmitted_results", True, False]: ("calls_due",),
        WORKLIST_READS["unsubmitted_results", True, True]: ("calls_due",),
        WORKLIST_READS["expired_claims", True, False]: ("calls_claimed", "calls_waiters"),
        PRUNE_DELIVERIES: ("deliveries_listed",),
        PRUNE_CALLS: ("calls_finished",),
        ADMISSION: ("calls_limiter",),
    }
    with sqlite3.connect(db_path) as raw:
        for template, indexes in expected.items():
            query = "EXPLAIN QUERY PLAN " + SQLITE.render(template).text
            plan = " ".join(str(row[3]) for row in raw.execute(query, params))
            for index in indexes:
                assert f"INDEX {index}" in plan, (index, plan)


async def test_a_sessions_calls_are_found_by_the_key(store: SQLiteStore, db_path: Path) -> None:
    """The read of a session's calls (every delivery makes one) seeks the primary key: it
    walked the listing index in creation order, every call of the namespace, once that
    index existed (111 ms a delivery at 10^6 stored calls; SQLite has no statistics)."""
    for i in range(3):
        await store.claim_call(
            CallKey(f"s{i}", "t", "c"), tool_name="lookup", owner="a", lease_seconds=30
        )
    assert [r.key.session_id for r in await store.calls_for_session("s1")] == ["s1"]
    query = "EXPLAIN QUERY PLAN " + SQLITE.render(CALLS_FOR_SESSION).text
    with sqlite3.connect(db_path) as raw:
        plan = " ".join(
            str(row[3]) for row in raw.execute(query, {"namespace": "", "session_id": "s"})
        )
    assert "INDEX sqlite_autoindex_calls_1 (namespace=? AND session_id=?)" in plan, plan


async def test_the_approval_lists_read_in_index_order(store: SQLiteStore, db_path: Path) -> None:
    """The waiting requests (the page's list, the expiry) and the approved calls (every
    replica's poll) are read from their index in the list's whole order: the rows shown
    and no more, never a sort of every waiting row; the gauge's count reads its tally."""
    await hold_for_approval(store, 300, expires_at=time.time() + 3600)
    listed = await store.waiting_approvals(limit=20)
    assert [r.key.call_id for r in listed] == [f"c{i:05}" for i in range(20)]
    assert await store.count_waiting_approvals() == 300
    params = {"namespace": "", "limit": 20, "upto": 0.0}
    expected = {
        WORKLIST_READS["waiting_approvals", False, False]: "calls_waiting",
        WORKLIST_READS["waiting_approvals", True, False]: "calls_waiting",
        COUNT_WAITING_APPROVALS: "sqlite_autoindex_tallies_1",
        WORKLIST_READS["approved_calls", False, False]: "calls_approved",
    }
    with sqlite3.connect(db_path) as raw:
        for template, index in expected.items():
            query = "EXPLAIN QUERY PLAN " + SQLITE.render(template).text
            plan = " ".join(str(row[3]) for row in raw.execute(query, params))
            assert f"INDEX {index}" in plan and "TEMP B-TREE" not in plan, plan


async def test_a_prune_gives_the_space_back_off_the_loop(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pages a prune frees go back to the file system (incremental vacuum, on the
    store's thread, never the event loop's): the file shrinks instead of staying as large
    as it ever was."""
    from agentfn_asgi.store.sql import sqlite as sqlite_module

    ran_on: set[str] = set()
    vacuum = sqlite_module._vacuum_job

    def spied(conn: sqlite3.Connection) -> tuple[int, int]:
        ran_on.add(threading.current_thread().name)
        return vacuum(conn)

    monkeypatch.setattr(sqlite_module, "_vacuum_job", spied)
    store = SQLiteStore(db_path)
    for first in range(0, 10_000, 500):
        await asyncio.gather(
            *(store.record_delivery(f"d{i}", "s" * 400) for i in range(first, first + 500))
        )
    await store.close()
    full = (await asyncio.to_thread(db_path.stat)).st_size
    await store.open()
    assert await store.prune(deliveries_before=time.time() + 1, calls_before=0) == 10_000
    assert (await store.stats()).deliveries == 0
    await store.close()
    pruned = (await asyncio.to_thread(db_path.stat)).st_size
    assert full > 4_000_000 and pruned < full / 10, (full, pruned)
    assert ran_on == {f"agentfn-sqlite:{db_path}"}


async def test_a_file_made_without_auto_vacuum_is_pruned_and_keeps_its_pages(
    db_path: Path,
) -> None:
    """A file whose tables came before ``auto_vacuum`` cannot give pages back: its prune
    removes the rows all the same and stops there (the pages are reused by later rows)."""
    with sqlite3.connect(db_path) as raw:
        raw.execute("CREATE TABLE earlier (x)")
    store = SQLiteStore(db_path)
    await asyncio.gather(*(store.record_delivery(f"d{i}", "s" * 400) for i in range(500)))
    assert await store.prune(deliveries_before=time.time() + 1, calls_before=0) == 500
    await store.close()
    with sqlite3.connect(db_path) as raw:
        assert raw.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
        assert raw.execute("PRAGMA freelist_count").fetchone()[0] > 0


async def test_closed_store_refuses_then_reopens(db_path: Path) -> None:
    """close() finishes queued work; later calls fail until open() is called again."""
    store = SQLiteStore(db_path)
    pending = [asyncio.create_task(store.record_delivery(f"d{i}", "s")) for i in range(50)]
    await asyncio.sleep(0)
    await store.close()
    assert all(await asyncio.gather(*pending))
    with pytest.raises(StoreUnavailableError, match="closed"):
        await store.stats()
    await store.open()
    assert (await store.stats()).deliveries == 50
    await store.close()


async def test_cancelled_call_does_not_wedge_the_store(store: SQLiteStore) -> None:
    """Cancelling awaiters leaves the store usable and consistent."""
    tasks = [asyncio.create_task(store.record_delivery(f"d{i}", "s")) for i in range(200)]
    await asyncio.sleep(0)
    for task in tasks[::2]:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert await store.record_delivery("after", "s") is True
    stats = await store.stats()
    assert 101 <= stats.deliveries <= 201


def _worker_threads(path: Path) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == f"agentfn-sqlite:{path}"]


async def test_forgotten_store_stops_its_thread(db_path: Path) -> None:
    """A store dropped without close() does not leak its worker thread."""
    store = SQLiteStore(db_path)
    await store.ping()
    assert len(_worker_threads(db_path)) == 1
    del store
    gc.collect()
    for _ in range(100):
        if not _worker_threads(db_path):
            break
        await asyncio.sleep(0.01)
    assert _worker_threads(db_path) == []


def test_bad_options_are_configuration_errors(tmp_path: Path) -> None:
    """:memory: and unknown synchronous modes are refused at construction."""
    with pytest.raises(ConfigurationError, match="memory://"):
        SQLiteStore(":memory:")
    with pytest.raises(ConfigurationError, match="synchronous"):
        SQLiteStore(tmp_path / "x.sqlite3", synchronous="OFF")
    assert SQLiteStore(tmp_path / "x.sqlite3", synchronous="full").synchronous == "FULL"


async def test_synchronous_full_works(tmp_path: Path) -> None:
    """The durable-against-power-loss mode is a working option, not just accepted."""
    store = SQLiteStore(tmp_path / "full.sqlite3", synchronous="FULL")
    try:
        assert await store.record_delivery("msg_1", "s") is True
    finally:
        await store.close()


async def test_an_idle_writer_lets_the_loop_run_a_turns_operations_in_one_commit(
    store: SQLiteStore, db_path: Path
) -> None:
    """With the writer thread idle, one loop turn's operations run on the loop thread (no
    thread hop) in one transaction; with the write lock held elsewhere they go to the thread
    and land once it is free (the loop never waits)."""
    loop_thread = threading.get_ident()

    def commits(conn: sqlite3.Connection) -> int:
        return conn.total_changes

    # A turn right after the thread's idle checkpoint (0.5 s without work: a loaded machine
    # pauses that long) goes to the thread, which starts the WAL over; the next runs here.
    for attempt in range(3):
        before = await store._call(commits)
        outcomes = await asyncio.gather(
            *(store.record_delivery(f"d{i}-{attempt}", "s") for i in range(10)),
            store._call(lambda conn: (threading.get_ident(), conn.in_transaction)),
        )
        assert all(outcomes[:10])
        if outcomes[10] == (loop_thread, True):
            break
    assert outcomes[10] == (loop_thread, True)  # inside the turn's shared transaction
    # Each insert also moved the deliveries' tally (its trigger): two changes a delivery.
    assert await store._call(commits) == before + 2 * 10

    def write_where(conn: sqlite3.Connection) -> int:
        conn.execute("UPDATE deliveries SET attempts = attempts + 1 WHERE delivery_id = 'd0-0'")
        return threading.get_ident()

    raw = sqlite3.connect(db_path, isolation_level=None)
    try:
        raw.execute("BEGIN IMMEDIATE")
        pending = asyncio.create_task(store._call(write_where))
        await asyncio.sleep(0.05)
        assert not pending.done()  # waiting for the lock on the thread, not on the loop
        raw.execute("COMMIT")
        assert await pending != loop_thread
    finally:
        raw.close()


async def test_commits_that_would_fsync_never_run_on_the_loop(tmp_path: Path) -> None:
    """Under ``synchronous=FULL`` every commit fsyncs, and under NORMAL the first commit
    after a checkpoint that copied the whole WAL back syncs the WAL's new header: those go
    to the writer thread; the commits after it run on the loop again."""
    loop_thread = threading.get_ident()

    def write_where(conn: sqlite3.Connection) -> int:
        conn.execute("UPDATE deliveries SET attempts = attempts + 1 WHERE delivery_id = 'd0'")
        return threading.get_ident()

    async def on_the_loop_again(store: SQLiteStore) -> bool:
        # The thread's own idle checkpoint (after 0.5 s without work: a loaded machine
        # pauses that long) sends the next commit to it too; the ones after it run here.
        for _ in range(3):
            if await store._call(write_where) == loop_thread:
                return True
        return False

    full = SQLiteStore(tmp_path / "full.sqlite3", synchronous="FULL")
    normal = SQLiteStore(tmp_path / "normal.sqlite3")
    try:
        for store in (full, normal):
            await store.record_delivery("d0", "s")
            await store._call(write_where)  # the connection is open, the thread idle
        assert not await on_the_loop_again(full)
        assert await on_the_loop_again(normal)
        writer = normal._writer
        assert writer is not None
        with writer.conn.lock:
            writer.conn.checkpoint()  # what the idle thread does
        assert await normal._call(write_where) != loop_thread
        assert await on_the_loop_again(normal)
    finally:
        await full.close()
        await normal.close()


async def test_a_value_sqlite_cannot_take_is_a_store_error(store: SQLiteStore) -> None:
    """A lone surrogate (a command-line argument of undecodable bytes) or an integer past
    64 bits is refused with the package's StoreRefusedError (retrying never succeeds: the
    dispatcher fails such a call), not the driver's own exception."""
    with pytest.raises(StoreRefusedError, match="refused a value"):
        await store.record_delivery("d\ud800", "s")
    with pytest.raises(StoreRefusedError, match="refused a value"):
        await store._call(lambda conn: conn.execute("SELECT ?", (2**64,)).fetchone())
    assert await store.record_delivery("d1", "s") is True
