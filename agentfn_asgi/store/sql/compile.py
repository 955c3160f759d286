# ruff: noqa: S608 - statements are rendered from the state table only, never input.
"""The state table (:mod:`agentfn_asgi.calls.states`) rendered as SQL, for SQLite and PostgreSQL.

No statement of a transition is written by hand: each row's guards (when it may happen) and
effects (what it changes, :attr:`~agentfn_asgi.calls.states.Transition.sets`) are rendered here,
so a row exists in one place and the stores cannot drift from the reference
(:func:`~agentfn_asgi.calls.states.apply`); the Lua of Redis is rendered from the same rows
(:mod:`agentfn_asgi.store.redis.compile`). ``docs/how-it-works/state-machine.md`` shows what
is rendered for every row; a test keeps that page equal to it.

:func:`sql_transition`: one ``UPDATE`` per row over named parameters (``:owner``, ``:now``,
``:takeover_before``, ``:since``, ``:admitted``...: the step's arguments, see
:data:`~agentfn_asgi.calls.states.Args`), whose ``WHERE`` is the row's guard and whose ``SET``
carries its effects and appends its history event (:func:`append_sql`). Every value on the
right of ``SET`` is the row's value before the change, as the table means it. The claim's
insert and its upsert (:func:`sql_claim`) are rendered from the ``claim``, ``take_over`` and
``reclaim`` rows.
"""

from __future__ import annotations

from typing import Final

from agentfn_asgi.calls.records import CallState
from agentfn_asgi.calls.states import (
    HISTORY_HEAD,
    HISTORY_TAIL,
    TRANSITIONS,
    WORKLISTS,
    Guard,
    Target,
    Transition,
    Way,
)
from agentfn_asgi.store._codec import APPROVAL_COLUMNS, RESULT_COLUMNS, flat_columns

__all__ = [
    "DETAIL_SQL",
    "OWNER_SQL",
    "append_sql",
    "event_sql",
    "sql_claim",
    "sql_guard",
    "sql_states",
    "sql_tallies",
    "sql_tally_name",
    "sql_transition",
    "sql_worklist",
]

OWNER_SQL: Final = "CAST(:owner AS {{text}})"
DETAIL_SQL: Final = "CAST(:detail AS {{text}})"


def sql_states(states: frozenset[CallState], *, alias: str = "") -> str:
    """``state = 'x'`` or ``state IN ('x', 'y')``, always in :class:`CallState` order, so a
    query and a partial index spell it identically (SQLite then uses the index)."""
    listed = [state for state in CallState if state in states]
    if len(listed) == 1:
        return f"{alias}state = '{listed[0].value}'"
    return f"{alias}state IN ({', '.join(repr(state.value) for state in listed)})"


def _sql_guard_term(guard: Guard, alias: str, owner: str) -> str:
    if guard is Guard.HOLDER:
        return f"{alias}owner = {owner} AND {alias}attempt = :attempt"
    if guard is Guard.OWN_LIVE_LEASE:
        return f"{alias}owner = {owner} AND {alias}lease_expires_at >= :now"
    if guard is Guard.LEASE_LAPSED:
        return f"{alias}lease_expires_at < :takeover_before"
    if guard is Guard.APPROVAL_OPEN:
        return f":now < {alias}lease_expires_at"
    if guard is Guard.APPROVAL_LAPSED:
        return f":now >= {alias}lease_expires_at"
    if guard is Guard.DUE:
        return f"{alias}lease_expires_at <= :now"
    if guard is Guard.ADMITTED:
        return ":admitted = 1"
    if guard is Guard.REFUSED:
        return ":admitted = 0"
    if guard is Guard.SAME_REQUEST:
        return f"{alias}approval_id = :approval_id"
    if guard is Guard.KNOWN_BEFORE:
        return f"{alias}created_at <= :since"
    return f"{alias}updated_at <= :since"


def _sql_way(way: Way, alias: str, owner: str, optional: bool) -> str:
    terms = [sql_states(way.states, alias=alias)]
    terms += [
        _sql_guard_term(guard, alias, owner)
        for guard in sorted(way.guards)
        if optional or guard is not Guard.UNCHANGED_SINCE
    ]
    return " AND ".join(terms)


def sql_guard(name: str, *, alias: str = "", owner: str = ":owner", optional: bool = False) -> str:
    """The condition under which row ``name`` applies to an existing row, in parentheses.

    ``alias`` prefixes the columns (``c.`` in an upsert), ``owner`` is the expression of the
    claimant; ``optional`` includes the guards a caller asks for only sometimes
    (``unchanged_since``: ``:since``)."""
    row = TRANSITIONS[name]
    ways = [way for way in row.ways if way.states]
    return "(" + " OR ".join(f"({_sql_way(w, alias, owner, optional)})" for w in ways) + ")"


