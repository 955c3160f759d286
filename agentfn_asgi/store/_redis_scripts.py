"""Lua scripts of the Redis store, one per step (see :mod:`agentfn_asgi.store.redis`).

Each script runs atomically inside Redis: a record, its history and every index over it
change in one step, and nothing else runs in between. The key layout is drawn in the redis
module's docstring. Every script of a store's work is :data:`_PRELUDE` (shared helpers)
plus its own body; ``ARGV[1]`` is always the key prefix of the store's namespace
(``{p}n:{h(namespace)}:``), every key the script touches is built on it, so no script can
reach another namespace's keys; every time value is passed in from the caller's clock,
never read from Redis' ``TIME``. The key layout's version and its steps are in
:mod:`agentfn_asgi.store._redis_layout`.

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

from agentfn_asgi.records import HISTORY_HEAD, HISTORY_TAIL, CallState
from agentfn_asgi.states import SAVED
from agentfn_asgi.store._guards import LUA_GUARDS

__all__ = [
    "ADMIT",
    "APPROVED_CALLS",
    "CLAIM",
    "CLAIM_APPROVED",
    "DECIDE_APPROVAL",
    "DELIVERY_FAILED",
    "DUE_DELIVERIES",
    "DUE_RETRIES",
    "EXPIRED_CLAIMS",
    "FIND_APPROVAL",
    "GET_CALL",
    "LIST_CALLS",
    "LIST_DELIVERIES",
    "MARK_STALE",
    "MARK_SUBMITTED",
    "PRUNE_CALLS",
    "PRUNE_DELIVERIES",
    "QUARANTINE",
    "RECORD_DELIVERY",
    "RELEASE",
    "RENEW",
    "REQUEST_APPROVAL",
    "RESOLVE_DELIVERY",
    "SAVE",
    "SCHEDULE_RETRY",
    "SETTLE",
    "SET_CALLS",
    "STATS",
    "SUBMISSION_FAILED",
    "UNSUBMITTED",
    "WAITING_APPROVALS",
]

#: The history's bounds, from :mod:`agentfn_asgi.records` (the rule every store keeps).
_HISTORY = f"""
local HISTORY_HEAD, HISTORY_TAIL = {HISTORY_HEAD}, {HISTORY_TAIL}
"""

#: The state table's sets (:mod:`agentfn_asgi.states`), as Lua tables.
_STATE_SETS = (
    "local STATES = {"
    + ", ".join(f"'{state.value}'" for state in CallState)
    + "}\nlocal SAVED = {"
    + ", ".join(f"{state.value} = true" for state in CallState if state in SAVED)
    + "}\nlocal PENDING = {"
    + ", ".join(f"{state.value} = true" for state in CallState if not state.terminal)
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
local function reindex_call(key, member)
  local r = redis.call('HMGET', key, 'state', 'created_at', 'lease_expires_at',
                       'next_attempt_at', 'updated_at', 'success')
  local state, created = r[1], r[2]
  for _, s in ipairs(STATES) do redis.call('ZREM', I .. 'state:' .. s, member) end
  for _, name in ipairs({'lease', 'due', 'finished', 'submitted_failed', 'waiting',
                         'approved', 'retry'}) do
    redis.call('ZREM', I .. name, member)
  end
  redis.call('ZADD', I .. 'calls', created, member)
  redis.call('ZADD', I .. 'state:' .. state, created, member)
  -- A lapsed waiter (for a limiter's slot) is adopted as a lapsed claim is taken over.
  if state == 'claimed' or state == 'waiting' then
    redis.call('ZADD', I .. 'lease', r[3], member)
  elseif state == 'awaiting_approval' then
    redis.call('ZADD', I .. 'waiting', r[3], member)
  elseif state == 'approved' then
    redis.call('ZADD', I .. 'approved', r[5], member)
  elseif state == 'retry_scheduled' then
    redis.call('ZADD', I .. 'retry', r[3], member)
  elseif SAVED[state] then
    redis.call('ZADD', I .. 'due', r[4], member)
  elseif state == 'submitted' or state == 'stale' then
    redis.call('ZADD', I .. 'finished', r[5], member)
    if state == 'submitted' and r[6] == '0' then
      redis.call('ZADD', I .. 'submitted_failed', created, member)
    end
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
    # Every script may ask the state table's rows (may_<row>, rendered by store/_guards.py).
    return _PRELUDE + LUA_GUARDS + body


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

# Flow control (agentfn_asgi.states): a limiter's keys live under the namespace at
# {n}l:{h(name)}: (a name may hold any character): `holders` (members of the calls that
# took a slot, scored by their lease then), `waiters` (members of the calls waiting for
# one, scored by created_at: with the member's byte order, the line's order) and `bucket`
# (its rate's {tokens, updated_at}). The call hashes are the authority: the sets only say
# whom to look at, and the count drops every member whose hash says it moved on (saved,
# quarantined, taken over, pruned...), so no other script has to know about them. Only
# CLAIM (with a limit) and ADMIT read or change them.
_ADMISSION = """
local function limiter_keys(name)
  local base = N .. 'l:' .. h(name) .. ':'
  return {holders = base .. 'holders', waiters = base .. 'waiters', bucket = base .. 'bucket'}
