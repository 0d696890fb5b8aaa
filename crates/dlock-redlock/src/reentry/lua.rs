//! The Lua of the owner scripts. The clock, mode and queue helpers are `dlock-redis`'s own
//! (its `base_lua!` and `queue_lua!`), so that an owner's acquire prunes, joins and calls
//! the key's queue exactly as every other script on the node does; the owner's hold record
//! is added on top (see [`super::scripts`]).

/// `dlock-redis`'s clock, mode and queue helpers (`KEYS[1]` lock, `KEYS[2]` fence counter,
/// `KEYS[3]` queue, `KEYS[4]` waiters' expiries), as a string literal for `concat!`.
macro_rules! queue_lua {
    () => {
        concat!(dlock_redis::base_lua!(), dlock_redis::queue_lua!())
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
