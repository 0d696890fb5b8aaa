//! The Lua every script shares, as macros so that each script's source is one `concat!`
//! of constants (and dlock-redlock builds its own scripts from the same pieces).

/// Lua shared by every script: the server clock, and the reader set. A reader's token
/// starts with `r` (see [`new_reader_token`](super::new_reader_token)) and a permit's with
/// `p` and its limit (see [`new_permit_token`](super::new_permit_token)), so a script tells
/// the modes apart by the token alone. Readers and permit holders (*members*) hold the lock
/// key as a sorted set of token by when its entry expires (µs of the server clock); the key
/// itself expires with the longest-lived entry, so a plain `SET NX` sees it busy and the
/// last crashed member frees it on its own.
/// `reader_ttl` re-sets that expiry (the key vanishes with its last entry), and
/// `extend_reader` renews one member's entry.
///
/// `ours(held, token)` is every writer's owner check: whether the value `held` read from
/// the lock key (a `pcall` `GET`: not a string when the key is a reader set) is the hold
/// of `token`. A writer's token is 32 random hex digits, a space and what it carries (the
/// holder description, or an election candidate's value, which a proclaim replaces), so
/// the check compares the random part, the *owner*, alone: a hold whose value a proclaim
/// changed behind the handle's back (its answer lost, its future dropped) is still ours
/// to renew, release and proclaim again. A value that is not a token of ours (another
/// library's) matches only itself.
#[doc(hidden)]
#[macro_export]
macro_rules! base_lua {
    () => {
        concat!($crate::clock_lua!(), $crate::modes_lua!())
    };
}

/// The server clock, in µs: `now_us()`. First in every script (a script's fast path, before
/// the other helpers are defined, may need it).
#[doc(hidden)]
#[macro_export]
macro_rules! clock_lua {
    () => {
        r"
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
"
    };
}

/// `base_lua!` without the clock: the mode and owner helpers.
#[doc(hidden)]
#[macro_export]
macro_rules! modes_lua {
    () => {
        r"
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
"
    };
}

/// Lua shared by the scripts that read the queue: `KEYS[1]` is the lock, `KEYS[2]` the
/// fence counter, `KEYS[3]` the queue (score: the enqueue ticket), `KEYS[4]` the waiters'
/// expiries (score: µs of the server clock). `prune` drops the expired waiters and answers
/// the first one before and after, with `false` for before when any was dropped (one
/// behind the first changes the turns of those behind it as well, so the callers' "the
/// head moved" checks call again); `enqueue` adds or refreshes a waiter; `holders` answers
/// who holds the key (`none`, `readers`, `writer`), dropping expired readers first;
/// `clear_ahead` whether no writer waits before the caller (a writer: whether it is first;
/// a caller not in the queue: whether nobody waits); `call_turns` calls every waiter that
/// may take the key now (the first one, and when it is a reader the run of readers behind
/// it; with readers holding, only that run; when the first waiter wants a permit, every
/// permit waiter whose turn it is), the caller excepted; `call_next` runs it when `prune`
/// moved the head or dropped anyone; `grant_fence` issues the next fencing token.
/// `count_members` answers how many members hold the key (`nil` when a writer does) and
/// how many expired entries it dropped first; `call_permits` calls the permit waiters
/// whose turn it is with `held` members holding: the waiter at rank `i` (from 0) with
/// limit `n` may take a permit while `held + i < n`, so the first `n - held` waiters go
/// together and no later waiter passes them. With `only_new`, it calls only those whose
/// turn came by one permit freeing or one waiter ahead leaving (`held + i == n - 1`): the
/// others were called when their turn came.
#[doc(hidden)]
#[macro_export]
macro_rules! queue_lua {
    () => {
        concat!($crate::waiters_lua!(), $crate::fence_lua!())
    };
}

/// `queue_lua!` without `grant_fence` (see `fence_lua!`).
#[doc(hidden)]
#[macro_export]
macro_rules! waiters_lua {
    () => {
        r"
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
  return false, head()
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
  if after and after ~= before then call_turns(now, caller, channel) end
end
"
    };
}

/// `grant_fence(now)`: the next fencing token of the lock (`KEYS[2]` the counter; `ARGV[3]`
/// its lifetime ms, `ARGV[6]` the floor, `0` for none), written to the counter and
/// returned. The candidate (`now`, or with a floor `max(floor, now - 1 s)`) is written with
/// `SET … GET`, which answers the last token in the same call; only when the candidate is
/// not above it (a clock behind the counter, two grants in one µs) is `last + 1` written
/// over it. One call per grant while the clock moves on.
#[doc(hidden)]
#[macro_export]
macro_rules! fence_lua {
    () => {
        r"
local function grant_fence(now)
  local floor = tonumber(ARGV[6])
  local fence = now
  if floor > 0 then fence = math.max(floor, now - 1000000) end
  local last = redis.call('SET', KEYS[2], string.format('%.0f', fence), 'PX', ARGV[3], 'GET')
  last = tonumber(last or '0') or 0
  if last >= fence then
    fence = last + 1
    redis.call('SET', KEYS[2], string.format('%.0f', fence), 'PX', ARGV[3])
  end
  return fence
end
"
    };
}

/// The end of an acquire script whose key is busy: call the next waiter if the head of
/// the queue changed, queue the caller when it asked to wait (`ARGV[4]`, with its ticket
/// `ARGV[5]` and queue lease `ARGV[8]`), and answer `{pttl or -2, holder or head, is_first}`.
#[doc(hidden)]
#[macro_export]
macro_rules! busy_answer_lua {
    () => {
        r"call_next(before, first, token, ARGV[7], now)
if ARGV[4] == '1' then
  local ticket = ARGV[5]
  if ticket == '' then ticket = string.format('%.0f', now) end
  enqueue(token, ticket, now, tonumber(ARGV[8]))
  first = head()
end
local is_first = 0
if first == token then is_first = 1 end
local holder = redis.pcall('GET', KEYS[1])
if not holder then
  return {-2, first or '', is_first}
end
if type(holder) ~= 'string' then holder = '' end
return {redis.call('PTTL', KEYS[1]), holder, is_first}
"
    };
}