def event_sql(kind: str, attempt: str, *, owner: str = "NULL", detail: str = "NULL") -> str:
    """SQL building one history event (:class:`~agentfn_asgi.calls.records.CallEvent` as JSON),
    from the statement's own values: ``attempt``, ``owner`` and ``detail`` are SQL
    expressions. The ``{{`` escapes survive the statement's ``fill``."""
    return (
        "CAST({{json_object}}('at', CAST(:now AS {{real}}), 'kind', '" + kind + "', "
        "'attempt', " + attempt + ", 'owner', " + owner + ", 'detail', " + detail + ") "
        "AS {{text}})"
    )


def append_sql(event: str, *, row: str = "", unless: str | None = None) -> str:
    """The ``SET`` assignments that append ``event`` (SQL from :func:`event_sql`) to a call's
    bounded history, from the row's values before the change (``row``: its alias and a dot).

    The first ``HISTORY_HEAD`` events go to ``history`` (concatenated JSON objects); the
    later ones to ``history_tail``, one per line, where past ``HISTORY_TAIL`` each append
    also cuts the oldest line off; ``history_count`` counts every event ever appended (those
    dropped are ``history_count`` minus those kept). So an append costs one bounded string
    operation however often the call was appended to. ``unless``: a condition under which
    nothing is appended. JSON text never holds a raw newline, so lines split events safely.
    """
    head, kept = HISTORY_HEAD, HISTORY_HEAD + HISTORY_TAIL
    count, history = f"{row}history_count", f"{row}history"
    tail = f"coalesce({row}history_tail, '')"

    # Under ``unless`` each column keeps its value (the first WHEN that holds wins).
    def keep(column: str) -> str:
        return "" if unless is None else f"WHEN {unless} THEN {column} "

    return (
        f"history = CASE {keep(history)}WHEN {count} < {head}"
        f" THEN coalesce({history}, '') || {event} ELSE {history} END,\n"
        f"        history_tail = CASE {keep(row + 'history_tail')}"
        f"WHEN {count} < {head} THEN {row}history_tail\n"
        f"            WHEN {count} < {kept} THEN {tail} || {event} || {{newline}}\n"
        f"            ELSE substr({tail}, {{strpos}}({tail}, {{newline}}) + 1) || {event}"
        " || {newline} END,\n"
        + (
            f"        history_count = {count} + 1"
            if unless is None
            else f"        history_count = CASE {keep(count)}ELSE {count} + 1 END"
        )
    )


def _sql_value(column: str, source: str, alias: str) -> str:
    """The SQL of a column's new value from its :data:`~agentfn_asgi.calls.states.SOURCES`."""
    if source == "now":
        return ":now"
    if source == "+1":
        return f"{alias}{column} + 1"
    if source == "null":
        return "NULL"
    if source.isdigit():
        return source
    if source.startswith("?"):
        return f"coalesce({alias}{column}, :{source[2:]})"
    # A result or a request is passed column by column, each under its own name.
    return ":" + (column if column in (*RESULT_COLUMNS, *APPROVAL_COLUMNS) else source[1:])


def _sql_values(row: Transition, alias: str = "") -> dict[str, str]:
    """Every column ``row`` sets, with the SQL of its new value (state first)."""
    values: dict[str, str] = {}
    if isinstance(row.target, CallState):
        values["state"] = f"'{row.target.value}'"
    elif row.target is Target.BY_RESULT:
        values["state"] = ":state"
    for field, source in row.sets:
        for column in flat_columns(field):
            values[column] = _sql_value(column, source, alias)
    return values


def _sql_event(row: Transition, alias: str = "") -> str:
    """The event ``row`` appends, as SQL; its attempt is the attempt after the change."""
    assert row.event is not None
    attempt = _sql_values(row, alias).get("attempt", f"{alias}attempt")
    return event_sql(
        row.event,
        attempt,
        owner=OWNER_SQL if "owner" in row.says else "NULL",
        detail=DETAIL_SQL if "detail" in row.says else "NULL",
    )


def sql_transition(name: str, *, returning: str | None = "{columns}", since: bool = False) -> str:
    """Row ``name`` as one ``UPDATE`` of the call keyed by ``{key}`` (a template for the
    statements' ``fill``), returning ``returning`` when given. ``since``: with the optional
    ``unchanged_since`` guard (``:since``)."""
    row = TRANSITIONS[name]
    sets = [f"{column} = {value}" for column, value in _sql_values(row).items()]
    if row.event is not None:
        sets.append(append_sql(_sql_event(row)))
    text = (
        "UPDATE {p}calls SET "
        + ",\n        ".join(sets)
        + f"\n    WHERE {{key}} AND {sql_guard(name, optional=since)}"
    )
    return text if returning is None else f"{text}\n    RETURNING {returning}"


