"""Every SQL statement and every Redis script that changes a call carries out one row of the
state table (agentfn_asgi.states) with that row's guard, resulting state, event and
attempt; none changes a call without a row. (The memory store executes the table itself;
the generated histories then hold every backend's behaviour to it.)

A dropped or altered guard in a statement or a script fails here: the statements and scripts
use the text rendered from the table (store/_guards.py), and these tests look for it."""

from __future__ import annotations

import re

import pytest

from agentfn_asgi.records import CallState
from agentfn_asgi.states import SAVED, TRANSITIONS, Guard, Target, Transition
from agentfn_asgi.store import _redis_scripts as lua
from agentfn_asgi.store import _sql_statements as sql
from agentfn_asgi.store._guards import LUA_GUARDS, lua_states, sql_guard, sql_states

# -- SQL -------------------------------------------------------------------------------------

#: The CLAIM upsert sees the existing row as ``c.`` and the claimant as ``excluded.owner``.
_UPSERT: dict[str, dict[str, str]] = {
    "take_over": {"alias": "c."},
    "reclaim": {"alias": "c.", "owner": "excluded.owner"},
}


def _sql_statement(name: str) -> str:
    text = getattr(sql, name)
    assert isinstance(text, str), name
    return text


def _sql_guards(row: Transition, statement: str) -> list[str]:
    """The guard text ``statement`` must hold to carry out ``row``."""
    if row.name == "claim":
        return []  # an INSERT: the row is absent
    if row.name == "prune":
        return [sql_states(row.sources)]  # the partial index's own predicate
    if row.name == "mark_stale":
        return [sql_guard("mark_stale", optional=statement == "MARK_STALE_UNCHANGED")]
    upsert = _UPSERT.get(row.name, {})
    return [sql_guard(row.name, alias=upsert.get("alias", ""), owner=upsert.get("owner", ":owner"))]


def _writes_calls(text: str) -> bool:
    return bool(re.search(r"(UPDATE|INSERT INTO|DELETE FROM) \{p\}calls\b", text))


def test_every_row_has_its_sql_statement() -> None:
    """No row of the table lacks a statement; no listed statement is unknown."""
    assert set(sql.ROWS) == set(TRANSITIONS)
    for names in sql.ROWS.values():
        for name in names:
            assert _writes_calls(_sql_statement(name)), name


def test_no_sql_statement_changes_a_call_without_a_row() -> None:
    """Every statement of the module that writes the calls table is some row's."""
    listed = {name for names in sql.ROWS.values() for name in names}
    writers = {
        name
        for name in dir(sql)
        if name.isupper() and isinstance(getattr(sql, name), str)
        if _writes_calls(getattr(sql, name))
    }
    assert writers == listed


@pytest.mark.parametrize(
    ("row", "statement"),
    [(row, statement) for row, statements in sql.ROWS.items() for statement in statements],
)
def test_each_sql_statement_has_its_rows_guard_state_and_event(row: str, statement: str) -> None:
    """The statement's condition is the row's, it sets the row's resulting state, appends the
    row's event and starts the next attempt exactly when the row does."""
    transition, text = TRANSITIONS[row], _sql_statement(statement)
    for guard in _sql_guards(transition, statement):
        assert guard in text, (row, statement, guard)
    target = transition.target
    if transition.name == "claim":
        assert "VALUES (:session_id, :turn_id, :call_id, :tool_name, 'claimed', 1," in text
    elif target is Target.BY_RESULT:
        assert "SET state = :state" in text
    elif isinstance(target, CallState) and transition.name != "take_over":
        assert f"state = '{target.value}'," in text.split("WHERE")[0], (row, statement)
    if transition.event is not None:
        assert f"'kind', '{transition.event}'" in text, (row, statement)
    if transition.new_attempt:
        assert "attempt + 1" in text, (row, statement)
    # No state condition in the statement's WHERE beyond the guard's own.
    if transition.name != "claim" and row not in _UPSERT:
        where = text.rsplit("WHERE", 1)[1]
        for guard in _sql_guards(transition, statement):
            where = where.replace(guard, "")
        assert not re.search(r"\bstate\s*(=|IN)", where), (row, statement, where)
    # Flow control: the rows that set a call's limiter set it, those that clear it clear it
    # (the upsert only when it takes over), the others leave it.
    assignments = text.split("WHERE")[0] if transition.name != "claim" else text
    if transition.limiter is True:
        assert "limiter = :limiter" in assignments, (row, statement)
    elif transition.limiter is False and row in _UPSERT:
        assert "THEN c.limiter ELSE NULL END" in assignments, (row, statement)
    elif transition.limiter is False:
        assert "limiter = NULL" in assignments, (row, statement)
    elif transition.name != "claim" and row not in _UPSERT:
        assert not re.search(r"\blimiter\s*=", assignments), (row, statement)


def test_the_sql_state_fragments_are_the_tables_sets() -> None:
    """The partial indexes and listings use the table's sets, spelled as the guards are."""
    from agentfn_asgi.store._sql_schema import FRAGMENTS

    assert FRAGMENTS["saved"] == sql_states(SAVED)
    assert FRAGMENTS["finished"] == sql_states(TRANSITIONS["prune"].sources)
    assert FRAGMENTS["may_settle"] == sql_guard("settle")


