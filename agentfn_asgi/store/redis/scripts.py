"""Lua scripts of the Redis store, one per step (see :mod:`agentfn_asgi.store.redis.store`).

Each script runs atomically inside Redis: a record, its history and every index over it
change in one step, and nothing else runs in between. The key layout is drawn in the redis
module's docstring. Every script of a store's work is :data:`_PRELUDE` (shared helpers)
plus its own body; ``ARGV[1]`` is always the key prefix of the store's namespace
(``{p}n:{h(namespace)}:``), every key the script touches is built on it, so no script can
reach another namespace's keys; every time value is passed in from the caller's clock,
never read from Redis' ``TIME``. The key layout's version and its steps are in
:mod:`agentfn_asgi.store.redis.layout`.

Three rules the helpers keep:

- Indexes are never updated by hand: after a script changes a record it calls
  ``reindex_call``/``reindex_delivery``, which make the namespace's sorted sets agree with
  the record as it now is.
- A call's history is bounded (``add_event``): its first ``HISTORY_HEAD`` and last
  ``HISTORY_TAIL`` events are kept, and the hash's ``history_dropped`` counts the others;
  an append does a fixed amount of work however long the call has been going.
- Members are compared in byte order (``bytes_less``), the sorted sets' own order; Lua's
  ``<`` on strings follows the server's locale and would disagree.
"""

from __future__ import annotations

from agentfn_asgi.calls.records import CallState
from agentfn_asgi.calls.states import (
    CLAIM_ORDER,
    HISTORY_HEAD,
    HISTORY_TAIL,
    OWED_HERE,
    PRUNABLE,
    SAVED,
)
from agentfn_asgi.calls.states import TRANSITIONS as STATE_TABLE
from agentfn_asgi.store.redis.compile import LUA_GUARDS, LUA_WRITE, lua_apply, lua_transition

__all__ = [
    "ADMIT",
    "CLAIM",
    "COUNT",
    "COUNT_WAITING_APPROVALS",
    "DELIVERY_FAILED",
    "DUE_DELIVERIES",
    "FIND_APPROVAL",
    "GET_CALL",
    "LIST_CALLS",
    "LIST_DELIVERIES",
    "PRUNE_BUCKETS",
    "PRUNE_CALLS",
    "PRUNE_DELIVERIES",
    "RECORD_DELIVERY",
    "RESOLVE_DELIVERY",
    "SET_CALLS",
    "STATS",
    "WORKLIST",
]

#: The history's bounds, from :mod:`agentfn_asgi.calls.records` (the rule every store keeps).
_HISTORY = f"""
local HISTORY_HEAD, HISTORY_TAIL = {HISTORY_HEAD}, {HISTORY_TAIL}
"""

#: The state table's sets (:mod:`agentfn_asgi.calls.states`), as Lua tables.
_STATE_SETS = (
    "local STATES = {"
    + ", ".join(f"'{state.value}'" for state in CallState)
    + "}\nlocal SAVED = {"
    + ", ".join(f"{state.value} = true" for state in CallState if state in SAVED)
    + "}\nlocal PRUNABLE = {"
    + ", ".join(f"{state.value} = true" for state in CallState if state in PRUNABLE)
    + "}\nlocal PENDING = {"
    + ", ".join(f"{state.value} = true" for state in CallState if state in OWED_HERE)
    + "}\n"
)

