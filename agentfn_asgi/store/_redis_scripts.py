"""Lua scripts of the Redis store, one per state change (see :mod:`agentfn_asgi.store.redis`).

Each runs atomically inside Redis, so a record and the indexes over it change in one step.
The key layout they rely on is drawn in the redis module's docstring; every time value is
passed in from the caller's clock (``ARGV``), never read from Redis' ``TIME``.
"""

from __future__ import annotations

__all__ = [
    "CLAIM",
    "INDEXED_CALLS",
    "PRUNE_CALLS",
    "PRUNE_DELIVERIES",
    "RECORD_DELIVERY",
    "RENEW",
    "SAVE",
    "SESSION_CALLS",
    "TERMINATE",
    "UNRESOLVED",
]

# KEYS: delivery key, all-deliveries zset, unresolved zset
# ARGV: member, value, ttl ms, received_at
RECORD_DELIVERY = """
if redis.call('SET', KEYS[1], ARGV[2], 'NX', 'PX', ARGV[3]) then
  redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
  redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
  return 1
end
return 0
"""

# KEYS: unresolved zset, all-deliveries zset. ARGV: delivery key prefix, older_than, limit.
# Entries whose key expired (dedup window over) are dropped from both indexes on the way.
UNRESOLVED = """
local limit = tonumber(ARGV[3])
local out = {}
for round = 1, 20 do
  local want = limit - #out
  if want <= 0 then break end
  local members = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', #out, want)
  if #members == 0 then break end
  local missing = 0
  for _, m in ipairs(members) do
    local v = redis.call('GET', ARGV[1] .. m)
    if v then
      table.insert(out, v)
    else
      redis.call('ZREM', KEYS[1], m)
      redis.call('ZREM', KEYS[2], m)
      missing = missing + 1
    end
  end
  if missing == 0 then break end
end
return out
"""

# KEYS: call hash, session set, claimed zset, pending zset
# ARGV: member, now, lease_expires_at, owner, delivery_id ('' = none), then the new call's
# fields as field/value pairs.
CLAIM = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  redis.call('HSET', KEYS[1], unpack(ARGV, 6))
  redis.call('SADD', KEYS[2], ARGV[1])
  redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
  redis.call('ZADD', KEYS[4], ARGV[2], ARGV[1])
  return {'claimed', redis.call('HGETALL', KEYS[1])}
end
if state == 'claimed' then
  local lease = tonumber(redis.call('HGET', KEYS[1], 'lease_expires_at'))
  if lease < tonumber(ARGV[2]) then
    redis.call('HINCRBY', KEYS[1], 'attempt', 1)
    redis.call('HSET', KEYS[1], 'owner', ARGV[4], 'lease_expires_at', ARGV[3],
               'updated_at', ARGV[2])
    if ARGV[5] ~= '' and not redis.call('HGET', KEYS[1], 'delivery_id') then
      redis.call('HSET', KEYS[1], 'delivery_id', ARGV[5])
    end
    redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
    return {'in_doubt', redis.call('HGETALL', KEYS[1])}
  end
  return {'busy', redis.call('HGETALL', KEYS[1])}
end
if state == 'succeeded' or state == 'failed' then
  return {'saved', redis.call('HGETALL', KEYS[1])}
end
return {'done', redis.call('HGETALL', KEYS[1])}
"""

# KEYS: call hash, claimed zset. ARGV: member, owner, now, lease_expires_at.
RENEW = """
local cur = redis.call('HMGET', KEYS[1], 'state', 'owner')
if cur[1] == 'claimed' and cur[2] == ARGV[2] then
  redis.call('HSET', KEYS[1], 'lease_expires_at', ARGV[4], 'updated_at', ARGV[3])
  redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
  return 1
