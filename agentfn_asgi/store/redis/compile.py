"""The state table (:mod:`agentfn_asgi.calls.states`) rendered as Lua, for the Redis store.

No script of a transition is written by hand: each row's guards and effects are rendered
here, as the SQL of the other stores is (:mod:`agentfn_asgi.store.sql.compile`), so a row
exists in one place and the stores cannot drift from the reference
(:func:`~agentfn_asgi.calls.states.apply`).

``may_<row>(c, a)`` for every row, where ``c`` is the call as :data:`LUA_READ` reads it
(``state``, ``owner``, ``attempt``, ``lease``, ``updated``, ``approval_id``; ``state`` false
when absent) and ``a`` the step's arguments (strings; absent ones nil; ``admitted`` a
boolean the admission sets); ``apply_<row>(key, member, c, a)`` (:func:`lua_apply`), which
makes the change, appends the event and reindexes the call; and the script of a row run
alone (:func:`lua_transition`).
"""

from __future__ import annotations

from typing import Final

from agentfn_asgi.calls.records import CallState
from agentfn_asgi.calls.states import TRANSITIONS, Guard, Target, Transition
from agentfn_asgi.store._codec import APPROVAL_COLUMNS, RESULT_COLUMNS, flat_columns

__all__ = ["LUA_GUARDS", "LUA_READ", "LUA_WRITE", "lua_apply", "lua_states", "lua_transition"]


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
    Guard.UNCHANGED_SINCE: "(a.since == nil or tonumber(c.updated) <= tonumber(a.since))",
    Guard.APPROVAL_OPEN: "tonumber(a.now) < tonumber(c.lease)",
    Guard.APPROVAL_LAPSED: "tonumber(a.now) >= tonumber(c.lease)",
    Guard.DUE: "tonumber(c.lease) <= tonumber(a.now)",
    Guard.ADMITTED: "a.admitted == true",
    Guard.REFUSED: "a.admitted == false",
    Guard.SAME_REQUEST: "c.approval_id == a.approval_id",
    Guard.KNOWN_BEFORE: "(a.since ~= nil and tonumber(c.created) <= tonumber(a.since))",
}


def _lua_guard(row: Transition) -> str:
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
                       'updated_at', 'approval_id', 'created_at')
  return {state = r[1], owner = r[2], attempt = r[3], lease = r[4], updated = r[5],
          approval_id = r[6], created = r[7]}
end
"""

#: Lua: ``may_<row>(c, a)`` for every row of the table.
LUA_GUARDS: Final = LUA_READ + "".join(_lua_guard(row) for row in TRANSITIONS.values())


def _lua_value(column: str, source: str) -> str:
    if source == "now":
        return "a.now"
    if source.isdigit():
        return f"'{source}'"
    return f"a.{column if column in (*RESULT_COLUMNS, *APPROVAL_COLUMNS) else source[1:]}"


def lua_apply(name: str) -> str:
    """``apply_<name>(key, member, c, a)``: row ``name``'s effects on the call's hash, its
    event, its indexes (the caller checked ``may_<name>``). A nil value clears its field."""
    row = TRANSITIONS[name]
    lines = ["local set, drop = {}, {}"]
    attempt = "c.attempt"
    if name == "claim":
        lines.append("set = {'failures', '0', 'namespace', a.namespace, 'tool_name', a.tool_name,")
        lines.append("       'session_id', a.session_id, 'turn_id', a.turn_id,")
        lines.append("       'call_id', a.call_id}")
        lines.append("redis.call('SADD', N .. 's:' .. h(a.session_id), member)")
        lines.append("redis.call('SADD', N .. 'k:' .. h(a.call_id), member)")
    if isinstance(row.target, CallState):
        lines.append(f"put(set, drop, 'state', '{row.target.value}')")
    elif row.target is Target.BY_RESULT:
        lines.append("put(set, drop, 'state', a.state)")
    for field, source in row.sets:
        for column in flat_columns(field):
            if source == "+1":
                lines.append(f"local {column} = redis.call('HINCRBY', key, '{column}', 1)")
                if column == "attempt":
                    attempt = "attempt"
            elif source == "null":
                lines.append(f"table.insert(drop, '{column}')")
            elif source.startswith("?"):
                value = f"a.{source[2:]}"
                lines.append(f"if {value} then redis.call('HSETNX', key, '{column}', {value}) end")
            else:
                lines.append(f"put(set, drop, '{column}', {_lua_value(column, source)})")
                if column == "attempt":
                    attempt = _lua_value(column, source)
    lines.append("local was = redis.call('HGET', key, 'state')")
    lines.append("write(key, set, drop)")
    if row.event is not None:
        owner = "a.owner" if "owner" in row.says else "nil"
        detail = "a.detail" if "detail" in row.says else "nil"
        lines.append(f"add_event(member, a.now, '{row.event}', {attempt}, {owner}, {detail})")
    lines.append("reindex_call(key, member, was)")
    body = "\n".join("  " + line for line in lines)
    return f"local function apply_{name}(key, member, c, a)\n{body}\nend\n"


#: Lua: the writing helpers every ``apply_<row>`` uses.
LUA_WRITE: Final = """
-- A field to set (value) or to clear (nil).
local function put(set, drop, field, value)
  if value == nil then table.insert(drop, field) else
    table.insert(set, field)
    table.insert(set, value)
  end
end
local function write(key, set, drop)
  if #drop > 0 then redis.call('HDEL', key, unpack(drop)) end
  if #set > 0 then redis.call('HSET', key, unpack(set)) end
end
"""


def lua_transition(name: str) -> str:
    """The script of row ``name`` run alone. KEYS: the call's hash. ARGV: the namespace's
    prefix, the call's member, '1' to answer the record, then the step's arguments as
    name/value pairs. Answers false (no call), or {1 or 0 (whether it happened), then the
    call's hash fields when asked}."""
    return (
        lua_apply(name)
        + f"""
local key, member = KEYS[1], ARGV[2]
local a = {{}}
for i = 4, #ARGV, 2 do a[ARGV[i]] = ARGV[i + 1] end
local c = guard_fields(key)
if not c.state then return false end
local done = 0
if may_{name}(c, a) then
  apply_{name}(key, member, c, a)
  done = 1
end
if ARGV[3] == '1' then return {{done, redis.call('HGETALL', key)}} end
return {{done}}
"""
    )