_PRELUDE = (
    _HISTORY
    + """
-- N: the namespace's prefix, I: its indexes'.
local N = ARGV[1]
local I = N .. 'i:'
local function h(text) return redis.sha1hex(text) end
local function call_key(member) return N .. 'c:' .. h(member) end
local function history_key(member) return N .. 'h:' .. h(member) end
local function delivery_key(id) return N .. 'd:' .. h(id) end
local function approval_key(id) return N .. 'a:' .. h(id) end
"""
    + _STATE_SETS
    + """
-- The namespace's call indexes agree with the call's hash as it is now.
local function limiter_keys(name)
  local base = N .. 'l:' .. h(name) .. ':'
  return {holders = base .. 'holders', waiters = base .. 'waiters', bucket = base .. 'bucket'}
end

-- A call budget's set: the members of a session's calls of a tool counted against it.
local function budget_key(session_id, tool_name)
  return N .. 'b:' .. h(session_id) .. ':' .. h(tool_name)
end

-- The sorted set besides 'state:<s>' that holds a call in ``state`` (nil: none), and the
-- call's score in it, from its fields ``r`` (reindex_call's HMGET). A lapsed waiter (for a
-- limiter's slot) is adopted as a lapsed claim is taken over: both are in 'lease'.
local function state_index(state, r)
  if state == 'claimed' or state == 'waiting' then return 'lease', r[3] end
  if state == 'awaiting_approval' then return 'waiting', r[3] end
  if state == 'approved' then return 'approved', r[5] end
  if state == 'retry_scheduled' then return 'retry', r[3] end
  if SAVED[state] then return 'due', r[4] end
  if PRUNABLE[state] then return 'finished', r[5] end
  return nil, nil
end

-- ``was``: the state before the write (false or nil: unknown, every index is cleared).
local function reindex_call(key, member, was)
  local r = redis.call('HMGET', key, 'state', 'created_at', 'lease_expires_at',
                       'next_attempt_at', 'updated_at', 'success', 'limiter', 'approval_id',
                       'counted', 'session_id', 'tool_name')
  local state, created = r[1], r[2]
  -- A counted call stays counted (its budget's set), until prune removes it.
  if r[9] then redis.call('SADD', budget_key(r[10], r[11]), member) end
  -- A request is found by its id; a limiter's holders and waiters say whom its admission
  -- looks at (it drops whoever moved on); a call that left them for good (saved, held,
  -- scheduled...) leaves its sets here, so a limiter's sets last no longer than its calls.
  if r[8] then redis.call('SET', approval_key(r[8]), member) end
  if r[7] then
    local L = limiter_keys(r[7])
    if state == 'claimed' then
      redis.call('ZREM', L.waiters, member)
      redis.call('ZADD', L.holders, r[3], member)
    elseif state == 'waiting' then
      redis.call('ZADD', L.waiters, created, member)
    else
      redis.call('ZREM', L.holders, member)
      redis.call('ZREM', L.waiters, member)
    end
  end
  -- Out of the indexes of the state it was in (of every state, when that is unknown).
  local left = {was}
  if not was then left = STATES end
  for _, s in ipairs(left) do
    redis.call('ZREM', I .. 'state:' .. s, member)
    local name = state_index(s, r)
    if name then redis.call('ZREM', I .. name, member) end
  end
  if was == 'submitted' or not was then redis.call('ZREM', I .. 'submitted_failed', member) end
  redis.call('ZADD', I .. 'calls', created, member)
  redis.call('ZADD', I .. 'state:' .. state, created, member)
  local name, score = state_index(state, r)
  if name then redis.call('ZADD', I .. name, score, member) end
  if state == 'submitted' and r[6] == '0' then
    redis.call('ZADD', I .. 'submitted_failed', created, member)
  end
end

-- The namespace's delivery indexes agree with the delivery's hash as it is now.
local function reindex_delivery(key, id)
  local d = redis.call('HMGET', key, 'received_at', 'resolved', 'attempts', 'next_attempt_at')
  redis.call('ZADD', I .. 'deliveries', d[1], id)
  if d[2] == '1' then
    redis.call('ZREM', I .. 'unresolved', id)
    redis.call('ZREM', I .. 'deliveries_due', id)
    redis.call('ZREM', I .. 'failing', id)
  else
    redis.call('ZADD', I .. 'unresolved', d[1], id)
    redis.call('ZADD', I .. 'deliveries_due', d[4], id)
    if d[3] ~= '0' then redis.call('ZADD', I .. 'failing', d[1], id) end
  end
end

-- Marks the one history entry being dropped (never an event: those are JSON objects).
local DROPPED = '-'

-- Append one CallEvent (the shape of CallEvent.to_json) to the call's history list. Past
-- HISTORY_HEAD + HISTORY_TAIL events, the first of the tail (index HISTORY_HEAD) goes and
-- is counted: LSET marks it, LREM drops the first mark, HISTORY_HEAD + 1 entries from the
-- head. A bounded amount of work, so a call refused a thousand times stays cheap.
local function add_event(member, now, kind, attempt, owner, detail)
  local text = '{"at":' .. now .. ',"kind":"' .. kind .. '","attempt":' .. attempt
  if owner and owner ~= '' then text = text .. ',"owner":' .. cjson.encode(owner) end
  if detail and detail ~= '' then text = text .. ',"detail":' .. cjson.encode(detail) end
  local key = history_key(member)
  if redis.call('RPUSH', key, text .. '}') > HISTORY_HEAD + HISTORY_TAIL then
    redis.call('LSET', key, HISTORY_HEAD, DROPPED)
    redis.call('LREM', key, 1, DROPPED)
    redis.call('HINCRBY', call_key(member), 'history_dropped', 1)
  end
end

-- Is a before b in byte order (the order of sorted-set members with equal scores)?
local function bytes_less(a, b)
  if a == b then return false end
  for i = 1, math.min(#a, #b) do
    local x, y = a:byte(i), b:byte(i)
    if x ~= y then return x < y end
  end
  return #a < #b
end

-- Up to `limit` members of sorted set `index` with a score at most `max` (a ZRANGEBYSCORE
-- bound), in (score, member) order, strictly after (after_score, after_member) unless
-- after_score is ''. Only members tied at after_score are compared, so few ever are.
local function page_after(index, max, limit, after_score, after_member)
  local out, offset, at, min = {}, 0, tonumber(after_score), '-inf'
  if at then min = after_score end
  while #out < limit do
    local got = redis.call('ZRANGEBYSCORE', index, min, max, 'WITHSCORES', 'LIMIT', offset, limit)
    for i = 1, #got, 2 do
      if #out < limit and (not at or tonumber(got[i + 1]) > at
                           or bytes_less(after_member, got[i])) then
        table.insert(out, got[i])
      end
    end
    if #got < 2 * limit then break end
    offset = offset + limit
  end
  return out
end

-- A call's record, with its history when asked: {hash fields, history events}.
local function read_call(member, with_history)
  local flat = redis.call('HGETALL', call_key(member))
  if #flat == 0 then return nil end
  if with_history == '1' then return {flat, redis.call('LRANGE', history_key(member), 0, -1)} end
  return {flat, {}}
end

local function read_calls(members)
  local out = {}
  for _, m in ipairs(members) do
    local record = read_call(m, '0')
    if record then table.insert(out, record) end
  end
  return out
end

"""
)