end

-- The step's limit, from ARGV[at..at + 3]: name, concurrency, rate, burst ('' = no bound).
local function read_limit(at)
  return {name = ARGV[at], concurrency = tonumber(ARGV[at + 1]),
          rate = tonumber(ARGV[at + 2]), burst = tonumber(ARGV[at + 3]),
          keys = limiter_keys(ARGV[at])}
end

-- bucket_tokens() of agentfn_asgi.states: a new bucket is full; a clock that reads
-- earlier than the last update refills nothing.
local function bucket_tokens(L, now)
  local b = redis.call('HMGET', L.keys.bucket, 'tokens', 'updated_at')
  if not b[1] then return L.burst end
  return math.min(L.burst,
                  tonumber(b[1]) + math.max(0, tonumber(now) - tonumber(b[2])) * L.rate)
end

-- admits() of agentfn_asgi.states for the call at `key` (never counted itself): the
-- limiter's answer, why it refuses ('concurrency' or 'rate') and the bucket's tokens now.
-- Holders: claimed with this limiter, lease not before live_after (now - margin); ahead:
-- waiting with it, as live, and before the call in (created_at, member) order, which is
-- (created_at, session_id, turn_id, call_id).
local function admission(L, key, member, now, live_after)
  local live = tonumber(live_after)
  local holders, ahead = 0, 0
  for _, m in ipairs(redis.call('ZRANGE', L.keys.holders, 0, -1)) do
    local f = redis.call('HMGET', call_key(m), 'state', 'limiter', 'lease_expires_at')
    if f[1] ~= 'claimed' or f[2] ~= L.name then
      redis.call('ZREM', L.keys.holders, m)
    elseif m ~= member and tonumber(f[3]) >= live then
      holders = holders + 1
    end
  end
  local created = redis.call('HGET', key, 'created_at')
  local mine = tonumber(created)
  local line = redis.call('ZRANGEBYSCORE', L.keys.waiters, '-inf', created, 'WITHSCORES')
  for i = 1, #line, 2 do
    -- Once the slots are all taken, the rest of the line changes nothing.
    if L.concurrency and holders + ahead >= L.concurrency then break end
    local m = line[i]
    local f = redis.call('HMGET', call_key(m), 'state', 'limiter', 'lease_expires_at')
    if f[1] ~= 'waiting' or f[2] ~= L.name then
      redis.call('ZREM', L.keys.waiters, m)
    elseif tonumber(f[3]) >= live and (tonumber(line[i + 1]) < mine or bytes_less(m, member))
    then
      ahead = ahead + 1
    end
  end
  if L.concurrency and holders + ahead >= L.concurrency then return false, 'concurrency', 0 end
  if not L.rate then return true, '', 0 end
  local tokens = bucket_tokens(L, now)
  if tokens >= ahead + 1 then return true, '', tokens end
  return false, 'rate', tokens
