//! Lua for reentrant holds ([`LockOptions::owner`](dlock_core::LockOptions::owner)): the
//! hold hash beside the lock key, and the steps the acquire, release, renewal and inspect
//! scripts take for an owner's hold.
//!
//! An owner's hold is an exclusive hold like any other: the lock key holds the first
//! acquire's token (so plain clients, other libraries and `inspect` see one writer). Beside
//! it, the hash `{<lock key>}:hold` ([`Names::hold`](super::Names::hold)) keeps
//!
//! | field | value |
//! |---|---|
//! | `owner` | the owner id |
//! | `hold` | the random part of the lock key's token: which continuous hold the hash is of |
//! | `fence` | the hold's fencing token, returned to every re-entry |
//! | `+<random part of an entry's token>` | `1`, one field per live entry (lease) of the hold |
//!
//! so the hold's count is the number of `+` fields (`HLEN - 3`). The hash and the lock key
//! get the same `PEXPIRE` in the same script, every time: they expire together, and the
//! last entry's release deletes both. A hash whose `hold` is not the lock key's random part
//! (the key expired, was deleted or taken by someone else, and the hash outlived it) is
//! stale: every step ignores it, and a first acquire overwrites it.
//!
//! An entry is named by the random part of the token its acquire made (unique, 128 bits),
//! so a lease of an earlier hold (its entry is not in the current hash) or a lease released
//! already finds nothing to drop or renew (`NotHeld`), and a cancelled acquire's clean-up,
//! which knows only the token it sent, drops exactly the entry that acquire may have added.

/// The Lua steps of an owner's hold (needs `base_lua!`: `owner(token)`, the random part).
///
/// - `hold_of(key, hold_key, me)`: the lock key's value when the hash is of the current
///   hold (and, unless `me` is `nil`, under owner `me`), else `nil`.
/// - `keep_alive(key, hold_key, ttl_ms)`: both keys' `PEXPIRE` to `ttl_ms` if that is
///   longer than the lock key's `PTTL`: a renewal or re-entry never shortens the hold.
/// - `reenter(key, hold_key, me, token, ttl_ms)`: when `me` holds the key, add the entry of
///   `token`, keep the hold alive for `ttl_ms`, and answer `{fence, held token}`; else `nil`.
/// - `take_hold(hold_key, me, token, fence, ttl_ms)`: a first acquire took the key with
///   `token`: (re)write the hash with the hold's one entry.
/// - `drop_entry(key, hold_key, me, token)`: remove the entry of `token` from `me`'s hold:
///   0 not ours, 1 removed, 2 removed and it was the last (the key and the hash deleted).
/// - `extend_entry(key, hold_key, token, ttl_ms)`: 1 and the hold kept alive when the entry
///   of `token` is in the current hold, else 0.
/// - `hold_count(key, hold_key)`: `{owner, count}` of the current hold, or `{}`.
macro_rules! hold_lua {
    () => {
        r"
local function hold_of(key, hold_key, me)
  local held = redis.pcall('GET', key)
  if type(held) ~= 'string' then return nil end
  local f = redis.call('HMGET', hold_key, 'owner', 'hold')
  if not f[2] or f[2] ~= owner(held) then return nil end
  if me and f[1] ~= me then return nil end
  return held
end
local function keep_alive(key, hold_key, ttl_ms)
  local ttl = tonumber(ttl_ms)
  if redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, ttl)
    redis.call('PEXPIRE', hold_key, ttl)
  end
end
local function reenter(key, hold_key, me, token, ttl_ms)
  local held = hold_of(key, hold_key, me)
  if not held then return nil end
  redis.call('HSET', hold_key, '+' .. owner(token), '1')
  keep_alive(key, hold_key, ttl_ms)
  return {tonumber(redis.call('HGET', hold_key, 'fence')), held}
end
local function take_hold(hold_key, me, token, fence, ttl_ms)
  local entry = owner(token)
  redis.call('DEL', hold_key)
  redis.call('HSET', hold_key, 'owner', me, 'hold', entry,
    'fence', string.format('%.0f', fence), '+' .. entry, '1')
  redis.call('PEXPIRE', hold_key, ttl_ms)
end
local function drop_entry(key, hold_key, me, token)
  if not hold_of(key, hold_key, me) then return 0 end
  if redis.call('HDEL', hold_key, '+' .. owner(token)) == 0 then return 0 end
  if redis.call('HLEN', hold_key) > 3 then return 1 end
  redis.call('DEL', key, hold_key)
  return 2
end
local function extend_entry(key, hold_key, token, ttl_ms)
  if not hold_of(key, hold_key, nil) then return 0 end
  if redis.call('HEXISTS', hold_key, '+' .. owner(token)) == 0 then return 0 end
  keep_alive(key, hold_key, ttl_ms)
  return 1
end
local function hold_count(key, hold_key)
  if not hold_of(key, hold_key, nil) then return {} end
  local me = redis.call('HGET', hold_key, 'owner')
  return {me, tostring(redis.call('HLEN', hold_key) - 3)}
end
"
    };
}