def _script(body: str) -> str:
    # Every script may ask the state table's rows (may_<row>, rendered by store/sql/compile.py).
    return _PRELUDE + LUA_GUARDS + LUA_WRITE + body


# -- deliveries ----------------------------------------------------------------------------

# Guarantees: a delivery id is recorded once in the namespace (the first writer wins); a
# repeat with the same non-empty nonce (our own retried write) answers 1 again.
# KEYS: the delivery's hash. ARGV: N, now, delivery_id, session_id, namespace, nonce.
RECORD_DELIVERY = _script("""
if redis.call('EXISTS', KEYS[1]) == 1 then
  if ARGV[6] ~= '' and redis.call('HGET', KEYS[1], 'nonce') == ARGV[6] then return 1 end
  return 0
end
redis.call('HSET', KEYS[1], 'delivery_id', ARGV[3], 'session_id', ARGV[4],
           'received_at', ARGV[2], 'namespace', ARGV[5], 'resolved', '0', 'attempts', '0',
           'next_attempt_at', ARGV[2])
if ARGV[6] ~= '' then redis.call('HSET', KEYS[1], 'nonce', ARGV[6]) end
reindex_delivery(KEYS[1], ARGV[3])
return 1
""")

# Guarantees: an unresolved delivery becomes resolved and leaves the sweep's indexes.
# KEYS: the delivery's hash. ARGV: N, delivery_id.
RESOLVE_DELIVERY = _script("""
if redis.call('HGET', KEYS[1], 'resolved') == '0' then
  redis.call('HSET', KEYS[1], 'resolved', '1')
  reindex_delivery(KEYS[1], ARGV[2])
end
return 0
""")

# Guarantees: an unresolved delivery's failed resolve is counted, its error kept, and it
# is due again at retry_at; a resolved or unknown one is left alone.
# KEYS: the delivery's hash. ARGV: N, delivery_id, error, retry_at.
DELIVERY_FAILED = _script("""
if redis.call('HGET', KEYS[1], 'resolved') == '0' then
  redis.call('HINCRBY', KEYS[1], 'attempts', 1)
  redis.call('HSET', KEYS[1], 'last_error', ARGV[3], 'next_attempt_at', ARGV[4])
  reindex_delivery(KEYS[1], ARGV[2])
end
return 0
""")