def sql_claim(on_conflict: str | None) -> str:
    """The claim: the ``claim`` row as an insert; with ``on_conflict`` (what the statement
    returns), the ``take_over`` row as its upsert, unless the ``reclaim`` row holds (our
    own claim, retried: every column kept). Without it, an existing call is left alone."""
    claim = TRANSITIONS["claim"]
    values = {
        **{column: f":{column}" for column in ("session_id", "turn_id", "call_id", "tool_name")},
        "namespace": ":namespace",
        **_sql_values(claim),
        "history": _sql_event(claim),
        "history_count": "1",
    }
    text = (
        f"INSERT INTO {{p}}calls AS c ({', '.join(values)})\n"
        f"    VALUES ({', '.join(values.values())})\n"
        "    ON CONFLICT (namespace, session_id, turn_id, call_id) "
    )
    if on_conflict is None:
        return text + "DO NOTHING RETURNING {columns}"
    take_over, reclaim = TRANSITIONS["take_over"], sql_guard("reclaim", alias="c.")
    sets = [
        f"{column} = CASE WHEN {reclaim} THEN c.{column} ELSE {value} END"
        for column, value in _sql_values(take_over, "c.").items()
    ]
    sets.append(append_sql(_sql_event(take_over, "c."), row="c.", unless=reclaim))
    return (
        text
        + "DO UPDATE SET\n        "
        + ",\n        ".join(sets)
        + f"\n    WHERE {sql_guard('take_over', alias='c.')} OR {reclaim}"
        + f"\n    RETURNING {on_conflict}"
    )


def sql_tally_name(row: str) -> str:
    """What the call ``row`` (``NEW.``, ``OLD.``, or ``""``) counts as in ``{p}tallies``, as
    SQL: ``calls.<state>``, a submitted failure apart (``calls.submitted.failed``), so the
    overview splits successes from failures without reading a row."""
    failed = f"{sql_states(frozenset({CallState.SUBMITTED}), alias=row)} AND {row}success = false"
    return f"'calls.' || {row}state || CASE WHEN {failed} THEN '.failed' ELSE '' END"


_SQLITE_TALLY = (
    "INSERT INTO {{p}}tallies (namespace, name, shard, n) VALUES ({row}namespace, {name}, 0, {n})"
    " ON CONFLICT (namespace, name, shard) DO UPDATE SET n = n + excluded.n;"
)
_PG_TALLY = (
    "INSERT INTO {{p}}tallies AS t (namespace, name, shard, n)"
    " VALUES ({row}namespace, {name}, pg_backend_pid(), {n})"
    " ON CONFLICT (namespace, name, shard) DO UPDATE SET n = t.n + excluded.n;"
)


