"""The state table's guards (:mod:`agentfn_asgi.states`) spelled in SQL and in Lua.

The SQL statements and the Redis scripts do not write a transition's condition by hand:
they use the text rendered here from the table's row, so a guard exists in one place and
the backends cannot drift from the reference. ``tests/store/test_state_table.py`` checks that
every statement and script that changes a call's state carries the rendering of the row it
makes, and that none changes a state the table does not allow.

SQL: :func:`sql_guard` gives a condition over the named parameters ``:owner``,
``:attempt``, ``:now``, ``:takeover_before``, ``:since`` and ``:admitted`` (1 or 0: the
limiter's answer, which the statement's caller computed in the same transaction).
Lua: :data:`LUA_GUARDS` defines ``may_<row>(c, a)`` for every row, where ``c`` is the call
as :data:`LUA_READ` reads it (``state``, ``owner``, ``attempt``, ``lease``, ``updated``;
``state`` false when absent) and ``a`` the script's arguments (``owner``, ``attempt``,
``now``, ``takeover_before``, ``since``; ``since`` '' when not asked for; ``admitted``, a
boolean the script sets from the limiter's answer before it asks a flow-control row).
"""

from __future__ import annotations

from typing import Final

from agentfn_asgi.records import CallState
from agentfn_asgi.states import TRANSITIONS, Guard, Transition, Way

__all__ = ["LUA_GUARDS", "LUA_READ", "lua_states", "sql_guard", "sql_states"]


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
    claimant (``excluded.owner`` there); ``optional`` includes the guards a caller asks for
    only sometimes (``unchanged_since``: ``:since``)."""
    row = TRANSITIONS[name]
    ways = [way for way in row.ways if way.states]
    return "(" + " OR ".join(f"({_sql_way(w, alias, owner, optional)})" for w in ways) + ")"


def lua_states(states: frozenset[CallState]) -> str:
    """A Lua condition on ``c.state`` (false, i.e. absent, when ``states`` is empty)."""
    if not states:
        return "not c.state"
    listed = [state for state in CallState if state in states]
    return "(" + " or ".join(f"c.state == '{state.value}'" for state in listed) + ")"


_LUA_GUARD_TERMS: Final = {
    Guard.HOLDER: "c.owner == a.owner and c.attempt == a.attempt",
    Guard.OWN_LIVE_LEASE: "c.owner == a.owner and tonumber(c.lease) >= tonumber(a.now)",
    Guard.LEASE_LAPSED: "tonumber(c.lease) < tonumber(a.takeover_before)",
    Guard.UNCHANGED_SINCE: "(a.since == '' or tonumber(c.updated) <= tonumber(a.since))",
    Guard.APPROVAL_OPEN: "tonumber(a.now) < tonumber(c.lease)",
    Guard.APPROVAL_LAPSED: "tonumber(a.now) >= tonumber(c.lease)",
    Guard.DUE: "tonumber(c.lease) <= tonumber(a.now)",
    Guard.ADMITTED: "a.admitted == true",
    Guard.REFUSED: "a.admitted == false",
}


def _lua_function(row: Transition) -> str:
    ways = [
        " and ".join([lua_states(way.states), *(_LUA_GUARD_TERMS[g] for g in sorted(way.guards))])
        for way in row.ways
    ]
    body = " or ".join(f"({way})" for way in ways)
    return f"local function may_{row.name}(c, a)\n  return {body}\nend\n"


#: Lua: read a call's guarded fields into ``c`` (see the module docstring).
LUA_READ: Final = """
local function guard_fields(key)
  local r = redis.call('HMGET', key, 'state', 'owner', 'attempt', 'lease_expires_at',
                       'updated_at')
  return {state = r[1], owner = r[2], attempt = r[3], lease = r[4], updated = r[5]}
end
"""

#: Lua: ``may_<row>(c, a)`` for every row of the table.
LUA_GUARDS: Final = LUA_READ + "".join(_lua_function(row) for row in TRANSITIONS.values())
