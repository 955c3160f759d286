"""Upgrades of the SQL stores lose nothing (issue 22).

Each fixture under ``fixtures/`` is a database made by an earlier release's own store code
(``fixtures/make_sql_fixtures.py`` says how and which commit), holding work in flight: an
unresolved delivery, a saved result never submitted, a quarantined call. Opened by this
version, with a namespace (an app with ``OPENAI_PROJECT_ID=proj_x``) or without:

- rows written before namespaces existed (schemas 1 and 2) are adopted by the opener's
  namespace: the owed result is due for the sweep, the quarantined call is listed and can be
  settled, the delivery is due; no other namespace sees them;
- rows written at schema 3 keep the namespace they were written with;
- a long history written before the bound is cut to its first and last events on upgrade;
- through the app (schemas 1 and 2): its start-up sweep submits the owed result to the
  (fake) Agents API, resolves the delivery, and an operator settles the quarantined call,
  which is submitted;
- the upgraded database has a new one's columns, primary keys and indexes.
"""

from __future__ import annotations

import contextlib
import secrets
import sqlite3
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest

from agentfn_asgi import AgentWebhookApp, DispatchSettings
from agentfn_asgi.config import Config
from agentfn_asgi.errors import StoreUnavailableError
from agentfn_asgi.operator import Operator
from agentfn_asgi.records import CallKey, CallQuery, CallState, SavedResult
from agentfn_asgi.results import event_json, success_event
from agentfn_asgi.store import SQLiteStore, Store
from agentfn_asgi.store._sql_schema import SCHEMA_VERSION
from agentfn_asgi.testing import FakeAgentsAPI, FakeCall, serve_fake
from agentfn_asgi.tools import FunctionTools

from .conftest import POSTGRES_URL, require_service

FIXTURES = Path(__file__).parent / "fixtures"
OWED = CallKey("sess_owed", "turn_owed", "call_owed")
HELD = CallKey("sess_held", "turn_held", "call_held")
DONE = CallKey("sess_done", "turn_done", "call_done")
BLANK = CallKey("sess_blank", "turn_blank", "call_blank")
#: After the fixtures' writes (at 1,700,000,000 and a few seconds on).
NOW = 1_700_001_000.0

pytestmark = pytest.mark.anyio
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.backends)]


def fixture_text(backend: str, version: int, ids: Mapping[str, str] | None = None) -> str:
    """The dump of ``backend`` at schema ``version``; ``ids`` renames the fixture's ids (its
    turn ids, to the fake API's), as if the earlier code had been given those."""
    text = (FIXTURES / f"{backend}_v{version}.sql").read_text()
    for old, new in (ids or {}).items():
        text = text.replace(old, new)
    return text


class Loaded:
    """A restored fixture: ``open(namespace)`` opens a store on it (closed after the test)."""

    def __init__(self, make: Callable[[str, Callable[[], float]], Store], url: str) -> None:
        self._make = make
        self.url = url
        self.stores: list[Store] = []

    async def open(self, namespace: str, clock: Callable[[], float] = lambda: NOW) -> Store:
        store = self._make(namespace, clock)
        self.stores.append(store)
        await store.open()
        return store


@contextlib.asynccontextmanager
async def restored(
    backend: str, version: int, tmp_path: Path, ids: Mapping[str, str] | None = None
) -> AsyncIterator[Loaded]:
    """Restore a fixture into a new SQLite file or a new PostgreSQL schema."""
    text = fixture_text(backend, version, ids)
    if backend == "sqlite":
        path = tmp_path / f"upgrade-{secrets.token_hex(4)}.sqlite3"
        with contextlib.closing(sqlite3.connect(path)) as raw:
            raw.executescript(text)
        loaded = Loaded(lambda ns, clock: SQLiteStore(path, clock=clock, namespace=ns), str(path))
        loaded.url = f"sqlite:///{path}"
        try:
            yield loaded
        finally:
            for store in loaded.stores:
                await store.close()
        return
    asyncpg = pytest.importorskip("asyncpg")
    from agentfn_asgi.store.postgres import PostgresStore

    schema = f"afn_upgrade_{secrets.token_hex(6)}"
    try:
        conn = await asyncpg.connect(POSTGRES_URL)
    except (OSError, asyncpg.PostgresError) as exc:
        require_service("postgres", f"cannot connect: {exc}")
    try:
        await conn.execute(text.replace("__SCHEMA__", schema))
    finally:
        await conn.close()
    loaded = Loaded(
        lambda ns, clock: PostgresStore(POSTGRES_URL, schema=schema, clock=clock, namespace=ns),
        f"{POSTGRES_URL}?schema={schema}",
    )
    try:
        yield loaded
    finally:
        for store in loaded.stores:
            await store.close()
        conn = await asyncpg.connect(POSTGRES_URL)
        try:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        finally:
            await conn.close()