# Read: unresolved deliveries due at or before due_before, by (next_attempt_at, id), after
# the cursor. KEYS: the namespace's deliveries_due. ARGV: N, due_before, limit, after_at
# ('' = from the start), after_id. Returns the deliveries' hashes.
DUE_DELIVERIES = _script("""
local out = {}
for _, id in ipairs(page_after(KEYS[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5])) do
  table.insert(out, redis.call('HGETALL', delivery_key(id)))
end
return out
""")

# Read: the newest `limit` deliveries of an index scored by received_at (ties by id,
# descending). KEYS: the namespace's deliveries or unresolved. ARGV: N, limit.
LIST_DELIVERIES = _script("""
local out = {}
for _, id in ipairs(redis.call('ZREVRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1)) do
  table.insert(out, redis.call('HGETALL', delivery_key(id)))
end
return out
""")

# Guarantees: one batch of the namespace's deliveries received before `before` is deleted
# with its index entries. ARGV: N, before, batch. Returns the count.
PRUNE_DELIVERIES = _script("""
local ids = redis.call('ZRANGEBYSCORE', I .. 'deliveries', '-inf', '(' .. ARGV[2],
                       'LIMIT', 0, tonumber(ARGV[3]))
for _, id in ipairs(ids) do
  for _, name in ipairs({'deliveries', 'unresolved', 'deliveries_due', 'failing'}) do
    redis.call('ZREM', I .. name, id)
  end
  redis.call('DEL', delivery_key(id))
end
return #ids
""")

# -- calls: the steps of a call's life -----------------------------------------------------

# Flow control (agentfn_asgi.calls.states): a limiter's keys live under the namespace at
# {n}l:{h(name)}: (a name may hold any character): `holders` (members of the calls that
# took a slot, scored by their lease then), `waiters` (members of the calls waiting for
# one, scored by created_at: with the member's byte order, the line's order) and `bucket`
# (its rate's {tokens, updated_at}). The call hashes are the authority: the sets only say
# whom to look at, and the count drops every member whose hash says it moved on (saved,
# quarantined, taken over, pruned...), so no other script has to know about them. Only
# CLAIM (with a limit) and ADMIT read or change them.
_ADMISSION = (
    "".join(lua_apply(name) for name in ("take_slot", "wait", "admit", "keep_waiting"))
    + """
-- The step's limit, from ARGV[at..at + 5]: name, concurrency, rate, burst ('' = no bound),
-- then how many holders and waiters ahead to count (admission_bounds() of the table).
local function read_limit(at)
  return {name = ARGV[at], concurrency = tonumber(ARGV[at + 1]),
          rate = tonumber(ARGV[at + 2]), burst = tonumber(ARGV[at + 3]),
          holders_bound = tonumber(ARGV[at + 4]), ahead_bound = tonumber(ARGV[at + 5]),
          keys = limiter_keys(ARGV[at])}
end

-- bucket_tokens() of agentfn_asgi.calls.states: a new bucket is full; a clock that reads
-- earlier than the last update refills nothing.
local function bucket_tokens(L, now)
  local b = redis.call('HMGET', L.keys.bucket, 'tokens', 'updated_at')
  if not b[1] then return L.burst end
  return math.min(L.burst,
                  tonumber(b[1]) + math.max(0, tonumber(now) - tonumber(b[2])) * L.rate)
end

-- admits() of agentfn_asgi.calls.states for the call at `key` (never counted itself): the
-- limiter's answer, why it refuses ('concurrency' or 'rate') and the bucket's tokens now.
-- Holders: claimed with this limiter, lease not before live_after (now - margin); ahead:
-- waiting with it, as live, and before the call in (created_at, member) order, which is
-- (created_at, session_id, turn_id, call_id). Each is counted up to its bound
-- (read_limit's: past it the answer is the same), reading the sets in
-- pages from their start: the holders whose lease (their score) is live, the line from its
-- head. So an admission reads about as many entries as it can admit, at any length of line
-- (and drops the members it meets that moved on, as it goes).
local PAGE = 32
local function admission(L, key, member, now, live_after)
  local live = tonumber(live_after)
  local holders_bound, ahead_bound = L.holders_bound, L.ahead_bound
  local holders, ahead = 0, 0
  local from = 0
  while holders < holders_bound do
    local page = redis.call('ZRANGEBYSCORE', L.keys.holders, live_after, '+inf', 'LIMIT', from,
                            PAGE)
    for _, m in ipairs(page) do
      local f = redis.call('HMGET', call_key(m), 'state', 'limiter', 'lease_expires_at')
      if f[1] ~= 'claimed' or f[2] ~= L.name then
        redis.call('ZREM', L.keys.holders, m)
        from = from - 1
      elseif m ~= member and tonumber(f[3]) >= live then
        holders = holders + 1
        if holders >= holders_bound then break end
      end
    end
    if #page < PAGE then break end
    from = from + PAGE
  end
  local created = redis.call('HGET', key, 'created_at')
  local mine = tonumber(created)
  from = 0
  while ahead < ahead_bound do
    local line = redis.call('ZRANGEBYSCORE', L.keys.waiters, '-inf', created, 'WITHSCORES',
                            'LIMIT', from, PAGE)
    local past = false
    for i = 1, #line, 2 do
      local m = line[i]
      if tonumber(line[i + 1]) == mine and not bytes_less(m, member) then
        past = true  -- the call itself, or after it: the rest of the page is behind it
        break
      end
      local f = redis.call('HMGET', call_key(m), 'state', 'limiter', 'lease_expires_at')
      if f[1] ~= 'waiting' or f[2] ~= L.name then
        redis.call('ZREM', L.keys.waiters, m)
        from = from - 1
      elseif tonumber(f[3]) >= live then
        ahead = ahead + 1
        if ahead >= ahead_bound then break end
      end
    end
    if past or #line < 2 * PAGE then break end
    from = from + PAGE
  end
  local reason = ''
  local tokens = 0
  if L.concurrency and holders + ahead >= L.concurrency then
    reason = 'concurrency'
  elseif L.rate then
    tokens = bucket_tokens(L, now)
    if tokens < ahead + 1 then reason = 'rate' end
  end
  return reason == '', reason, tokens
end

-- An admitted call of a rated limiter spends one token: the bucket is (tokens - 1, now),
-- written with every digit (Lua's own formatting keeps 14); the buckets index finds it
-- for prune.
local function spend(L, now, tokens)
  if L.rate then
    redis.call('HSET', L.keys.bucket, 'tokens', string.format('%.17g', tokens - 1),
               'updated_at', now)
    redis.call('ZADD', I .. 'buckets', now, L.name)
  end
end

-- The holder of call `c`, answered by its limiter (a.admitted), takes a slot (take_slot,
-- a token spent), waits (wait), is admitted (admit, a token spent) or keeps waiting
-- (keep_waiting): 'claimed' or 'waiting'; nil when no admission row applies.
local function admit_or_wait(key, member, c, a, L, tokens)
  if may_take_slot(c, a) then
    apply_take_slot(key, member, c, a)
    spend(L, a.now, tokens)
    return 'claimed'
  elseif may_wait(c, a) then
    apply_wait(key, member, c, a)
    return 'waiting'
  elseif may_admit(c, a) then
    apply_admit(key, member, c, a)
    spend(L, a.now, tokens)
    return 'claimed'
  elseif may_keep_waiting(c, a) then
    apply_keep_waiting(key, member, c, a)
    return 'waiting'
  end
  return nil
end
"""
)


