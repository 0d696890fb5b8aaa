//! The Lua of the owner scripts. The clock, mode and queue helpers are a verbatim copy of
//! those of `dlock-redis` (its `base_lua` and `queue_lua`, private to it), so that an
//! owner's acquire prunes, joins and calls the key's queue exactly as every other script
//! on the node does; the owner's hold record is added on top (see [`super::scripts`]).

/// `dlock-redis`'s clock, mode and queue helpers (`KEYS[1]` lock, `KEYS[2]` fence counter,
/// `KEYS[3]` queue, `KEYS[4]` waiters' expiries), as a string literal for `concat!`.
macro_rules! queue_lua {
    () => {
        r"local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local function is_reader(token)
  return string.byte(token, 1) == 114
end
local function is_permit(token)
  return string.byte(token, 1) == 112
end
local function is_member(token)
  return is_reader(token) or is_permit(token)
end
local function permit_limit(token)
  return tonumber(string.match(token, '^p(%d+)%.'))
end
local function reader_ttl(key, now)
  local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2]
  if top then
    redis.call('PEXPIRE', key, string.format('%.0f', math.ceil((tonumber(top) - now) / 1000)))
  end
end
local function owner(token)
  local random = string.match(token, '^(%x+) ')
  if random and #random == 32 then return random end
  return nil
end
local function ours(held, token)
  if type(held) ~= 'string' then return false end
  if held == token then return true end
  local mine = owner(token)
  return mine ~= nil and owner(held) == mine
end
local function extend_reader(key, token, ttl_ms, now)
  local score = redis.pcall('ZSCORE', key, token)
  if type(score) ~= 'string' or tonumber(score) <= now then return 0 end
  redis.call('ZADD', key, string.format('%.0f', now + tonumber(ttl_ms) * 1000), token)
  reader_ttl(key, now)
  return 1
end
local function head()
  return redis.call('ZRANGE', KEYS[3], 0, 0)[1]
end
local function prune(now)
  local before = head()
  if not before then return nil, nil end
  local dead = redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', now, 'LIMIT', 0, 1000)
  if #dead == 0 then return before, before end
  redis.call('ZREM', KEYS[3], unpack(dead))
  redis.call('ZREM', KEYS[4], unpack(dead))
  return before, head()
end
local function enqueue(token, ticket, now, lease_ms)
  redis.call('ZADD', KEYS[3], 'NX', ticket, token)
  redis.call('ZADD', KEYS[4], string.format('%.0f', now + lease_ms * 1000), token)
  redis.call('PEXPIRE', KEYS[3], lease_ms)
  redis.call('PEXPIRE', KEYS[4], lease_ms)
end
local function holders(now)
  local kind = redis.call('TYPE', KEYS[1])['ok']
  if kind == 'none' then return 'none' end
  if kind ~= 'zset' then return 'writer' end
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  if redis.call('EXISTS', KEYS[1]) == 0 then return 'none' end
  return 'readers'
end
local function clear_ahead(token)
  local rank = redis.call('ZRANK', KEYS[3], token)
  if not rank then return redis.call('EXISTS', KEYS[3]) == 0 end
  if rank == 0 then return true end
  if not is_reader(token) then return false end
  for _, waiter in ipairs(redis.call('ZRANGE', KEYS[3], 0, rank - 1)) do
    if not is_reader(waiter) then return false end
  end
  return true
end
local function count_members(now)
  local kind = redis.call('TYPE', KEYS[1])['ok']
  if kind == 'none' then return 0, 0 end
  if kind ~= 'zset' then return nil, 0 end
  local expired = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  return redis.call('ZCARD', KEYS[1]), expired
end
local function call_permits(held, caller, channel, only_new)
  if not held then return end
  for i, waiter in ipairs(redis.call('ZRANGE', KEYS[3], 0, 999)) do
    local n = permit_limit(waiter)
    if n and waiter ~= caller and held + i - 1 < n and (not only_new or held + i == n) then
      redis.call('PUBLISH', channel, waiter)
    end
  end
end
local function call_turns(now, caller, channel)
  local first = head()
  if first and is_permit(first) then
    local held = count_members(now)
    return call_permits(held, caller, channel, false)
  end
  local kind = holders(now)
  if kind == 'writer' then return end
  for i, waiter in ipairs(redis.call('ZRANGE', KEYS[3], 0, 999)) do
    if not is_reader(waiter) then
      if i == 1 and kind == 'none' and waiter ~= caller then
        redis.call('PUBLISH', channel, waiter)
      end
      return
    end
    if waiter ~= caller then redis.call('PUBLISH', channel, waiter) end
  end
end
local function call_next(before, after, caller, channel, now)
  if after and after ~= before and after ~= caller then call_turns(now, caller, channel) end
end
local function grant_fence(now)
  local last = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
  local floor = tonumber(ARGV[6])
  local fence
  if floor > 0 then
    fence = math.max(last + 1, floor, now - 1000000)
  else
    fence = math.max(last + 1, now)
  end
  redis.call('SET', KEYS[2], string.format('%.0f', fence), 'PX', ARGV[3])
  return fence
end
"
    };
}

/// The owner's hold record, `{<lock key>}:reentry`: a hash of `owner`, `token` (the lock
/// key's value while the hold lives), `fence` (the hold's fencing token) and one field per
/// lease that counts (`l:` and 32 random hex digits). The hold count is the number of
/// lease fields.
///
/// `hold_of(lock, record)` answers `{owner, token, fence}` when the record is the lock's
/// current hold (its `token` is the lock key's value), and deletes a stale record (its
/// hold gone: expired, deleted by an operator, given up) so it can never count.
/// `keep_alive(lock, record, ttl_ms)` renews the hold for at least `ttl_ms`, never
/// shortening it (several leases with different ttls renew one hold), and gives the record
/// the lock key's expiry, so both go together.
macro_rules! record_lua {
    () => {
        r"
local META_FIELDS = 3
local function hold_of(lock, record)
  local rec = redis.call('HMGET', record, 'owner', 'token', 'fence')
  if not rec[2] then return nil end
  local held = redis.pcall('GET', lock)
  if type(held) ~= 'string' or held ~= rec[2] then
    redis.call('DEL', record)
    return nil
  end
  return rec
end
local function keep_alive(lock, record, ttl_ms)
  local left = redis.call('PTTL', lock)
  if left >= 0 and left < tonumber(ttl_ms) then
    redis.call('PEXPIRE', lock, ttl_ms)
    left = tonumber(ttl_ms)
  end
  if left < 0 then left = tonumber(ttl_ms) end
  redis.call('PEXPIRE', record, left)
end
"
    };
}