# -- Lua -------------------------------------------------------------------------------------


def _lua_script(name: str) -> str:
    text = getattr(lua, name)
    assert isinstance(text, str), name
    # The script's own body: after the prelude and the rendered guards every script shares.
    return text.split(LUA_GUARDS, 1)[1]


def _lua_changes_a_call(body: str) -> bool:
    return bool(
        re.search(r"'state', '|'state', state|store_result\(|'DEL', key, history_key", body)
    )


def test_every_row_has_its_lua_script() -> None:
    """No row of the table lacks a script; each listed script changes calls."""
    assert set(lua.ROWS) == set(TRANSITIONS)


def test_no_lua_script_changes_a_call_without_a_row() -> None:
    """Every script that sets a call's state (or deletes a call) is some row's; the
    migration's scripts move records as they are and are no transition."""
    listed = {name for names in lua.ROWS.values() for name in names}
    changing = {
        name
        for name in lua.__all__
        if not name.startswith("MIGRATE") and name != "LAYOUT"
        if _lua_changes_a_call(_lua_script(name))
    }
    assert changing <= listed
    moving = {
        name
        for row, names in lua.ROWS.items()
        if TRANSITIONS[row].target is not Target.SAME
        for name in names
    }
    assert moving <= changing


@pytest.mark.parametrize(
    ("row", "script"),
    [(row, script) for row, scripts in lua.ROWS.items() for script in scripts if row != "prune"],
)
def test_each_lua_script_asks_its_row(row: str, script: str) -> None:
    """The script decides with ``may_<row>`` (the table's rendered guard), sets the row's
    state and appends its event; it makes no state decision of its own beyond that."""
    transition, body = TRANSITIONS[row], _lua_script(script)
    assert f"may_{row}(" in body, (row, script)
    if transition.event is not None:
        assert f"'{transition.event}'" in body, (row, script)
    if transition.new_attempt:
        assert "'attempt', 1)" in body, (row, script)
    target = transition.target
    if isinstance(target, CallState) and row not in ("take_over",):
        assert f"'state', '{target.value}'" in body, (row, script)
    asked = set(re.findall(r"\bmay_(\w+)\(", body))
    assert asked == {r for r, scripts in lua.ROWS.items() if script in scripts} - {"prune"}
    # Only the claim tells the claimant what it found (busy, saved, done).
    decisions = re.findall(r"c\.state ==|cur\[1\] ==|SAVED\[|PENDING\[", body)
    if script != "CLAIM":
        assert not decisions, (row, script, decisions)


_LIMITER_SET = r"'HSET', [^)]*'limiter', L\.name"
_LIMITER_CLEARED = r"'HDEL', [^)]*'limiter'"


@pytest.mark.parametrize(
    ("row", "script"),
    [
        (row, script)
        for row, scripts in lua.ROWS.items()
        for script in scripts
        if TRANSITIONS[row].limiter is not None
    ],
)
def test_each_lua_script_sets_or_clears_the_limiter_as_its_row_says(row: str, script: str) -> None:
    """Rows that take a slot or wait set the call's limiter to the step's; rows that enter
    ``claimed`` any other way clear it (the call then holds no slot)."""
    body = _lua_script(script)
    pattern = _LIMITER_SET if TRANSITIONS[row].limiter else _LIMITER_CLEARED
    assert re.search(pattern, body), (row, script)


def test_only_the_limiter_rows_scripts_change_the_limiter() -> None:
    """No script sets or clears a call's limiter but those of the rows that do."""
    listed = {
        name
        for row, names in lua.ROWS.items()
        if TRANSITIONS[row].limiter is not None
        for name in names
    }
    changing = {
        name
        for name in lua.__all__
        if not name.startswith("MIGRATE") and name != "LAYOUT"
        if re.search(f"{_LIMITER_SET}|{_LIMITER_CLEARED}", _lua_script(name))
    }
    assert changing == listed


def test_the_pruned_states_are_the_tables() -> None:
    """Only submitted and stale calls enter the index the pruner reads."""
    prelude = lua.CLAIM.split(LUA_GUARDS, 1)[0]
    finished = re.search(r"elseif (.*?) then\n\s*redis.call\('ZADD', I \.\. 'finished'", prelude)
    assert finished is not None
    states = set(re.findall(r"state == '(\w+)'", finished.group(1)))
    assert states == {s.value for s in TRANSITIONS["prune"].sources}


def test_the_lua_guards_are_rendered_from_the_table() -> None:
    """One ``may_<row>`` per row, each spelling its ways' states and guards."""
    for name, row in TRANSITIONS.items():
        function = re.search(rf"local function may_{name}\(c, a\)\n  return (.*)\nend", LUA_GUARDS)
        assert function is not None, name
        for way in row.ways:
            assert lua_states(way.states) in function.group(1), name
            if Guard.HOLDER in way.guards:
                assert "c.owner == a.owner and c.attempt == a.attempt" in function.group(1)
            if Guard.LEASE_LAPSED in way.guards:
                assert "tonumber(c.lease) < tonumber(a.takeover_before)" in function.group(1)
