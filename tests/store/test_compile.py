"""The compilers of the state table (store/sql/compile.py, store/redis/compile.py): each row
rendered as one SQL statement and one Lua function carries exactly the row's guard, resulting
state, effects and event. (What the rendered text *does* is held to the reference,
states.apply, by the generated histories on SQLite, PostgreSQL and Redis:
tests/store/test_histories.py.)"""

from __future__ import annotations

import dataclasses
import re

import pytest

from agentfn_asgi.calls.records import CallState
from agentfn_asgi.calls.states import TRANSITIONS, Guard, Target, Transition, Way
from agentfn_asgi.store._codec import RESULT_COLUMNS
from agentfn_asgi.store.redis import scripts as lua
from agentfn_asgi.store.redis.compile import lua_apply, lua_transition
from agentfn_asgi.store.sql import statements as sql
from agentfn_asgi.store.sql.compile import sql_claim, sql_guard, sql_transition
from tests import state_machine_page

#: Rows that change an existing call with a statement of their own.
_UPDATES = [
    name
    for name, row in TRANSITIONS.items()
    if name not in ("claim", "reclaim", "take_over") and row.target is not Target.REMOVED
]


def _set_clause(text: str) -> str:
    return text.split("\n    WHERE ")[0]


def _columns_set(text: str) -> set[str]:
    return set(re.findall(r"^(?:UPDATE \{p\}calls SET |\s+)(\w+) = ", _set_clause(text), re.M))


#: Fields stored under another name: CallRecord.reason keeps schema 1's released column.
_COLUMN_OF = {"reason": "quarantine_reason"}


def _expected_columns(row: Transition) -> set[str]:
    columns = {"history", "history_tail", "history_count"} if row.event else set()
    if row.target is not Target.SAME:
        columns.add("state")
    for field, _ in row.sets:
        if field == "result":
            columns.update(RESULT_COLUMNS)
        elif field == "approval":
            columns.update(("approval_id", "approval"))
        else:
            columns.add(_COLUMN_OF.get(field, field))
    return columns


@pytest.mark.parametrize("name", _UPDATES)
def test_each_row_is_one_guarded_update_setting_exactly_its_effects(name: str) -> None:
    """The statement's WHERE is the key and the row's guard; its SET touches the row's
    columns and no other: a column left out or added is a drift from the table."""
    row = TRANSITIONS[name]
    text = sql_transition(name)
    assert text.startswith("UPDATE {p}calls SET ")
    assert f"WHERE {{key}} AND {sql_guard(name)}" in text
    assert _columns_set(text) == _expected_columns(row)
    if isinstance(row.target, CallState):
        assert f"state = '{row.target.value}'" in text
    if row.event is not None:
        assert f"'kind', '{row.event}'" in text
        expected_attempt = "attempt + 1" if row.new_attempt else "attempt"
        assert f"'attempt', {expected_attempt}, " in text
        assert ("CAST(:owner" in text) is ("owner" in row.says)
        assert ("CAST(:detail" in text) is ("detail" in row.says)


def test_the_optional_guard_is_rendered_only_when_asked() -> None:
    """mark_stale's unchanged_since guard is a variant of its own (``:since``); its way from
    ``unanswered`` always compares ``created_at`` (known_before: never true without a time)."""
    assert "updated_at <= :since" not in sql.TRANSITIONS_RETURNING["mark_stale"]
    assert "created_at <= :since" in sql.TRANSITIONS_RETURNING["mark_stale"]
    assert "updated_at <= :since" in sql.TRANSITIONS_RETURNING["mark_stale+since"]


def test_the_claim_is_the_claim_row_inserted_and_the_take_over_row_upserted() -> None:
    """The insert writes the claim row's effects; the upsert takes over only a lapsed claim,
    and keeps every column of our own live claim (reclaim)."""
    insert = sql_claim(None)
    for column in ("attempt", "owner", "lease_expires_at", "created_at", "delivery_id"):
        assert column in insert.split("VALUES")[0]
    assert insert.endswith("DO NOTHING RETURNING {columns}")
    upsert = sql_claim("{columns}")
    reclaim = sql_guard("reclaim", alias="c.")
    assert f"WHERE {sql_guard('take_over', alias='c.')} OR {reclaim}" in upsert
    for column in ("attempt", "owner", "lease_expires_at", "limiter", "delivery_id"):
        assert f"{column} = CASE WHEN {reclaim} THEN c.{column} ELSE" in upsert
    assert "coalesce(c.delivery_id, :delivery_id)" in upsert