def operator_result(key: CallKey, text: str) -> SavedResult:
    event = event_json(success_event(key.turn_id, key.call_id, text))
    return SavedResult(True, event, f"idem-operator-{key.call_id}", source="operator")


async def schema_version(loaded: Loaded, backend: str) -> int:
    if backend == "sqlite":
        with contextlib.closing(sqlite3.connect(loaded.url.removeprefix("sqlite:///"))) as raw:
            return int(raw.execute("PRAGMA user_version").fetchone()[0])
    import asyncpg

    schema = loaded.url.rsplit("schema=", 1)[1]
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        query = f'SELECT max(version) FROM "{schema}".schema_version'  # noqa: S608 - ours
        return int(await conn.fetchval(query))
    finally:
        await conn.close()


async def assert_work_in_flight(store: Store, *, history: bool) -> None:
    """The owed result, the held call and the unresolved delivery, all in ``store``'s
    namespace, as an app's sweep, listings and operators look for them."""
    [owed] = await store.unsubmitted_results(due_before=NOW)
    assert owed.key == OWED and owed.state is CallState.SUCCEEDED
    assert owed.result is not None and '"output":"owed result"' in owed.result.event_json
    [held] = await store.list_calls(CallQuery(state="quarantined"))
    assert held.key == HELD and held.quarantine_reason == "reconcile could not decide"
    assert [d.delivery_id for d in await store.unresolved_deliveries(due_before=NOW)] == [
        "msg_owed"
    ]
    assert [r.key for r in await store.find_calls("call_owed")] == [OWED]
    done = await store.get_call(DONE)
    assert done is not None and done.state is CallState.SUBMITTED
    stats = await store.stats()
    assert (stats.deliveries, stats.unresolved_deliveries) == (2, 1)
    assert stats.calls_by_state["quarantined"] == 1
    # The held call is settled in this namespace; the owed one submitted.
    settled = await store.settle(HELD, result=operator_result(HELD, "settled"))
    assert settled is not None and settled.state is CallState.SUCCEEDED
    await store.mark_submitted(OWED, detail="HTTP 202, 1 request")
    await store.mark_delivery_resolved("msg_owed")
    owed_now = await store.get_call(OWED, history=True)
    assert owed_now is not None and owed_now.state is CallState.SUBMITTED
    assert owed_now.history[-1].kind == "submitted"
    if not history:  # written before histories existed: only what happened since
        assert [event.kind for event in owed_now.history] == ["submitted"]
    assert await store.unresolved_deliveries(due_before=NOW) == []


async def assert_sees_nothing(store: Store) -> None:
    assert await store.unsubmitted_results(due_before=NOW) == []
    assert await store.list_calls(CallQuery()) == []
    assert await store.unresolved_deliveries(due_before=NOW) == []
    assert await store.get_call(OWED) is None
    assert await store.find_calls("call_held") == []
    assert (await store.stats()).deliveries == 0


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("namespace", ["proj_x", ""])
async def test_rows_from_before_namespaces_are_adopted_by_the_upgrading_store(
    backend: str, version: int, namespace: str, tmp_path: Path
) -> None:
    """Schemas 1 and 2 had no namespaces: the first store to open the database upgrades it
    and adopts every row into its namespace, where all the work in flight is found; another
    namespace opening it later sees none of it."""
    async with restored(backend, version, tmp_path) as loaded:
        store = await loaded.open(namespace)
        assert await schema_version(loaded, backend) == SCHEMA_VERSION
        other = await loaded.open("proj_other" if namespace else "proj_x")
        await assert_sees_nothing(other)
        await assert_work_in_flight(store, history=False)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_rows_written_at_schema_3_keep_their_namespace(backend: str, tmp_path: Path) -> None:
    """Schema 3 rows were written by an app with a namespace ("" included): whoever opens
    the database first, each row stays in its own."""
    async with restored(backend, 3, tmp_path) as loaded:
        first = await loaded.open("proj_x")  # upgrades; adopts nothing
        await assert_sees_nothing(first)
        blank = await loaded.open("")
        [owed] = await blank.unsubmitted_results(due_before=NOW)
        assert owed.key == BLANK
        assert [d.delivery_id for d in await blank.unresolved_deliveries(due_before=NOW)] == [
            "msg_blank"
        ]
        assert await blank.list_calls(CallQuery(state="quarantined")) == []
        await assert_work_in_flight(await loaded.open("proj_a"), history=True)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_a_long_history_is_bounded_on_upgrade(backend: str, tmp_path: Path) -> None:
    """The schema-3 owed call was refused 60 times (62 events): upgraded, it keeps the first
    10 and the last 40 events and counts the 12 between; the next event drops one more."""
    async with restored(backend, 3, tmp_path) as loaded:
        store = await loaded.open("proj_a")
        owed = await store.get_call(OWED, history=True)
        assert owed is not None
        kinds = [event.kind for event in owed.history]
        assert kinds[:3] == ["claimed", "saved", "submit_failed"]
        assert (len(kinds), owed.history_dropped) == (50, 12)
        details = [event.detail for event in owed.history[2:]]
        kept = [f"HTTP 503 refused #{n}" for n in [*range(8), *range(20, 60)]]
        assert details == kept
        await store.submission_failed(OWED, detail="HTTP 503 refused #60", retry_at=NOW)
        again = await store.get_call(OWED, history=True)
        assert again is not None and again.history_dropped == 13
        assert [e.detail for e in again.history[10:]] == [
            *[f"HTTP 503 refused #{n}" for n in range(21, 60)],
            "HTTP 503 refused #60",
        ]
        assert again.history[:10] == owed.history[:10]


