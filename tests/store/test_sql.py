"""The shared SQL: rendering for each dialect, and the schema's upgrade plan (no database)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from agentfn_asgi.store._codec import record_from_mapping
from agentfn_asgi.store._sql_dialect import SQLITE, postgres_dialect
from agentfn_asgi.store._sql_schema import (
    CALL_COLUMNS,
    INDEXES,
    SCHEMA_VERSION,
    TABLES,
    UPGRADES,
    schema_changes,
)
from agentfn_asgi.store._sql_statements import CLAIM


def test_postgres_numbers_parameters_in_order_of_first_use() -> None:
    """:name becomes $n, a repeated name keeps its number, and the arguments follow."""
    query = postgres_dialect("agentfn").render(
        "UPDATE {p}calls SET a = :b, c = :now WHERE d = :now AND e = :a_b"
    )
    assert query.text == 'UPDATE "agentfn".calls SET a = $1, c = $2 WHERE d = $2 AND e = $3'
    assert query.arguments({"now": 1.5, "b": "x", "a_b": None, "unused": 0}) == ["x", 1.5, None]


def test_schema_names_are_quoted_and_never_read_as_parameters() -> None:
    """A schema name with quotes, ":" or "$" is a quoted identifier, not SQL or a parameter."""
    query = postgres_dialect('we:ird "$1" name').render("SELECT {text} FROM {p}t WHERE x = :x")
    assert query.text == 'SELECT text FROM "we:ird ""$1"" name".t WHERE x = $1'
    assert query.order == ("x",)


def test_sqlite_keeps_named_parameters_and_has_no_prefix() -> None:
    """sqlite3 takes :name with a mapping: the text keeps them; tables are unqualified."""
    query = SQLITE.render("SELECT {boolean}, {real} FROM {p}calls WHERE a = :a AND b = :a")
    assert query.text == "SELECT INTEGER, REAL FROM calls WHERE a = :a AND b = :a"
    assert query.order == ()


def test_the_claim_says_what_it_does_to_which_state() -> None:
    """The upsert inserts attempt 1, takes over only a claimed call whose lease expired
    before the margin (attempt + 1), and returns our own live claim unchanged."""
    text = " ".join(SQLITE.render(CLAIM).text.split())
    assert "'claimed', 1," in text
    assert "THEN c.attempt ELSE c.attempt + 1 END" in text
    assert (
        "WHERE ((c.state = 'claimed' AND c.lease_expires_at < :takeover_before))"
        " OR ((c.state IN ('claimed', 'waiting') AND c.owner = excluded.owner"
        " AND c.lease_expires_at >= :now))"
    ) in text
    # A take-over holds no slot of a limiter; our own retried claim keeps what it held.
    assert "THEN c.limiter ELSE NULL END" in text


def test_a_fresh_database_gets_tables_and_indexes_only() -> None:
    """Version 0 with no tables: CREATE TABLE for each, the indexes, the (harmless) upgrades."""
    changes = schema_changes(0, {}, rekey="rebuild")
    creates = [c for c in changes if c.startswith("CREATE TABLE")]
    assert [c.split()[5] for c in creates] == [f"{{p}}{table}" for table in TABLES]
    assert not [c for c in changes if c.startswith("ALTER")]
    upgrades = [u for version in sorted(UPGRADES) for u in UPGRADES[version]]
    assert len(changes) == len(TABLES) + len(INDEXES) + len(upgrades)


def test_an_older_database_gets_only_its_missing_columns() -> None:
    """Existing tables are altered, never re-created, and only by the columns they lack;
    a table they lack (revocations, schema 4; buckets, schema 6) is created."""
    calls = [name for name, _ in CALL_COLUMNS if name != "quarantine_reason"]
    deliveries = [name for name, _ in TABLES["deliveries"][0]]
    revoked = [name for name, _ in TABLES["revoked_tokens"][0]]
    changes = schema_changes(1, {"calls": calls, "deliveries": deliveries}, rekey="constraint")
    assert [c for c in changes if c.startswith("CREATE TABLE") or " ADD COLUMN " in c] == [
        "ALTER TABLE {p}calls ADD COLUMN quarantine_reason {text}",
        "CREATE TABLE IF NOT EXISTS {p}revoked_tokens (token_id {text} NOT NULL,"
        " expires_at {real} NOT NULL, CONSTRAINT revoked_tokens_pkey PRIMARY KEY (token_id))",
        "CREATE TABLE IF NOT EXISTS {p}buckets (namespace {text} NOT NULL,"
        " limiter {text} NOT NULL, tokens {real} NOT NULL, updated_at {real} NOT NULL,"
        " CONSTRAINT buckets_pkey PRIMARY KEY (namespace, limiter))",
    ]
    current = schema_changes(
        SCHEMA_VERSION,
        {
            "calls": [*calls, "quarantine_reason"],
            "deliveries": deliveries,
            "revoked_tokens": revoked,
            "buckets": [name for name, _ in TABLES["buckets"][0]],
        },
        rekey="constraint",
    )
    assert all(c.startswith("CREATE INDEX IF NOT EXISTS") for c in current)


def test_a_database_before_version_4_gets_the_namespace_into_its_keys() -> None:
    """The primary keys lead with the namespace from version 4: PostgreSQL swaps the
    constraint, SQLite (which cannot alter a primary key) copies the table under the new one
    and replaces it, after the data upgrades and before the indexes are made again."""
    existing = {table: [name for name, _ in columns] for table, (columns, _) in TABLES.items()}
    swapped = schema_changes(3, existing, rekey="constraint")
    assert [c for c in swapped if "pkey" in c] == [
        "ALTER TABLE {p}deliveries DROP CONSTRAINT deliveries_pkey",
        "ALTER TABLE {p}deliveries ADD CONSTRAINT deliveries_pkey"
        " PRIMARY KEY (namespace, delivery_id)",
        "ALTER TABLE {p}calls DROP CONSTRAINT calls_pkey",
        "ALTER TABLE {p}calls ADD CONSTRAINT calls_pkey"
        " PRIMARY KEY (namespace, session_id, turn_id, call_id)",
    ]
    rebuilt = schema_changes(3, existing, rekey="rebuild")
    calls = [c for c in rebuilt if "calls_v4" in c or c == "DROP TABLE {p}calls"]
    assert [" ".join(c.split()[:3]) for c in calls] == [
        "CREATE TABLE IF",
        "INSERT INTO {p}calls_v4",
        "DROP TABLE {p}calls",
        "ALTER TABLE {p}calls_v4",
    ]
    assert "PRIMARY KEY (namespace, session_id, turn_id, call_id)" in calls[0]
    first_index = rebuilt.index(next(c for c in rebuilt if c.startswith("CREATE INDEX")))
    assert rebuilt.index(calls[-1]) < first_index
    assert [c for c in schema_changes(4, existing, rekey="rebuild") if "pkey" in c] == []


class _Recording(dict[str, Any]):
    """A row that remembers which fields were read."""

    def __init__(self, names: Iterator[str]) -> None:
        super().__init__((name, "1") for name in names)
        self.read: set[str] = set()

    def __getitem__(self, name: str) -> Any:
        self.read.add(name)
        return super().__getitem__(name)

    def get(self, name: str, default: Any = None) -> Any:
        self.read.add(name)
        return super().get(name, default)


def test_every_call_column_is_read_back() -> None:
    """A column added to the schema must also be read into the record (and vice versa)."""
    # The namespace is where a row lives, not a fact of the call: it is never read back.
    row = _Recording(iter(name for name, _ in CALL_COLUMNS if name != "namespace"))
    row["state"] = "claimed"
    row.read.clear()
    record_from_mapping(row)
    assert row.read == set(row)
