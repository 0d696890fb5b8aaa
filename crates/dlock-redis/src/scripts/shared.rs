//! The shared (reader) acquire: the exclusive one's twin for a reader's token.

use std::sync::LazyLock;

use redis::Script;

/// Join the readers of the lock if no writer holds it and none waits before us, in one
/// round trip; when we may not, join the key's queue of waiters if asked to.
///
/// `KEYS` and `ARGV` as [`ACQUIRE`](super::ACQUIRE), with a reader's token. Readers hold
/// the lock key as a sorted set (reader token by when its entry expires, µs of the server
/// clock) whose own expiry is the longest entry's. A caller that will wait and finds
/// others waiting takes its place in the queue *first* and may join the readers when only
/// readers wait before it: so the run of readers a release calls all get in, and a reader
/// that arrives behind a waiting writer waits behind it. A caller that will not wait
/// (`try_acquire`) joins only when nobody waits. Joining leaves the queue and draws a
/// fencing token from the key's one counter, as a writer does. The answers are those of
/// [`ACQUIRE`](super::ACQUIRE); `first` is 1 when no writer waits before the caller (it
/// may join as soon as no writer holds the key).
pub(crate) static ACQUIRE_SHARED: LazyLock<Script> =
    LazyLock::new(|| Script::new(ACQUIRE_SHARED_LUA));
pub(crate) const ACQUIRE_SHARED_LUA: &str = concat!(
    base_lua!(),
    queue_lua!(),
    r"
local token = ARGV[1]
local now = now_us()
local before, first
if redis.call('EXISTS', KEYS[3]) == 1 then before, first = prune(now) end
local kind = holders(now)
local queued = false
local function join()
  local ticket = ARGV[5]
  if ticket == '' then ticket = string.format('%.0f', now) end
  enqueue(token, ticket, now, tonumber(ARGV[8]))
  queued = true
end
if first and ARGV[4] == '1' then join() end
-- Whether we take the key or not: entries dropped ahead of other waiters gave them a turn.
call_next(before, first, token, ARGV[7], now)
if kind ~= 'writer' and (not first or (queued and clear_ahead(token))) then
  redis.call('ZADD', KEYS[1], string.format('%.0f', now + tonumber(ARGV[2]) * 1000), token)
  reader_ttl(KEYS[1], now)
  if queued then
    redis.call('ZREM', KEYS[3], token)
    redis.call('ZREM', KEYS[4], token)
  end
  return grant_fence(now)
end
if ARGV[4] == '1' and not queued then join() end
local is_first = 0
if queued and clear_ahead(token) then is_first = 1 end
if kind == 'none' then return {-2, head() or '', is_first} end
local holder = redis.pcall('GET', KEYS[1])
if type(holder) ~= 'string' then holder = '' end
return {redis.call('PTTL', KEYS[1]), holder, is_first}
"
);
