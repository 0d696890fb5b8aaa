//! The permit acquire (a counting semaphore): the shared acquire's twin for a permit's
//! token, admitting while fewer members hold the key than the token's limit.

use std::sync::LazyLock;

use redis::Script;

/// Take one of the token's permits if one is free for us, in one round trip; when none is,
/// join the key's queue of waiters if asked to.
///
/// `KEYS` and `ARGV` as [`ACQUIRE`](super::ACQUIRE), with a permit's token
/// (`p<limit>.<hex>`, see [`new_permit_token`](super::new_permit_token)). Permit holders
/// are members of the sorted set at the lock key, as readers are (token by when its entry
/// expires). Expired entries are dropped first; then the caller may take a permit when
/// `held + rank < limit`, where `held` counts the live entries and `rank` is the number of
/// waiters before it in the queue (all of them for a caller not in it): the first
/// `limit - held` waiters go together, and a newcomer (a `try_acquire` too) gets in only
/// past the waiters a free permit is already promised to. A caller that will wait and
/// finds others waiting takes its place in the queue first. Taking a permit leaves the
/// queue and draws a fencing token from the key's one counter.
///
/// Nobody's turn changes when a permit is taken (`held` grows by one as the ranks behind
/// the taker shrink by one), so a grant calls nobody, unless expired entries or waiters
/// were dropped: then every permit waiter whose turn it is now is called.
///
/// Answers as [`ACQUIRE`](super::ACQUIRE): the fencing token, or `{PTTL, holder, first}`
/// where, with every permit taken, `PTTL` and `holder` are the soonest-expiring member's
/// (when a crashed holder's permit comes back) and `first` is 1 when that permit would be
/// the caller's (`held + rank == limit`); with permits free but promised to waiters
/// before the caller, `{-2, first waiter, 0}`; with a writer holding the key, its PTTL and
/// token, and `first` when the caller is first in line.
pub(crate) static ACQUIRE_PERMIT: LazyLock<Script> =
    LazyLock::new(|| Script::new(ACQUIRE_PERMIT_LUA));
pub(crate) const ACQUIRE_PERMIT_LUA: &str = concat!(
    base_lua!(),
    queue_lua!(),
    r"
local token = ARGV[1]
local limit = permit_limit(token)
local now = now_us()
local before, first
if redis.call('EXISTS', KEYS[3]) == 1 then before, first = prune(now) end
local held, expired = count_members(now)
local moved = expired > 0 or first ~= before
local queued = false
local function join()
  local ticket = ARGV[5]
  if ticket == '' then ticket = string.format('%.0f', now) end
  enqueue(token, ticket, now, tonumber(ARGV[8]))
  queued = true
end
if first and ARGV[4] == '1' then join() end
local rank = 0
if queued then
  rank = redis.call('ZRANK', KEYS[3], token)
elseif first then
  rank = redis.call('ZCARD', KEYS[3])
end
if limit and held and held + rank < limit then
  redis.call('ZADD', KEYS[1], string.format('%.0f', now + tonumber(ARGV[2]) * 1000), token)
  reader_ttl(KEYS[1], now)
  if queued then
    redis.call('ZREM', KEYS[3], token)
    redis.call('ZREM', KEYS[4], token)
  end
  if moved then call_permits(held + 1, token, ARGV[7], false) end
  return grant_fence(now)
end
if moved then call_turns(now, token, ARGV[7]) end
if ARGV[4] == '1' and not queued then
  join()
  rank = redis.call('ZRANK', KEYS[3], token)
end
local is_first = 0
if not held then
  if queued and rank == 0 then is_first = 1 end
  local holder = redis.pcall('GET', KEYS[1])
  if type(holder) ~= 'string' then holder = '' end
  return {redis.call('PTTL', KEYS[1]), holder, is_first}
end
if not limit or held < limit then return {-2, head() or '', 0} end
if queued and held + rank == limit then is_first = 1 end
local soonest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {math.ceil((tonumber(soonest[2]) - now) / 1000), soonest[1], is_first}
"
);

/// Give back a permit a waiting acquire took, and take its place in the key's queue again:
/// what a Redlock round that won too few nodes does on each node it took. Taking the
/// permit left the queue; rejoining with the same ticket gives every waiter back the turn
/// it had before the take, so the permit freed is the caller's own turn again and nobody
/// is called, unless a waiter with an earlier ticket joined meanwhile (the caller is then
/// not among the first `limit - held`, and the permit is the turn of the waiter at that
/// boundary, which is called) or expired entries were dropped (every waiter whose turn it
/// is now is called, as the release does).
///
/// `KEYS` as [`ACQUIRE_PERMIT`]. `ARGV`: token, channel, queue ticket (empty: the server
/// clock in µs), waiter lease ms. Returns 1 when the permit was the caller's and is given
/// back, 0 when it held none (the caller is queued either way).
pub(crate) static GIVE_BACK_PERMIT: LazyLock<Script> =
    LazyLock::new(|| Script::new(GIVE_BACK_PERMIT_LUA));
pub(crate) const GIVE_BACK_PERMIT_LUA: &str = concat!(
    base_lua!(),
    waiters_lua!(),
    r"
local token = ARGV[1]
local now = now_us()
local released, expired = 0, 0
if redis.pcall('ZREM', KEYS[1], token) == 1 then
  released = 1
  expired = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  reader_ttl(KEYS[1], now)
end
local before, first
if redis.call('EXISTS', KEYS[3]) == 1 then before, first = prune(now) end
local ticket = ARGV[3]
if ticket == '' then ticket = string.format('%.0f', now) end
enqueue(token, ticket, now, tonumber(ARGV[4]))
local held, more = count_members(now)
if expired + more > 0 or first ~= before then
  call_permits(held, token, ARGV[2], false)
elseif released == 1 and held
  and held + redis.call('ZRANK', KEYS[3], token) >= permit_limit(token) then
  call_permits(held, token, ARGV[2], true)
end
return released
"
);