def _claim_order() -> str:
    """The claim's decision, rendered from :data:`~agentfn_asgi.calls.states.CLAIM_ORDER`."""
    special = {
        # Our own claim, retried: ours already; it asks for a slot if it holds none yet.
        "reclaim": """  local status = 'in_doubt'
  if c.attempt == '1' then status = 'claimed' end
  -- The row this claim made, when it is this claim sent again (reclaimed() of the table).
  local made = redis.call('HGET', key, 'nonce')
  if made == a.nonce_retry then status = 'retry' elseif made == a.nonce_adopt then
    status = 'claimed'
  end
  if c.state == 'waiting' then return {'waiting', redis.call('HGETALL', key)} end
  if L and not redis.call('HGET', key, 'limiter') then return taken(status) end
  return {status, redis.call('HGETALL', key)}
""",
        # Taken over only with a slot: a wait would lose the in-doubt flag.
        "take_over": """  if L and not admission(L, key, member, a.now, a.takeover_before) then
    return {'busy', redis.call('HGETALL', key)}
  end
""",
    }
    out = []
    for name, status in CLAIM_ORDER:
        body = special.get(name, "")
        if name != "reclaim":
            body += f"  apply_{name}(key, member, c, a)\n  return taken('{status.value}')\n"
        out.append(f"if may_{name}(c, a) then\n{body}end\n")
    return "".join(out)