def sql_tallies(engine: str) -> tuple[str, ...]:
    """The triggers that keep ``{p}tallies`` (how many calls in each state, how many
    deliveries) equal to the tables, for ``engine`` (``sqlite`` or ``postgres``).

    They follow the tables, not the rows of the state table: whichever row (or prune, or a
    release before this one during a rolling deploy) inserts, changes the state of, or
    deletes a call, its count moves, in the same statement. A new state needs nothing
    here. PostgreSQL counts in one row per server process (``shard``: its pid), so two
    transactions never wait on the same counter (and never deadlock on two), and counts a
    delete once per statement; SQLite has one writer and one shard. Readers add the
    shards up.
    """
    new, old = sql_tally_name("NEW."), sql_tally_name("OLD.")
    if engine == "sqlite":
        add = _SQLITE_TALLY.format(row="NEW.", name=new, n="1")
        remove = _SQLITE_TALLY.format(row="OLD.", name=old, n="-1")
        delivery_in = _SQLITE_TALLY.format(row="NEW.", name="'deliveries'", n="1")
        delivery_out = _SQLITE_TALLY.format(row="OLD.", name="'deliveries'", n="-1")
        return (
            "CREATE TRIGGER IF NOT EXISTS calls_tally_insert AFTER INSERT ON {p}calls"
            f" BEGIN {add} END",
            "CREATE TRIGGER IF NOT EXISTS calls_tally_update AFTER UPDATE OF state, success"
            f" ON {{p}}calls WHEN ({old}) IS NOT ({new}) BEGIN {remove} {add} END",
            "CREATE TRIGGER IF NOT EXISTS calls_tally_delete AFTER DELETE ON {p}calls"
            f" BEGIN {remove} END",
            "CREATE TRIGGER IF NOT EXISTS deliveries_tally_insert AFTER INSERT ON {p}deliveries"
            f" BEGIN {delivery_in} END",
            "CREATE TRIGGER IF NOT EXISTS deliveries_tally_delete AFTER DELETE ON {p}deliveries"
            f" BEGIN {delivery_out} END",
        )
    add = _PG_TALLY.format(row="NEW.", name=new, n="1")
    remove = _PG_TALLY.format(row="OLD.", name=old, n="-1")
    delivery_in = _PG_TALLY.format(row="NEW.", name="'deliveries'", n="1")
    # A delete (prune's batches of 500) is counted once per statement, from its transition
    # table: one row updated 500 times in one transaction would leave a chain of 500 row
    # versions for each update to walk.
    gone = sql_tally_name("")
    return (
        "CREATE OR REPLACE FUNCTION {p}calls_tally() RETURNS trigger LANGUAGE plpgsql AS $$"
        # The condition in parentheses: PL/pgSQL ends an IF's condition at the first THEN,
        # a CASE's included.
        f" BEGIN IF (TG_OP = 'UPDATE' AND ({old}) IS NOT DISTINCT FROM ({new})) THEN RETURN NULL;"
        f" END IF; IF TG_OP = 'UPDATE' THEN {remove} END IF; {add} RETURN NULL; END $$",
        "CREATE OR REPLACE TRIGGER calls_tally AFTER INSERT OR UPDATE OF state, success"
        " ON {p}calls FOR EACH ROW EXECUTE FUNCTION {p}calls_tally()",
        "CREATE OR REPLACE FUNCTION {p}calls_untally() RETURNS trigger LANGUAGE plpgsql AS $$"
        " BEGIN INSERT INTO {p}tallies AS t (namespace, name, shard, n)"
        f" SELECT namespace, {gone}, pg_backend_pid(), -count(*) FROM gone"
        f" GROUP BY namespace, {gone} ORDER BY 1, 2"
        " ON CONFLICT (namespace, name, shard) DO UPDATE SET n = t.n + excluded.n;"
        " RETURN NULL; END $$",
        "CREATE OR REPLACE TRIGGER calls_untally AFTER DELETE ON {p}calls"
        " REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION {p}calls_untally()",
        "CREATE OR REPLACE FUNCTION {p}deliveries_tally() RETURNS trigger LANGUAGE plpgsql"
        f" AS $$ BEGIN {delivery_in} RETURN NULL; END $$",
        "CREATE OR REPLACE TRIGGER deliveries_tally AFTER INSERT ON {p}deliveries"
        " FOR EACH ROW EXECUTE FUNCTION {p}deliveries_tally()",
        "CREATE OR REPLACE FUNCTION {p}deliveries_untally() RETURNS trigger LANGUAGE plpgsql"
        " AS $$ BEGIN INSERT INTO {p}tallies AS t (namespace, name, shard, n)"
        " SELECT namespace, 'deliveries', pg_backend_pid(), -count(*) FROM gone"
        " GROUP BY namespace ORDER BY 1"
        " ON CONFLICT (namespace, name, shard) DO UPDATE SET n = t.n + excluded.n;"
        " RETURN NULL; END $$",
        "CREATE OR REPLACE TRIGGER deliveries_untally AFTER DELETE ON {p}deliveries"
        " REFERENCING OLD TABLE AS gone FOR EACH STATEMENT"
        " EXECUTE FUNCTION {p}deliveries_untally()",
    )


def sql_worklist(name: str, *, bounded: bool, after: bool) -> str:
    """The read of worklist ``name`` (:data:`~agentfn_asgi.calls.states.WORKLISTS`): one
    SELECT a set of its states, each then read from its own partial index in the list's
    order (never a sort of every row), joined by UNION ALL; ``bounded``: its column at or
    before ``:upto``; ``after``: past the cursor ``:after_at`` and the key."""
    work = WORKLISTS[name]
    order = f"{work.column}, session_id, turn_id, call_id" if work.by_key else work.column
    where = f" AND {work.column} {'<' if work.strict else '<='} :upto" if bounded else ""
    if after:
        where += f" AND ({order}) > (:after_at, :after_session, :after_turn, :after_call)"
    arms = " UNION ALL ".join(
        f"SELECT {{columns}} FROM {{p}}calls WHERE namespace = :namespace"
        f" AND {sql_states(states)}{where}"
        for states in work.states
    )
    return f"{arms} ORDER BY {order} LIMIT :limit"