end

-- An admitted call of a rated limiter spends one token: the bucket is (tokens - 1, now),
-- written with every digit (Lua's own formatting keeps 14).
local function spend(L, now, tokens)
  if L.rate then
    redis.call('HSET', L.keys.bucket, 'tokens', string.format('%.17g', tokens - 1),
               'updated_at', now)
  end
end

-- The holder of a claimed call, answered by its limiter (a.admitted), takes a slot (true)
-- or waits (false), its lease until `lease` either way; nil: neither row applies.
local function take_slot_or_wait(key, member, c, a, L, now, lease, reason, tokens)
  if may_take_slot(c, a) then
    redis.call('HSET', key, 'limiter', L.name, 'lease_expires_at', lease, 'updated_at', now)
    redis.call('ZADD', L.keys.holders, lease, member)
    spend(L, now, tokens)
    reindex_call(key, member)
    return true
  end
  if not may_wait(c, a) then return nil end
  -- next_attempt_at: when it began to wait (a tool's max_wait counts from it).
  redis.call('HSET', key, 'state', 'waiting', 'limiter', L.name, 'lease_expires_at', lease,
             'updated_at', now, 'next_attempt_at', now)
  redis.call('ZADD', L.keys.waiters, redis.call('HGET', key, 'created_at'), member)
  add_event(member, now, 'waiting', c.attempt, c.owner, reason)
  reindex_call(key, member)
  return false
end
"""

# Guarantees: exactly one claimant gets an absent call (attempt 1) or an expired claim
# (lease expired before takeover_before: attempt + 1, in doubt); the holder's own retried
# claim (same owner, lease live) gets it back unchanged; a due retry or a waiter whose lease
# lapsed is claimed as the next attempt (not in doubt); everyone else is told its state.
# With a limit, in the same step: the claim taken takes a slot or waits (answer 'waiting');
# an expired claim is taken over only if the limiter admits it (else 'busy', unchanged).
# Without one, nothing of the limiters is read.
# With a second key (the delivery's hash), that delivery is resolved in the same script,
# whatever the claim decides (claim_call's resolves_delivery).
# KEYS: the call's hash[, the delivery's hash]. ARGV: N, now, member, namespace, owner,
# lease_expires_at, takeover_before, tool_name, session_id, turn_id, call_id, delivery_id
# ('' = none), then only with a limit: its name, concurrency, rate, burst ('' = no bound).
# Returns {status, hash fields}.
CLAIM = _script(
    _ADMISSION
    + """
local function decide()
local key, now, member, owner = KEYS[1], ARGV[2], ARGV[3], ARGV[5]
local c = guard_fields(key)
local a = {owner = owner, now = now, takeover_before = ARGV[7]}
local L = nil
if ARGV[13] then L = read_limit(13) end
-- The claim as taken; with a limit, its holder then takes a slot or waits.
local function taken(status)
  if L then
    local verdict, reason, tokens = admission(L, key, member, now, ARGV[7])
    local held = guard_fields(key)
    local b = {owner = held.owner, attempt = held.attempt, admitted = verdict}
    if take_slot_or_wait(key, member, held, b, L, now, ARGV[6], reason, tokens) == false then
      status = 'waiting'
    end
  end
  return {status, redis.call('HGETALL', key)}
end
if may_claim(c, a) then
  redis.call('HSET', key, 'session_id', ARGV[9], 'turn_id', ARGV[10], 'call_id', ARGV[11],
             'tool_name', ARGV[8], 'state', 'claimed', 'attempt', '1', 'owner', owner,
             'lease_expires_at', ARGV[6], 'created_at', now, 'updated_at', now,
             'next_attempt_at', now, 'failures', '0', 'namespace', ARGV[4])
  if ARGV[12] ~= '' then redis.call('HSET', key, 'delivery_id', ARGV[12]) end
  redis.call('SADD', N .. 's:' .. h(ARGV[9]), member)
  redis.call('SADD', N .. 'k:' .. h(ARGV[11]), member)
  add_event(member, now, 'claimed', 1, owner)
  reindex_call(key, member)
  return taken('claimed')
end
if may_reclaim(c, a) then
  if c.state == 'waiting' then return {'waiting', redis.call('HGETALL', key)} end
  local status = 'in_doubt'
  if c.attempt == '1' then status = 'claimed' end
  -- Claimed without a limit before (an earlier claim of ours): it asks for a slot now.
  if L and not redis.call('HGET', key, 'limiter') then return taken(status) end
  return {status, redis.call('HGETALL', key)}
end
if may_retry(c, a) then
  local attempt = redis.call('HINCRBY', key, 'attempt', 1)
  redis.call('HDEL', key, 'limiter')
  redis.call('HSET', key, 'state', 'claimed', 'owner', owner, 'lease_expires_at', ARGV[6],
             'updated_at', now)
  add_event(member, now, 'retried', attempt, owner)
  reindex_call(key, member)
  return taken('retry')
end
if may_adopt(c, a) then
  local attempt = redis.call('HINCRBY', key, 'attempt', 1)
  redis.call('HDEL', key, 'limiter')
  redis.call('HSET', key, 'state', 'claimed', 'owner', owner, 'lease_expires_at', ARGV[6],
             'updated_at', now)
  add_event(member, now, 'adopted', attempt, owner)
  reindex_call(key, member)
  return taken('claimed')
end
if may_take_over(c, a) then
  -- Taken over only with a slot: a wait would lose the in-doubt flag.
  if L and not admission(L, key, member, now, ARGV[7]) then
    return {'busy', redis.call('HGETALL', key)}
  end
  local attempt = redis.call('HINCRBY', key, 'attempt', 1)
  redis.call('HDEL', key, 'limiter')
  redis.call('HSET', key, 'owner', owner, 'lease_expires_at', ARGV[6], 'updated_at', now)
  if ARGV[12] ~= '' then redis.call('HSETNX', key, 'delivery_id', ARGV[12]) end
  add_event(member, now, 'taken_over', attempt, owner)
  reindex_call(key, member)
  return taken('in_doubt')
end
if c.state == 'claimed' or c.state == 'retry_scheduled' or c.state == 'waiting' then
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
# lease_expires_at, takeover_before (now - margin), then the limit: name, concurrency,
# rate, burst ('' = no bound). Returns {'claimed' | 'waiting', hash fields}; {'', hash
# fields} when the call is not the caller's to admit (the store says what a claim would);
# false when there is no call.
ADMIT = _script(
    _ADMISSION
    + """
local key, now, member = KEYS[1], ARGV[2], ARGV[3]
local c = guard_fields(key)
if not c.state then return false end
local L = read_limit(8)
local a = {owner = ARGV[4], attempt = ARGV[5], admitted = true}
local limiter = redis.call('HGET', key, 'limiter')
-- (take_slot's source with any answer: held and claimed.)
if may_take_slot(c, a) and limiter == L.name then
  return {'claimed', redis.call('HGETALL', key)}
end
if not (may_take_slot(c, a) or may_admit(c, a)) then return {'', redis.call('HGETALL', key)} end
local reason, tokens
a.admitted, reason, tokens = admission(L, key, member, now, ARGV[7])
local took = take_slot_or_wait(key, member, c, a, L, now, ARGV[6], reason, tokens)
if took ~= nil then
  return {took and 'claimed' or 'waiting', redis.call('HGETALL', key)}
end
-- A waiter keeps its limiter: the line it stands in.
local own = limiter_keys(limiter)
if may_admit(c, a) then
  redis.call('HSET', key, 'state', 'claimed', 'lease_expires_at', ARGV[6], 'updated_at', now)
  redis.call('ZREM', own.waiters, member)
  redis.call('ZADD', own.holders, ARGV[6], member)
  spend(L, now, tokens)
  add_event(member, now, 'admitted', c.attempt, c.owner)
  reindex_call(key, member)
  return {'claimed', redis.call('HGETALL', key)}
end
if may_keep_waiting(c, a) then
  redis.call('HSET', key, 'lease_expires_at', ARGV[6])
  redis.call('ZADD', own.waiters, redis.call('HGET', key, 'created_at'), member)
  reindex_call(key, member)
  return {'waiting', redis.call('HGETALL', key)}
end
return {'', redis.call('HGETALL', key)}
"""
)

# Guarantees: only the holder of the claim's current attempt extends its lease.
# KEYS: the call's hash. ARGV: N, now, member, owner, attempt, lease_expires_at.
RENEW = _script("""
if not may_renew(guard_fields(KEYS[1]), {owner = ARGV[4], attempt = ARGV[5]}) then return 0 end
redis.call('HSET', KEYS[1], 'lease_expires_at', ARGV[6], 'updated_at', ARGV[2])
reindex_call(KEYS[1], ARGV[3])
return 1
""")

# The result fields of a saved result (save and settle): the old ones go first, so an
# absent error_type/full_output never survives from before.
_STORE_RESULT = """
local function store_result(key, now, state, first)
  redis.call('HDEL', key, 'error_type', 'full_output', 'quarantine_reason')
  redis.call('HSET', key, 'state', state, 'updated_at', now, 'next_attempt_at', now,
             unpack(ARGV, first))
end
"""

# Guarantees: fenced, first writer wins: only the holder of the claim's current attempt
# saves, and only while the call is claimed (also after its lease ran out, as long as nobody
# took it over); otherwise the stored record is returned unchanged. False: unknown call.
# KEYS: the call's hash. ARGV: N, now, member, owner, attempt, state, detail, then the
# result's field/value pairs.
SAVE = _script(
    _STORE_RESULT
    + """
local c = guard_fields(KEYS[1])
if not c.state then return false end
if may_save(c, {owner = ARGV[4], attempt = ARGV[5]}) then
  store_result(KEYS[1], ARGV[2], ARGV[6], 8)
  redis.call('HSET', KEYS[1], 'owner', ARGV[4])
  add_event(ARGV[3], ARGV[2], 'saved', ARGV[5], ARGV[4], ARGV[7])
  reindex_call(KEYS[1], ARGV[3])
end
return redis.call('HGETALL', KEYS[1])
"""
)

# Guarantees: a saved result (succeeded/failed) becomes submitted; nothing else changes.
# KEYS: the call's hash. ARGV: N, now, member, detail.
MARK_SUBMITTED = _script("""
local c = guard_fields(KEYS[1])
if not may_mark_submitted(c, {}) then return 0 end
redis.call('HSET', KEYS[1], 'state', 'submitted', 'updated_at', ARGV[2])
add_event(ARGV[3], ARGV[2], 'submitted', c.attempt, nil, ARGV[4])
reindex_call(KEYS[1], ARGV[3])
return 1
""")

# Guarantees: a saved result's failed submission is counted, kept in the history, and the
# result is due again at retry_at. KEYS: the call's hash. ARGV: N, now, member, detail,
# retry_at.
SUBMISSION_FAILED = _script("""
local c = guard_fields(KEYS[1])
if not may_submission_failed(c, {}) then return 0 end
redis.call('HINCRBY', KEYS[1], 'failures', 1)
redis.call('HSET', KEYS[1], 'next_attempt_at', ARGV[5])
add_event(ARGV[3], ARGV[2], 'submit_failed', c.attempt, nil, ARGV[4])
reindex_call(KEYS[1], ARGV[3])
return 1
""")

# Guarantees: a non-terminal call becomes stale, unless (with unchanged_since) it was
# updated after that time. KEYS: the call's hash. ARGV: N, now, member, unchanged_since
# ('' = unconditional).
MARK_STALE = _script("""
local c = guard_fields(KEYS[1])
if not may_mark_stale(c, {since = ARGV[4]}) then return 0 end
redis.call('HSET', KEYS[1], 'state', 'stale', 'updated_at', ARGV[2])
add_event(ARGV[3], ARGV[2], 'stale', c.attempt)
reindex_call(KEYS[1], ARGV[3])
return 1
""")

# Guarantees: only the holder of the claim's current attempt quarantines it (a saved result
# always wins); the reason is kept on the record and in the history.
# KEYS: the call's hash. ARGV: N, now, member, owner, attempt, reason.
QUARANTINE = _script("""
if not may_quarantine(guard_fields(KEYS[1]), {owner = ARGV[4], attempt = ARGV[5]}) then
  return 0
end
redis.call('HSET', KEYS[1], 'state', 'quarantined', 'updated_at', ARGV[2],
           'quarantine_reason', ARGV[6])
add_event(ARGV[3], ARGV[2], 'quarantined', ARGV[5], ARGV[4], ARGV[6])
reindex_call(KEYS[1], ARGV[3])
return 1
""")

# Guarantees: an operator's result is saved only for a quarantined or in-doubt call, as
# `settled` in the history. False otherwise. KEYS: the call's hash. ARGV: N, now, member,
# takeover_before, state, detail, then the result's field/value pairs.
SETTLE = _script(
    _STORE_RESULT
    + """
local c = guard_fields(KEYS[1])
if not may_settle(c, {takeover_before = ARGV[4]}) then return false end
store_result(KEYS[1], ARGV[2], ARGV[5], 7)
add_event(ARGV[3], ARGV[2], 'settled', c.attempt, nil, ARGV[6])
reindex_call(KEYS[1], ARGV[3])
return redis.call('HGETALL', KEYS[1])
"""
)

# Guarantees: an operator's re-run claims only a quarantined or in-doubt call, for `owner`
# with the next attempt (so the earlier attempt stays fenced out); `released` in the
# history. False otherwise. KEYS: the call's hash. ARGV: N, now, member, takeover_before,
# owner, lease_expires_at.
RELEASE = _script(
    """
if not may_release(guard_fields(KEYS[1]), {takeover_before = ARGV[4]}) then return false end
local attempt = redis.call('HINCRBY', KEYS[1], 'attempt', 1)
redis.call('HDEL', KEYS[1], 'quarantine_reason', 'limiter')
redis.call('HSET', KEYS[1], 'state', 'claimed', 'owner', ARGV[5],
           'lease_expires_at', ARGV[6], 'updated_at', ARGV[2])
add_event(ARGV[3], ARGV[2], 'released', attempt, ARGV[5])
reindex_call(KEYS[1], ARGV[3])
return redis.call('HGETALL', KEYS[1])
"""
)

# Guarantees: one batch of the namespace's submitted/stale calls last updated before
# `before` is deleted with its history, its index entries and its session and call-id set
# entries (quarantined and pending calls are in no such index: never pruned).
# KEYS: the namespace's finished index. ARGV: N, before, batch. Returns the count.
PRUNE_CALLS = _script("""
local members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[2], 'LIMIT', 0,
                           tonumber(ARGV[3]))
for _, m in ipairs(members) do
  local key = call_key(m)
  local ids = redis.call('HMGET', key, 'session_id', 'call_id', 'approval_id')
  redis.call('ZREM', I .. 'calls', m)
  redis.call('ZREM', I .. 'finished', m)
  redis.call('ZREM', I .. 'state:submitted', m)
  redis.call('ZREM', I .. 'state:stale', m)
  redis.call('ZREM', I .. 'submitted_failed', m)
  redis.call('SREM', N .. 's:' .. h(ids[1]), m)
  redis.call('SREM', N .. 'k:' .. h(ids[2]), m)
  if ids[3] then redis.call('DEL', approval_key(ids[3])) end
  redis.call('DEL', key, history_key(m))
end
return #members
""")

# -- calls: approval -----------------------------------------------------------------------
# Each script's condition is the state table's row, rendered by store/_guards.py
# (``may_<row>(c, a)`` over the call as ``guard_fields`` reads it).

_APPROVAL = """
local function args(now, owner, attempt)
  return {now = now, owner = owner or '', attempt = attempt or '', takeover_before = '',
          since = ''}
end
"""

# Guarantees: only the holder of the claim's current attempt holds the call for a person:
# awaiting_approval, its lease the request's expiry, the request kept whole (JSON) and its
# id findable ({n}a:{h(approval_id)} -> member). Returns the call's hash as it is now, or
# false when unknown. KEYS: the call's hash. ARGV: N, now, member, owner, attempt,
# expires_at, approval_id, approval (JSON), detail.
REQUEST_APPROVAL = _script(
    _APPROVAL
    + """
local c = guard_fields(KEYS[1])
if not c.state then return false end
if may_request_approval(c, args(ARGV[2], ARGV[4], ARGV[5])) then
  redis.call('HSET', KEYS[1], 'state', 'awaiting_approval', 'updated_at', ARGV[2],
             'lease_expires_at', ARGV[6], 'approval_id', ARGV[7], 'approval', ARGV[8])
  redis.call('SET', approval_key(ARGV[7]), ARGV[3])
  add_event(ARGV[3], ARGV[2], 'approval_requested', ARGV[5], ARGV[4], ARGV[9])
  reindex_call(KEYS[1], ARGV[3])
end
return redis.call('HGETALL', KEYS[1])
"""
)

# Guarantees: a decision on the waiting request approval_id of the call, taken once:
# 'approved' (the request open) makes it approved; 'denied' (open) and 'expired' (lapsed)
# save the failure given. The decided request (JSON) replaces the waiting one. Returns the
# call's hash, or false when refused. KEYS: the call's hash. ARGV: N, now, member,
# approval_id, decision, approval (JSON), detail, then for a failure its state and the
# result's field/value pairs.
DECIDE_APPROVAL = _script(
    _APPROVAL
    + _STORE_RESULT
    + """
local c = guard_fields(KEYS[1])
if not c.state or redis.call('HGET', KEYS[1], 'approval_id') ~= ARGV[4] then return false end
local a, decision = args(ARGV[2]), ARGV[5]
local allowed, event
if decision == 'approved' then allowed, event = may_approve(c, a), 'approved'
elseif decision == 'denied' then allowed, event = may_deny(c, a), 'denied'
else allowed, event = may_expire_approval(c, a), 'approval_expired' end
if not allowed then return false end
if decision == 'approved' then
  redis.call('HSET', KEYS[1], 'state', 'approved', 'updated_at', ARGV[2])
else
  store_result(KEYS[1], ARGV[2], ARGV[8], 9)
end
redis.call('HSET', KEYS[1], 'approval', ARGV[6])
add_event(ARGV[3], ARGV[2], event, c.attempt, nil, ARGV[7])
reindex_call(KEYS[1], ARGV[3])
return redis.call('HGETALL', KEYS[1])
"""
)

# Guarantees: an approved call is claimed by one replica, `owner`, as the next attempt.
# Returns the call's hash, or false when it is not approved (another replica claimed it).
# KEYS: the call's hash. ARGV: N, now, member, owner, lease_expires_at.
CLAIM_APPROVED = _script(
    _APPROVAL
    + """
local c = guard_fields(KEYS[1])
if not c.state or not may_run_approved(c, args(ARGV[2])) then return false end
local attempt = redis.call('HINCRBY', KEYS[1], 'attempt', 1)
redis.call('HDEL', KEYS[1], 'limiter')
redis.call('HSET', KEYS[1], 'state', 'claimed', 'owner', ARGV[4],
           'lease_expires_at', ARGV[5], 'updated_at', ARGV[2])
add_event(ARGV[3], ARGV[2], 'claimed_approved', attempt, ARGV[4])
reindex_call(KEYS[1], ARGV[3])
return redis.call('HGETALL', KEYS[1])
"""
)

# Read: the call whose request is approval_id, with its history, or false.
# ARGV: N, approval_id.
FIND_APPROVAL = _script("""
local member = redis.call('GET', approval_key(ARGV[2]))
if not member then return false end
return read_call(member, '1') or false
""")

# Read: waiting calls whose request expires at or before max ('+inf': all), soonest first.
# KEYS: the namespace's waiting index. ARGV: N, max, limit.
WAITING_APPROVALS = _script("""
return read_calls(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0,
                             tonumber(ARGV[3])))
""")

# Read: approved calls not yet claimed to run, oldest decision first.
# KEYS: the namespace's approved index. ARGV: N, limit.
APPROVED_CALLS = _script("""
return read_calls(redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[2]) - 1))
""")

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

# Read: saved results due at or before due_before, by (next_attempt_at, member), after the
# cursor. KEYS: the namespace's due index. ARGV: N, due_before, limit, after_at ('' = from
# the start), after_member.
UNSUBMITTED = _script("""
return read_calls(page_after(KEYS[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5]))
""")

# Read: claims, and waiters for a limiter's slot, whose lease expired before
# takeover_before, earliest expiry first.
# KEYS: the namespace's lease index. ARGV: N, takeover_before, limit.
EXPIRED_CLAIMS = _script("""
return read_calls(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', '(' .. ARGV[2],
                             'LIMIT', 0, tonumber(ARGV[3])))
""")


# -- flow control: retries
# Guarantees: fenced like QUARANTINE: only the holder schedules its call's next attempt, at
# `at` (lease_expires_at, compared by the `due` guard; next_attempt_at for listings).
# KEYS: the call's hash. ARGV: N, now, member, owner, attempt, at, reason. Returns 1 or 0.
SCHEDULE_RETRY = _script("""
if not may_schedule_retry(guard_fields(KEYS[1]), {owner = ARGV[4], attempt = ARGV[5]}) then
  return 0
end
redis.call('HSET', KEYS[1], 'state', 'retry_scheduled', 'updated_at', ARGV[2],
           'lease_expires_at', ARGV[6], 'next_attempt_at', ARGV[6])
add_event(ARGV[3], ARGV[2], 'retry_scheduled', ARGV[5], ARGV[4], ARGV[7])
reindex_call(KEYS[1], ARGV[3])
return 1
""")

# Read: scheduled retries due at `now` (score <= now), earliest first.
# KEYS: the namespace's retry index. ARGV: N, now, limit.
DUE_RETRIES = _script("""
return read_calls(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2],
                             'LIMIT', 0, tonumber(ARGV[3])))
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

# Read, in one step: the counts of stats(). ARGV: N, now. Returns deliveries, unresolved,
# failing, in doubt, submitted failures, the count of each state (CallState order), then
# the oldest pending call's created_at ('' when none).
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


#: (Not in ``__all__``: the store registers every name there as a script.)
#: Which scripts carry out each row of the state table (:mod:`agentfn_asgi.states`), by
#: name; ``tests/store/test_state_table.py`` holds each to its row, and refuses a script that
#: changes a call's state without being listed here (the migration's scripts move records
#: as they are: they are no transition).
ROWS: dict[str, tuple[str, ...]] = {
    "claim": ("CLAIM",),
    "reclaim": ("CLAIM",),
    "take_over": ("CLAIM",),
    "renew": ("RENEW",),
    "save": ("SAVE",),
    "mark_submitted": ("MARK_SUBMITTED",),
    "submission_failed": ("SUBMISSION_FAILED",),
    "mark_stale": ("MARK_STALE",),
    "quarantine": ("QUARANTINE",),
    "settle": ("SETTLE",),
    "release": ("RELEASE",),
    "prune": ("PRUNE_CALLS",),
    "request_approval": ("REQUEST_APPROVAL",),
    "approve": ("DECIDE_APPROVAL",),
    "deny": ("DECIDE_APPROVAL",),
    "expire_approval": ("DECIDE_APPROVAL",),
    "run_approved": ("CLAIM_APPROVED",),
    # flow control
    "schedule_retry": ("SCHEDULE_RETRY",),
    "retry": ("CLAIM",),
    "take_slot": ("CLAIM", "ADMIT"),
    "wait": ("CLAIM", "ADMIT"),
    "admit": ("ADMIT",),
    "keep_waiting": ("ADMIT",),
    "adopt": ("CLAIM",),
}