# Guarantees: the claim decides by the rows of CLAIM_ORDER (agentfn_asgi.calls.states): exactly one
# claimant gets an absent call (attempt 1) or an expired claim (lease expired before
# takeover_before: attempt + 1, in doubt); the holder's own retried claim (same owner, lease
# live) gets it back unchanged; a due retry or a waiter whose lease lapsed is claimed as the
# next attempt (not in doubt); everyone else is told its state. With a limit, in the same
# step: the claim taken takes a slot or waits (answer 'waiting'); an expired claim is taken
# over only if the limiter admits it (else 'busy', unchanged). Without one, nothing of the
# limiters is read. With a second key (the delivery's hash), that delivery is resolved in
# the same script, whatever the claim decides (claim_call's resolves_delivery).
# KEYS: the call's hash[, the delivery's hash]. ARGV: N, now, member, namespace, owner,
# lease_expires_at, takeover_before, tool_name, session_id, turn_id, call_id, delivery_id
# ('' = none), the nonces of the retry and adopt rows (claim_nonces of the table), then
# only with a limit: read_limit's six. Returns {status, hash fields}.
CLAIM = _script(
    _ADMISSION
    + "".join(lua_apply(name) for name, _ in CLAIM_ORDER if name != "reclaim")
    + """
local function decide()
local key, member = KEYS[1], ARGV[3]
local c = guard_fields(key)
local a = {now = ARGV[2], namespace = ARGV[4], owner = ARGV[5], lease_expires_at = ARGV[6],
           takeover_before = ARGV[7], tool_name = ARGV[8], session_id = ARGV[9],
           turn_id = ARGV[10], call_id = ARGV[11]}
if ARGV[12] ~= '' then a.delivery_id = ARGV[12] end
a.nonce_retry, a.nonce_adopt = ARGV[13], ARGV[14]
local L = nil
if ARGV[15] then L = read_limit(15) end
-- The claim as taken; with a limit, its holder then takes a slot or waits.
local function taken(status)
  if L then
    local verdict, reason, tokens = admission(L, key, member, a.now, a.takeover_before)
    local held = guard_fields(key)
    local b = {owner = held.owner, attempt = held.attempt, admitted = verdict, now = a.now,
               lease_expires_at = a.lease_expires_at, limiter = L.name, detail = reason}
    if admit_or_wait(key, member, held, b, L, tokens) == 'waiting' then status = 'waiting' end
  end
  return {status, redis.call('HGETALL', key)}
end
"""
    + _claim_order()
    + """if c.state == 'claimed' or c.state == 'retry_scheduled' or c.state == 'waiting' then
  return {'busy', redis.call('HGETALL', key)}
end
if SAVED[c.state] then return {'saved', redis.call('HGETALL', key)} end
return {'done', redis.call('HGETALL', key)}
end
-- Decided first: a script that fails half way leaves its writes, and the delivery must
-- never be resolved by a claim that was not written.
local reply = decide()
if KEYS[2] and redis.call('HGET', KEYS[2], 'resolved') == '0' then
  redis.call('HSET', KEYS[2], 'resolved', '1')
  reindex_delivery(KEYS[2], ARGV[12])
end
return reply
"""
)

# Guarantees: the holder (owner, attempt) of a claimed call without this limiter's slot, or
# of a waiting call, asks the limiter in one step: admitted, it holds a slot (take_slot /
# admit; a rated limiter's token spent); refused, it waits (wait / keep_waiting), its lease
# renewed until lease_expires_at. A claimed call holding the slot already (a retried
# admission) is left as it is. KEYS: the call's hash. ARGV: N, now, member, owner, attempt,
# lease_expires_at, takeover_before (now - margin), then the limit (read_limit's six).
# Returns {'claimed' | 'waiting', hash fields}; {'', hash
# fields} when the call is not the caller's to admit (the store says what a claim would);
# false when there is no call.
ADMIT = _script(
    _ADMISSION
    + """
local key, member = KEYS[1], ARGV[3]
local c = guard_fields(key)
if not c.state then return false end
local L = read_limit(8)
local a = {owner = ARGV[4], attempt = ARGV[5], admitted = true, now = ARGV[2],
           lease_expires_at = ARGV[6], limiter = L.name}
-- (take_slot's source with any answer: held and claimed.)
if may_take_slot(c, a) and redis.call('HGET', key, 'limiter') == L.name then
  return {'claimed', redis.call('HGETALL', key)}
end
if not (may_take_slot(c, a) or may_admit(c, a)) then return {'', redis.call('HGETALL', key)} end
local tokens
a.admitted, a.detail, tokens = admission(L, key, member, a.now, ARGV[7])
return {admit_or_wait(key, member, c, a, L, tokens) or '', redis.call('HGETALL', key)}
"""
)

