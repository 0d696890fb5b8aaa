//! The read-only snapshot behind `inspect`.

use std::sync::LazyLock;

use redis::Script;

/// Read who holds the lock and who waits, changing nothing (no expired entry is dropped,
/// no waiter called): the snapshot behind
/// [`inspect`](dlock_core::DistributedLock::inspect).
///
/// `KEYS`: lock, fence, queue, waiter expiries, and (optional) the hold hash. Returns
/// `{kind, now, value, pttl, fence, members, queue, hold}`: `kind` the lock key's `TYPE`; `now` the server clock in µs; for a
/// string (a writer, or another library's lock) its value, its `PTTL` and the fence
/// counter (`''` when there is none); for a sorted set (readers, permits) `members`, the
/// live entries and their expiries (µs) flat, soonest first; `queue` the live waiters
/// (their entry's expiry still ahead) and their tickets flat, first in line first (at
/// most the first 1000, as the other scripts read), and `hold`: `{owner, count}` of an
/// owner's hold of the key (read when the hold hash is given), or `{}`.
pub(crate) static INSPECT: LazyLock<Script> = LazyLock::new(|| Script::new(INSPECT_LUA));
pub(crate) const INSPECT_LUA: &str = concat!(
    base_lua!(),
    hold_lua!(),
    r"
local now = now_us()
local kind = redis.call('TYPE', KEYS[1])['ok']
local value, pttl, fence, members, queue = '', -2, '', {}, {}
if kind == 'string' then
  value = redis.call('GET', KEYS[1])
  pttl = redis.call('PTTL', KEYS[1])
  fence = redis.call('GET', KEYS[2]) or ''
elseif kind == 'zset' then
  members = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. string.format('%.0f', now), '+inf', 'WITHSCORES')
end
local waiting = redis.call('ZRANGE', KEYS[3], 0, 999, 'WITHSCORES')
for i = 1, #waiting, 2 do
  local expires = redis.call('ZSCORE', KEYS[4], waiting[i])
  if expires and tonumber(expires) > now then
    queue[#queue + 1] = waiting[i]
    queue[#queue + 1] = waiting[i + 1]
  end
end
local hold = {}
if kind == 'string' and KEYS[5] then hold = hold_count(KEYS[1], KEYS[5]) end
return {kind, string.format('%.0f', now), value, pttl, fence, members, queue, hold}
"
);
