"""The shared SQL: rendering for each dialect, and the schema's steps (no database)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from agentfn_asgi.errors import StoreError
from agentfn_asgi.store._codec import record_from_mapping
from agentfn_asgi.store._versions import Step
from agentfn_asgi.store.sql import schema as _sql_schema
from agentfn_asgi.store.sql.compile import sql_tallies
from agentfn_asgi.store.sql.dialect import SQLITE, postgres_dialect
from agentfn_asgi.store.sql.schema import (
    CALL_COLUMNS,
    INDEXES,
    STEPS,
    TABLES,
    fill,
    schema_changes,
)
from agentfn_asgi.store.sql.statements import CLAIM


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
        " OR ((c.state IN ('claimed', 'waiting') AND c.owner = :owner"
        " AND c.lease_expires_at >= :now))"
    ) in text
    # A take-over holds no slot of a limiter; our own retried claim keeps what it held.
    assert "THEN c.limiter ELSE NULL END" in text


def _version_row(version: int, readable_from: int) -> str:
    """The statement that records a version (numbers only: no input reaches it)."""
    values = f"VALUES ({version}, {readable_from})"
    return "INSERT INTO {p}schema_version (version, readable_from) " + values


def test_a_new_database_takes_the_first_step_and_records_its_version() -> None:
    """A new database gets the newest tables, the tallies' triggers of its engine and the
    indexes, made by the first step, and its version row last; one already there gets
    nothing."""
    for engine in ("sqlite", "postgres"):
        changes = schema_changes(None, "db", engine=engine)
        creates = [c for c in changes if c.startswith("CREATE TABLE")]
        assert [c.split()[5] for c in creates] == [f"{{p}}{table}" for table in TABLES]
        triggers = [fill(t) for t in sql_tallies(engine)]
        assert changes[len(TABLES) : len(TABLES) + len(triggers)] == triggers
        assert changes[len(TABLES) + len(triggers) : -2] == [fill(index) for index in INDEXES]
        assert changes[-2:] == [
            "DELETE FROM {p}schema_version",
            _version_row(len(STEPS), 2),
        ]
        assert schema_changes((len(STEPS), 1), "db", engine=engine) == []


def test_version_1_gains_the_tallies_counted_from_its_rows_and_the_listing_indexes() -> None:
    """Version 1 counted by reading every row: step 2 adds the budgets' column, the waiting
    line's index, the tallies,
    their triggers, one count of the rows there, and the listings' indexes."""
    changes = schema_changes((1, 1), "db", engine="sqlite")
    assert changes[0] == "ALTER TABLE {p}calls ADD COLUMN counted {integer}"
    assert changes[1].startswith("CREATE INDEX IF NOT EXISTS calls_line")
    assert changes[2].startswith("CREATE TABLE IF NOT EXISTS {p}tallies")
    assert changes[3 : 3 + len(sql_tallies("sqlite"))] == [fill(t) for t in sql_tallies("sqlite")]
    assert any(c.startswith("INSERT INTO {p}tallies") and "FROM {p}calls" in c for c in changes)
    assert "CREATE INDEX IF NOT EXISTS calls_listed" in " ".join(changes)
    assert changes[-1] == _version_row(2, 2)


def test_a_database_takes_the_steps_it_lacks_and_the_version_they_give(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With a next release's steps: a database of this release's version takes the next
    two only; an additive step keeps it readable from 1, a removal raises that to its own
    floor; a new database takes only the first step (which makes the newest tables) and
    both numbers."""
    now = len(STEPS)
    expand = Step(("ALTER TABLE {p}calls ADD COLUMN note {text}",), readable_from=1)
    contract = Step(("DROP INDEX {p}calls_approved",), readable_from=now + 1)
    monkeypatch.setattr(_sql_schema, "STEPS", (*STEPS, expand))
    assert schema_changes((now, 1), "db", engine="sqlite") == [
        "ALTER TABLE {p}calls ADD COLUMN note {text}",
        "DELETE FROM {p}schema_version",
        _version_row(now + 1, 1),
    ]
    monkeypatch.setattr(_sql_schema, "STEPS", (*STEPS, expand, contract))
    assert schema_changes((now, 1), "db", engine="sqlite")[-3:] == [
        "DROP INDEX {p}calls_approved",
        "DELETE FROM {p}schema_version",
        _version_row(now + 2, now + 1),
    ]
    new = schema_changes(None, "db", engine="sqlite")
    assert not [c for c in new if "note" in c or c.startswith("DROP")]
    assert new[-1].endswith(f"VALUES ({now + 2}, {now + 1})")


def test_data_ahead_is_worked_on_while_readable_and_refused_after() -> None:
    """A database a later release took an additive step further is left as it is (its
    replicas run beside this one); one that release made unreadable to this one is refused,
    naming both versions."""
    ahead = len(STEPS) + 2
    assert schema_changes((len(STEPS) + 1, 1), "db", engine="sqlite") == []
    with pytest.raises(
        StoreError, match=f"db has schema version {ahead}, readable from version {ahead - 1}"
    ):
        schema_changes((ahead, ahead - 1), "db", engine="sqlite")


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