# Guarantees: the holder (owner, attempt) of a claimed call not counted yet has it counted
# against its session's budget of its tool in one step: the calls of the session and tool
# counted already (their budget's set; a member whose hash is gone, pruned, is dropped) are
# counted and, while fewer than the budget (within_budget of the table), the `count` row
# makes the call's `counted` its place. A counted call is left as it is (counted once,
# ever); so is a call the caller does not hold. KEYS: the call's hash. ARGV: N, now,
# member, owner, attempt, budget. Returns the hash fields; false when there is no call.
COUNT = _script(
    lua_apply("count")
    + """
local key, member = KEYS[1], ARGV[3]
local c = guard_fields(key)
if not c.state then return false end
if redis.call('HEXISTS', key, 'counted') == 1 then return redis.call('HGETALL', key) end
local ids = redis.call('HMGET', key, 'session_id', 'tool_name')
local set = budget_key(ids[1], ids[2])
local counted = 0
for _, m in ipairs(redis.call('SMEMBERS', set)) do
  if redis.call('HEXISTS', call_key(m), 'counted') == 1 then
    counted = counted + 1
  else
    redis.call('SREM', set, m)
  end
end
local budget = tonumber(ARGV[6])
local a = {now = ARGV[2], owner = ARGV[4], attempt = ARGV[5], admitted = counted < budget,
           counted = tostring(counted + 1), detail = (counted + 1) .. ' of ' .. ARGV[6]}
if may_count(c, a) then apply_count(key, member, c, a) end
return redis.call('HGETALL', key)
"""
)

#: The script of every row run alone (:func:`~agentfn_asgi.store.redis.compile.lua_transition`),
#: by the row's name; the claim's, the admission's and the count's rows run inside CLAIM,
#: ADMIT and COUNT.
TRANSITIONS = {
    name: _script(lua_transition(name))
    for name, row in STATE_TABLE.items()
    if row.operation not in ("claim_call", "admit_call", "count_call", "prune")
}

# Guarantees: one batch of the namespace's finished (PRUNABLE) calls last updated before
# `before` is deleted with its history, its index entries and its session and call-id set
# entries (quarantined and pending calls are in no such index: never pruned).
# KEYS: the namespace's finished index. ARGV: N, before, batch. Returns the count.
PRUNE_CALLS = _script("""
local members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[2], 'LIMIT', 0,
                           tonumber(ARGV[3]))
for _, m in ipairs(members) do
  local key = call_key(m)
  local ids = redis.call('HMGET', key, 'session_id', 'call_id', 'approval_id', 'tool_name',
                         'counted')
  redis.call('ZREM', I .. 'calls', m)
  redis.call('ZREM', I .. 'finished', m)
  for s in pairs(PRUNABLE) do redis.call('ZREM', I .. 'state:' .. s, m) end
  redis.call('ZREM', I .. 'submitted_failed', m)
  redis.call('SREM', N .. 's:' .. h(ids[1]), m)
  redis.call('SREM', N .. 'k:' .. h(ids[2]), m)
  if ids[3] then redis.call('DEL', approval_key(ids[3])) end
  if ids[5] then redis.call('SREM', budget_key(ids[1], ids[4]), m) end
  redis.call('DEL', key, history_key(m))
end
return #members
""")

# Guarantees: one batch of the namespace's rated limiters whose bucket was last spent
# before `before` lose their bucket (a missing bucket reads full, as it would be by then).
# KEYS: the namespace's buckets index. ARGV: N, before, batch. Returns the count.
PRUNE_BUCKETS = _script("""
local names = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[2], 'LIMIT', 0,
                         tonumber(ARGV[3]))
for _, name in ipairs(names) do
  redis.call('DEL', limiter_keys(name).bucket)
  redis.call('ZREM', KEYS[1], name)
end
return #names
""")

# -- calls: approval -----------------------------------------------------------------------

# Read: the call whose request is approval_id, with its history, or false.
# ARGV: N, approval_id.
FIND_APPROVAL = _script("""
local member = redis.call('GET', approval_key(ARGV[2]))
if not member then return false end
return read_call(member, '1') or false
""")

# Read: how many calls wait for a person. KEYS: the namespace's waiting index. ARGV: N.
COUNT_WAITING_APPROVALS = _script("return redis.call('ZCARD', KEYS[1])")