@pytest.mark.parametrize("name", [*_UPDATES, "claim", "take_over"])
def test_each_row_is_one_lua_function_making_its_effects(name: str) -> None:
    """apply_<row> sets the row's fields, steps the attempt when the row does, appends the
    row's event and reindexes the call."""
    row = TRANSITIONS[name]
    text = lua_apply(name)
    assert text.startswith(f"local function apply_{name}(key, member, c, a)")
    for field, source in row.sets:
        stored = _COLUMN_OF.get(field, field)
        for column in RESULT_COLUMNS if field == "result" else [stored]:
            if field == "approval":
                continue
            assert f"'{column}'" in text, (name, column)
        if source == "+1":
            assert f"redis.call('HINCRBY', key, '{stored}', 1)" in text
        if source == "null":
            assert f"table.insert(drop, '{stored}')" in text
    if row.event is not None:
        attempt = "attempt" if row.new_attempt else ("'1'" if name == "claim" else "c.attempt")
        assert f"add_event(member, a.now, '{row.event}', {attempt}," in text
    else:
        assert "add_event" not in text
    assert text.rstrip().endswith("reindex_call(key, member, was)\nend")


def test_every_row_run_alone_has_its_script() -> None:
    """The rows a store makes one at a time each have a script; the claim's, the
    admission's and the count's rows live inside CLAIM, ADMIT and COUNT, rendered in the
    claim's order."""
    inside = ("claim_call", "admit_call", "count_call")
    alone = {n for n, r in TRANSITIONS.items() if r.operation not in inside}
    assert set(lua.TRANSITIONS) == alone - {"prune"}
    for name, script in lua.TRANSITIONS.items():
        assert lua_transition(name) in script
    for name in ("claim", "retry", "adopt", "take_over"):
        assert f"if may_{name}(c, a) then" in lua.CLAIM
        assert f"apply_{name}(key, member, c, a)" in lua.CLAIM
    for name in ("take_slot", "wait", "admit", "keep_waiting"):
        assert f"apply_{name}(key, member, c, a)" in lua.ADMIT
    assert "if may_count(c, a) then apply_count(key, member, c, a) end" in lua.COUNT


def test_a_new_row_is_rendered_with_no_hand_written_text() -> None:
    """A transition added to the table is a statement and a script at once: a test-only
    ``cancel`` row (any pending call → a terminal state, with an event) renders both."""
    cancel = Transition(
        "cancel",
        "cancel",
        (Way(frozenset({CallState.CLAIMED}), frozenset({Guard.UNCHANGED_SINCE})),),
        CallState.STALE,
        event="cancelled",
        sets=(("updated_at", "now"), ("limiter", "null")),
        says=frozenset({"detail"}),
    )
    table = {**TRANSITIONS, "cancel": cancel}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("agentfn_asgi.store.sql.compile.TRANSITIONS", table)
        patch.setattr("agentfn_asgi.store.redis.compile.TRANSITIONS", table)
        text = sql_transition("cancel", since=True)
        script = lua_transition("cancel")
    assert "state = 'stale'" in text and "limiter = NULL" in text
    assert "'kind', 'cancelled'" in text and "updated_at <= :since" in text
    assert "add_event(member, a.now, 'cancelled', c.attempt, nil, a.detail)" in script
    assert "table.insert(drop, 'limiter')" in script


def test_rows_refuse_fields_and_sources_the_compilers_do_not_know() -> None:
    """A misspelled field or source fails when the table is built, not in a store."""
    row = TRANSITIONS["renew"]
    with pytest.raises(ValueError, match="cannot set lease_expire"):
        dataclasses.replace(row, sets=(("lease_expire", "now"),))
    with pytest.raises(ValueError, match="from 'tomorrow'"):
        dataclasses.replace(row, sets=(("lease_expires_at", "tomorrow"),))


def test_the_reference_page_shows_what_the_compilers_render() -> None:
    """docs/how-it-works/state-machine.md holds the rendered SQL and Lua of every row: run
    `python -m tests.state_machine_page --write` after changing the table or a compiler."""
    text = state_machine_page.PAGE.read_text(encoding="utf-8")
    assert state_machine_page.page_section(text) == state_machine_page.markdown()