async def database_shape(loaded: Loaded, backend: str) -> dict[str, Any]:
    """Each table's columns and primary key, and the indexes, as the database reports them
    (the schema's own name left out)."""
    if backend == "sqlite":
        path = loaded.url.removeprefix("sqlite:///")
        with contextlib.closing(sqlite3.connect(path)) as raw:
            shape: dict[str, Any] = {
                table: sorted(
                    (name, kind, notnull, default, pk)
                    for _, name, kind, notnull, default, pk in raw.execute(
                        "SELECT * FROM pragma_table_info(?)", (table,)
                    )
                )
                for table in ("calls", "deliveries")
            }
            shape["indexes"] = sorted(
                raw.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index'")
            )
        shape["keys"] = {
            table: ", ".join(
                name for name, *_, pk in sorted(shape[table], key=lambda c: c[-1]) if pk
            )
            for table in ("calls", "deliveries")
        }
        return shape
    import asyncpg

    schema = loaded.url.rsplit("schema=", 1)[1]
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        shape = {
            table: sorted(
                tuple(row)
                for row in await conn.fetch(
                    "SELECT column_name, data_type, is_nullable, column_default"
                    " FROM information_schema.columns"
                    " WHERE table_schema = $1 AND table_name = $2",
                    schema,
                    table,
                )
            )
            + sorted(
                tuple(row)
                for row in await conn.fetch(
                    "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint"
                    " WHERE conrelid = to_regclass(quote_ident($1) || '.' || $2)",
                    schema,
                    table,
                )
            )
            for table in ("calls", "deliveries")
        }
        indexes = await conn.fetch(
            "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = $1", schema
        )
        shape["indexes"] = sorted(
            (row["indexname"], row["indexdef"].replace(schema, "S")) for row in indexes
        )
        shape["keys"] = {
            table: next(d for _, d in shape[table][-1:]).removeprefix("PRIMARY KEY (")[:-1]
            for table in ("calls", "deliveries")
        }
        return shape
    finally:
        await conn.close()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("version", [1, 2, 3])
async def test_an_upgraded_database_has_the_shape_of_a_new_one(
    backend: str, version: int, tmp_path: Path
) -> None:
    """After the upgrade the tables have a new database's columns and primary keys (the
    namespace first) and exactly its indexes, so the sweep's and prune's queries use the
    same indexes on both."""
    async with (
        restored(backend, version, tmp_path) as old,
        restored(backend, version, tmp_path) as new,
    ):
        await old.open("proj_x")
        # A new database: the same restore, emptied of its tables first.
        await drop_tables(new, backend)
        await new.open("proj_x")
        upgraded, fresh = await database_shape(old, backend), await database_shape(new, backend)
        assert upgraded == fresh
        assert upgraded["keys"] == {
            "calls": "namespace, session_id, turn_id, call_id",
            "deliveries": "namespace, delivery_id",
        }