# -- calls: reads --------------------------------------------------------------------------

# Read: one call, with its history when asked: {hash fields, events} or false.
# KEYS: the call's hash. ARGV: N, member, with_history ('1'/'0').
GET_CALL = _script("""
return read_call(ARGV[2], ARGV[3]) or false
""")

# Read: the calls whose members a set of the namespace holds (a session's, or a call
# id's), each with its history when asked. KEYS: the set. ARGV: N, with_history.
SET_CALLS = _script("""
local out = {}
for _, m in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local record = read_call(m, ARGV[2])
  if record then table.insert(out, record) end
end
return out
""")

# Read: a worklist (states.WORKLISTS) from its index: the first `limit` members scored at
# most max ('(x': below x; '+inf': any), by (score, member), after the cursor.
# KEYS: the worklist's index. ARGV: N, max, limit, after_at ('' = from the start),
# after_member.
WORKLIST = _script("""
return read_calls(page_after(KEYS[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]))
""")

# Read: one bounded stretch of list_calls. Walks an index scored by created_at downwards
# from the position (hi, cursor) (exclusive; cursor '' = from hi inclusive) to lo, looking
# at no more than `budget` entries, and keeps the calls matching the filters, up to `limit`.
# KEYS: the index. ARGV: N, hi, lo, cursor, budget, limit, lease_before ('' = no in-doubt
# filter), then field/value pairs that must match exactly (session_id, tool_name).
# Returns {calls, last score, last member}; no last position once the index is exhausted.
LIST_CALLS = _script("""
local hi, cursor, budget, limit = ARGV[2], ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local at = tonumber(hi)
local out, seen, offset, last = {}, 0, 0, nil
while seen < budget and #out < limit do
  local got = redis.call('ZREVRANGEBYSCORE', KEYS[1], hi, ARGV[3], 'WITHSCORES',
                         'LIMIT', offset, budget)
  if #got == 0 then return {out} end
  for i = 1, #got, 2 do
    local m, score = got[i], got[i + 1]
    -- Entries tied with the cursor and not before it were seen by the previous stretch:
    -- they are skipped without counting, so every stretch moves on.
    if #out < limit and seen < budget
       and (cursor == '' or tonumber(score) < at or bytes_less(m, cursor)) then
      seen = seen + 1
      last = {score, m}
      local key = call_key(m)
      local keep = true
      if ARGV[7] ~= '' then
        keep = tonumber(redis.call('HGET', key, 'lease_expires_at')) < tonumber(ARGV[7])
      end
      for j = 8, #ARGV, 2 do
        if keep and redis.call('HGET', key, ARGV[j]) ~= ARGV[j + 1] then keep = false end
      end
      if keep then table.insert(out, {redis.call('HGETALL', key), {}}) end
    end
  end
  offset = offset + #got / 2
end
return {out, last[1], last[2]}
""")

# Read, in one step: the counts of stats(). ARGV: N, takeover_before (now - margin).
# Returns deliveries, unresolved, failing, in doubt, submitted failures, the count of each
# state (CallState order), then the oldest pending call's created_at ('' when none).
STATS = _script("""
-- In doubt: claimed with a lapsed lease; the lease index also holds waiters for a slot
-- (few lapse: their holders poll, and the sweep adopts those that did).
local in_doubt = 0
for _, m in ipairs(redis.call('ZRANGEBYSCORE', I .. 'lease', '-inf', '(' .. ARGV[2])) do
  if redis.call('HGET', call_key(m), 'state') == 'claimed' then in_doubt = in_doubt + 1 end
end
local out = {
  redis.call('ZCARD', I .. 'deliveries'),
  redis.call('ZCARD', I .. 'unresolved'),
  redis.call('ZCARD', I .. 'failing'),
  in_doubt,
  redis.call('ZCARD', I .. 'submitted_failed'),
}
local oldest, oldest_text = nil, ''
for _, s in ipairs(STATES) do
  table.insert(out, redis.call('ZCARD', I .. 'state:' .. s))
  if PENDING[s] then
    local first = redis.call('ZRANGE', I .. 'state:' .. s, 0, 0, 'WITHSCORES')
    if #first > 0 and (not oldest or tonumber(first[2]) < oldest) then
      oldest, oldest_text = tonumber(first[2]), first[2]
    end
  end
end
table.insert(out, oldest_text)
return out
""")