end
return 0
"""

# KEYS: call hash, claimed zset, target state zset
# ARGV: member, now, owner, target state, then the result's field/value pairs.
# First writer wins: only a 'claimed' call takes a result; otherwise the record is returned.
SAVE = """
local state = redis.call('HGET', KEYS[1], 'state')
if not state then return false end
if state == 'claimed' then
  redis.call('HSET', KEYS[1], 'state', ARGV[4], 'owner', ARGV[3], 'updated_at', ARGV[2],
             unpack(ARGV, 5))
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
end
return redis.call('HGETALL', KEYS[1])
"""

# Moves a call into a terminal state (submitted, stale, quarantined).
# KEYS: call hash, claimed, succeeded, failed, pending zsets, target zset
# ARGV: member, now, retention ms, target state, required owner ('' = any),
#       allowed current states (space separated), then extra field/value pairs.
TERMINATE = """
local cur = redis.call('HMGET', KEYS[1], 'state', 'owner')
local state = cur[1]
if not state then return 0 end
if not string.find(' ' .. ARGV[6] .. ' ', ' ' .. state .. ' ', 1, true) then return 0 end
if ARGV[5] ~= '' and cur[2] ~= ARGV[5] then return 0 end
redis.call('HSET', KEYS[1], 'state', ARGV[4], 'updated_at', ARGV[2], unpack(ARGV, 7))
for i = 2, 5 do redis.call('ZREM', KEYS[i], ARGV[1]) end
redis.call('ZADD', KEYS[6], ARGV[2], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
"""

# KEYS: session set. ARGV: call key prefix. Drops members whose call expired.
SESSION_CALLS = """
local out = {}
for _, m in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local h = redis.call('HGETALL', ARGV[1] .. m)
  if #h == 0 then redis.call('SREM', KEYS[1], m) else table.insert(out, h) end
end
return out
"""

# KEYS: one or more index zsets. ARGV: call key prefix, max score, limit.
# The oldest `limit` entries (by score, across the zsets) with their records.
INDEXED_CALLS = """
local limit = tonumber(ARGV[3])
local entries = {}
for i, key in ipairs(KEYS) do
  local got = redis.call('ZRANGEBYSCORE', key, '-inf', ARGV[2], 'WITHSCORES', 'LIMIT', 0, limit)
  for j = 1, #got, 2 do
    table.insert(entries, {tonumber(got[j + 1]), got[j], key})
  end
end
table.sort(entries, function(a, b) return a[1] < b[1] end)
local out = {}
for _, e in ipairs(entries) do
  if #out >= limit then break end
  local h = redis.call('HGETALL', ARGV[1] .. e[2])
  if #h == 0 then redis.call('ZREM', e[3], e[2]) else table.insert(out, h) end
end
return out
"""

# One prune batch: walk the oldest `batch` entries of the zset `index` and let `drop(member,
# old)` remove each (old: its score is below `before`); drop returns the keys it deleted, or
# nil to stop at the first entry that must stay. Returns {keys deleted, 1 if finished}.
# Each prune script below is this function plus its own `drop`.
_PRUNE_BATCH = """
local function prune_batch(index, before, batch, drop)
  local entries = redis.call('ZRANGE', index, 0, batch - 1, 'WITHSCORES')
  local removed = 0
  for i = 1, #entries, 2 do
    local deleted = drop(entries[i], tonumber(entries[i + 1]) < before)
    if deleted == nil then return {removed, 1} end
    removed = removed + deleted
  end
  if #entries < 2 * batch then return {removed, 1} end
  return {removed, 0}
end
"""

# KEYS: all-deliveries zset, unresolved zset. ARGV: delivery key prefix, before, batch.
# A delivery goes when it is old or Redis already expired its key.
PRUNE_DELIVERIES = (
    _PRUNE_BATCH
    + """
return prune_batch(KEYS[1], tonumber(ARGV[2]), tonumber(ARGV[3]), function(m, old)
  local key = ARGV[1] .. m
  if not old and redis.call('EXISTS', key) == 1 then return nil end
  redis.call('ZREM', KEYS[1], m)
  redis.call('ZREM', KEYS[2], m)
  return redis.call('DEL', key)
end)
"""
)

# KEYS: one terminal state's zset. ARGV: call key prefix, session key prefix, before, batch,
# state. A call goes when it is old or already expired. A key that exists in another state
# was re-created after it expired: only its stale index entry goes.
PRUNE_CALLS = (
    _PRUNE_BATCH
    + """
return prune_batch(KEYS[1], tonumber(ARGV[3]), tonumber(ARGV[4]), function(m, old)
  local key = ARGV[1] .. m
  local state = redis.call('HGET', key, 'state')
  if not old and state == ARGV[5] then return nil end
  redis.call('ZREM', KEYS[1], m)
  if state and state ~= ARGV[5] then return 0 end
  redis.call('SREM', ARGV[2] .. string.match(m, '^([^:]+):'), m)
  return redis.call('DEL', key)
end)
"""
)