async def drop_tables(loaded: Loaded, backend: str) -> None:
    if backend == "sqlite":
        path = loaded.url.removeprefix("sqlite:///")
        with contextlib.closing(sqlite3.connect(path)) as raw:
            raw.executescript("DROP TABLE calls; DROP TABLE deliveries; PRAGMA user_version = 0;")
        return
    import asyncpg

    schema = loaded.url.rsplit("schema=", 1)[1]
    conn = await asyncpg.connect(POSTGRES_URL)
    try:
        await conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    finally:
        await conn.close()


# -- through the app --------------------------------------------------------------------------

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SETTINGS = DispatchSettings(lease_seconds=5.0, recovery_interval=3600.0, recovery_grace=0.0)


def refusing_tools(ran: list[str]) -> FunctionTools:
    """The fixtures' tools; neither may run again (the owed result is saved, the held call
    waits for an operator)."""
    tools = FunctionTools()

    @tools.function
    def lookup() -> str:
        """Look something up."""
        ran.append("lookup")
        return "ran again"

    @tools.function
    def refund() -> str:
        """Refund."""
        ran.append("refund")
        return "ran again"

    return tools


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("project", ["proj_x", None])
async def test_an_app_upgrading_a_store_from_before_namespaces_submits_what_it_owes(
    backend: str, version: int, project: str | None, tmp_path: Path
) -> None:
    """An app started on a schema-1 or -2 store (with ``OPENAI_PROJECT_ID=proj_x``, or no
    project) submits the saved result through its start-up sweep and resolves the
    delivery; an operator lists the quarantined call and settles it, and that result is
    submitted too. Nothing runs twice."""
    fake = FakeAgentsAPI(webhook_secret=SECRET, api_key="sk-test")
    owed_session = fake.create_session(
        [[FakeCall("lookup", call_id="call_owed")]], session_id="sess_owed"
    )
    held_session = fake.create_session(
        [[FakeCall("refund", call_id="call_held")]], session_id="sess_held"
    )
    turn: dict[str, Any] = {
        "turn_owed": fake.required_actions(owed_session)[0]["turn_id"],
        "turn_held": fake.required_actions(held_session)[0]["turn_id"],
    }
    ran: list[str] = []
    async with contextlib.AsyncExitStack() as stack:
        loaded = await stack.enter_async_context(restored(backend, version, tmp_path, turn))
        base = await stack.enter_async_context(serve_fake(fake))
        environ = {
            "OPENAI_API_KEY": "sk-test",
            "OPENAI_BASE_URL": base,
            "OPENAI_WEBHOOK_SECRET": SECRET,
            "AGENTFN_STORE_URL": loaded.url,
            **({"OPENAI_PROJECT_ID": project} if project else {}),
        }
        app = AgentWebhookApp(
            refusing_tools(ran), config=Config.from_env(environ), settings=SETTINGS
        )
        assert app.store.namespace == (project or "")
        try:
            await stack.enter_async_context(app.lifespan())
        except StoreUnavailableError as exc:  # pragma: no cover - service gone mid-test
            require_service(backend, str(exc))
        await fake.wait_idle(owed_session, timeout=20)
        [owed] = fake.submissions
        assert (owed.session_id, owed.call_id, owed.output) == (
            "sess_owed",
            "call_owed",
            "owed result",
        )
        # The sweep resolves the delivery (reads its session) beside the resubmission; then
        # it is resolved, or already pruned as older than the dedup window (it is from 2023).
        with anyio.fail_after(20):
            while await app.store.list_deliveries(unresolved_only=True):
                await anyio.sleep(0.02)
        reads = {r.path for r in fake.requests if r.route == "retrieve"}
        assert reads == {"/v1/agents/sessions/sess_owed"}

        operator = Operator(app.store, dispatcher=app.dispatcher, location=app.store_location)
        [held] = await app.store.list_calls(CallQuery(state="quarantined"))
        assert held.key.call_id == "call_held"
        outcome = await operator.settle("call_held", output="refunded by hand")
        assert outcome.status == "submitted", outcome
        await fake.wait_idle(held_session, timeout=20)
        assert [(s.call_id, s.output) for s in fake.submissions] == [
            ("call_owed", "owed result"),
            ("call_held", "refunded by hand"),
        ]
        assert ran == []
        settled = await app.store.get_call(held.key)
        assert settled is not None and settled.state is CallState.SUBMITTED


def test_every_fixture_says_which_commit_made_it() -> None:
    for path in sorted(FIXTURES.glob("*.sql")):
        assert "made by commit" in path.read_text().splitlines()[0], path
