//! The server side of the protocol: key names and the Lua scripts.
//!
//! Every script runs atomically on the server and is sent as `EVALSHA`; a server that does
//! not know it (restarted, `SCRIPT FLUSH`) answers `NOSCRIPT`, and the call loads it and
//! runs it again (`redis::Script` does this). New connections load all scripts up front.

pub use crate::token::{
    is_permit_token, is_reader_token, new_permit_token, new_reader_token, new_token, token_for,
    token_holder, token_mode,
};
pub(crate) use crate::token::{new_campaign_token, with_value};
use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

/// The names one lock uses on the server.
///
/// | what | name |
/// |---|---|
/// | lock key (value: the holder's token) | `<prefix><key>` |
/// | fence counter | `{<prefix><key>}:fence` |
/// | release channel | `{<prefix><key>}:released` |
/// | waiters' queue (score: enqueue ticket) | `{<prefix><key>}:queue` |
/// | waiters' expiries (score: µs, server clock) | `{<prefix><key>}:waiters` |
/// | an owner's reentrant hold (hash: owner, hold, fence, entries) | `{<prefix><key>}:hold` |
///
/// The user's key is used verbatim, so with an empty prefix the lock key is exactly the
/// name another library (redis-py, redsync, node-redlock) would use for the same lock: the
/// two exclude each other. The fence key carries the lock key as its hash tag, so both sit
/// in one cluster slot (unless the key itself contains `}`). With a non-empty prefix that
/// does not start with `{`, no lock key can be another lock's fence, queue or waiters key;
/// with any other prefix (the empty one included), [`Names::check`] refuses the few keys
/// that would be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// The lock key.
    pub key: String,
    /// The fence counter.
    pub fence: String,
    /// The pub/sub channel on which the next waiter is called (each message is the token
    /// of the waiter whose turn it is), and election observers are woken (`!leader`).
    pub channel: String,
    /// The queue of waiters: a sorted set of waiter tokens by enqueue ticket.
    pub queue: String,
    /// When each waiter's entry expires: a sorted set of waiter tokens by µs of the
    /// server clock.
    pub waiters: String,
    /// An owner's reentrant hold of the key: a hash of the owner id, the hold's random
    /// part, its fencing token and one field per entry (see `scripts/hold.rs`); it
    /// expires with the lock key and is deleted with it.
    pub hold: String,
}

/// The suffixes of the names a lock keeps beside its lock key (`{<lock key>}<suffix>`).
const SIDE_KEYS: [&str; 4] = ["}:fence", "}:queue", "}:waiters", "}:hold"];

impl Names {
    /// Refuse `key` if under `prefix` its lock key would be another lock's fence counter,
    /// queue or waiters key (`{<prefix><other key>}:fence`, …), so that one lock can
    /// never reset another's counter or queue or be blocked by it. Only reachable with a prefix that is empty or starts
    /// with `{`.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`](dlock_core::LockError::InvalidKey) for such a key.
    pub fn check(prefix: &str, key: &str) -> dlock_core::Result<()> {
        // With a prefix that does not start with `{` no lock key starts with `{`: nothing to
        // check, and nothing to allocate on every acquire.
        if !prefix.is_empty() && !prefix.starts_with('{') {
            return Ok(());
        }
        let lock = format!("{prefix}{key}");
        let side_shaped = lock.starts_with(&format!("{{{prefix}"))
            && SIDE_KEYS.iter().any(|suffix| lock.ends_with(suffix));
        if side_shaped {
            return Err(dlock_core::LockError::invalid_key(
                key,
                "under this key prefix the key names another lock's fence counter or queue \
                 ({<prefix><key>}:fence, :queue, :waiters, :hold); use another key, or a prefix \
                 such as dlock:",
            ));
        }
        Ok(())
    }

    /// The names for `key` under `prefix`.
    pub fn new(prefix: &str, key: &str) -> Self {
        let lock = format!("{prefix}{key}");
        Self {
            fence: format!("{{{lock}}}:fence"),
            channel: format!("{{{lock}}}:released"),
            queue: format!("{{{lock}}}:queue"),
            waiters: format!("{{{lock}}}:waiters"),
            hold: format!("{{{lock}}}:hold"),
            key: lock,
        }
    }
}

/// How long a fence counter outlives the grant that last set it. Tokens are floored by the
/// server clock, so an expired counter does not make them go back (see [`ACQUIRE`]); the
/// counter only has to cover grants within the same microsecond and a server clock that
/// steps back by less than this.
pub(crate) fn fence_lifetime(ttl: Duration) -> Duration {
    ttl + Duration::from_secs(3600)
}

/// Milliseconds for a script argument (at least 1: `PX 0` is an error).
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// How long a waiter's entry in a key's queue lives after its last write: a waiter that
/// stops refreshing it (crashed, partitioned) is dropped this long after its last refresh,
/// and the queue itself expires this long after the last write by any waiter.
pub const WAITER_LEASE: Duration = Duration::from_secs(3);

/// How often a waiter refreshes its queue entry (and so re-checks whether the key is
/// free and its turn). A waiter crashed or cut off is skipped within
/// `WAITER_LEASE + TOUCH_EVERY` of its last refresh; a key freed without announcement
/// (another library's release, an operator's `DEL`) is noticed within `TOUCH_EVERY`.
pub const TOUCH_EVERY: Duration = Duration::from_secs(1);

/// Lua shared by every script: the server clock, and the reader set. A reader's token
/// starts with `r` (see [`new_reader_token`]) and a permit's with `p` and its limit (see
/// [`new_permit_token`]), so a script tells the modes apart by the token alone. Readers
/// and permit holders (*members*) hold the lock key as a sorted set of token by when its
/// entry expires (µs of the server clock); the key itself expires with the longest-lived
/// entry, so a plain `SET NX` sees it busy and the last crashed member frees it on its own.
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
        r"
local function now_us()
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
"
    };
}

/// Lua shared by the scripts that read the queue: `KEYS[1]` is the lock, `KEYS[2]` the
/// fence counter, `KEYS[3]` the queue (score: the enqueue ticket), `KEYS[4]` the waiters'
/// expiries (score: µs of the server clock). `prune` drops the expired waiters and answers
/// the first one before and after; `enqueue` adds or refreshes a waiter; `holders` answers
/// who holds the key (`none`, `readers`, `writer`), dropping expired readers first;
/// `clear_ahead` whether no writer waits before the caller (a writer: whether it is first;
/// a caller not in the queue: whether nobody waits); `call_turns` calls every waiter that
/// may take the key now (the first one, and when it is a reader the run of readers behind
/// it; with readers holding, only that run; when the first waiter wants a permit, every
/// permit waiter whose turn it is); `grant_fence` issues the next fencing token.
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

#[macro_use]
mod hold;
mod claim;
mod election;
mod inspect;
mod permits;
mod shared;
pub(crate) use claim::CLAIM;
pub(crate) use election::{EXTEND_LEADER, PROCLAIM};
pub(crate) use inspect::INSPECT;
pub(crate) use permits::ACQUIRE_PERMIT;
pub(crate) use shared::ACQUIRE_SHARED;

/// Take the lock if it is free and nobody waits before us, in one round trip; when it is
/// not, join the key's queue of waiters if asked to.
///
/// `KEYS`: lock, fence, queue, waiter expiries. `ARGV`: token, ttl ms, fence lifetime ms,
/// `1` to queue, the queue ticket (empty: the server clock in µs), the fence floor (`0`:
/// none), the channel, the waiter lease ms, and (optional) `1` for a campaign: a grant then
/// publishes `!leader` (no token starts with `!`, so no waiter takes it for its call) on the channel, so election observers see the new leader
/// at once. A plain acquire passes no ninth argument and publishes nothing.
///
/// An owner's acquire ([`LockOptions::owner`](dlock_core::LockOptions::owner)) passes a
/// fifth key, the hold hash ([`Names::hold`]), `0` as the ninth argument and the owner id
/// as the tenth. When the key is held under that owner (the hash is of the current hold),
/// the script adds the caller's entry, keeps the hold alive for the caller's ttl (never
/// shortening it), leaves the queue if the caller was in it and answers
/// `{fence, held token}` at once, whoever waits. Otherwise it goes on as any acquire, and
/// a grant writes the hold hash with the caller's one entry.
///
/// The key is taken only when it is free and the queue is empty or the caller is its first
/// live waiter; taking it leaves the queue. Returns the fencing token (an integer) when
/// taken, `{PTTL, holder, first}` when not: PTTL `-1` when the holder set no expiry
/// (another library's lock taken without a timeout), `-2` when the key is free but another
/// waiter is first (`holder` is then that waiter's token); `first` is 1 when the caller is
/// the first live waiter. A first waiter dropped as expired while the key is free has its
/// successor called on the channel.
///
/// When the queue key does not exist (nobody waits: it vanishes with its last entry),
/// nothing is pruned and the script is `SET NX PX` plus the fence: the uncontended acquire
/// pays one `EXISTS` for the queue.
///
/// The fencing token is `max(last token + 1, server time in µs, floor)` (with a floor:
/// `max(last + 1, floor, server time - 1 s)`, so clients that propose the same floor to
/// several servers get the same token from each): strictly increasing per key, and still
/// increasing after the counter expired or the server restarted empty, as long as the
/// clocks do not step back.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));
const ACQUIRE_LUA: &str = concat!(
    base_lua!(),
    queue_lua!(),
    hold_lua!(),
    r"
local token = ARGV[1]
local me = ARGV[10]
if me then
  local entered = reenter(KEYS[1], KEYS[5], me, token, ARGV[2])
  if entered then
    redis.call('ZREM', KEYS[3], token)
    redis.call('ZREM', KEYS[4], token)
    return entered
  end
end
local now = now_us()
local before, first
if redis.call('EXISTS', KEYS[3]) == 1 then before, first = prune(now) end
if (not first or first == token) and redis.call('SET', KEYS[1], token, 'NX', 'PX', ARGV[2]) then
  if first then
    redis.call('ZREM', KEYS[3], token)
    redis.call('ZREM', KEYS[4], token)
  end
  local fence = grant_fence(now)
  if me then take_hold(KEYS[5], me, token, fence, ARGV[2]) end
  if ARGV[9] == '1' then redis.call('PUBLISH', ARGV[7], '!leader') end
  return fence
end
",
    busy_answer_lua!()
);

/// Refresh a waiter's queue entry (adding it back if it expired) and tell it whether its
/// turn has come.
///
/// `KEYS`: lock, fence (unused), queue, waiter expiries. `ARGV`: token, queue ticket
/// (empty: the server clock in µs, for an entry that is added), channel, waiter lease ms.
/// Returns 1 when the key is free and the caller is the first live waiter, else 0.
///
/// An owner's waiter passes the hold hash as a fifth key and the owner id as a fifth
/// argument: it is answered 1 as well when the key is held under that owner (another
/// client of the owner took it meanwhile), so it re-tries and enters the hold.
pub(crate) static TOUCH: LazyLock<Script> = LazyLock::new(|| Script::new(TOUCH_LUA));
const TOUCH_LUA: &str = concat!(
    base_lua!(),
    queue_lua!(),
    hold_lua!(),
    r"
local token = ARGV[1]
local now = now_us()
local before, first = prune(now)
call_next(before, first, token, ARGV[3], now)
local ticket = ARGV[2]
if ticket == '' then ticket = string.format('%.0f', now) end
enqueue(token, ticket, now, tonumber(ARGV[4]))
if is_permit(token) then
  local held, expired = count_members(now)
  if expired > 0 then call_permits(held, token, ARGV[3], false) end
  if held and held + redis.call('ZRANK', KEYS[3], token) < permit_limit(token) then return 1 end
  return 0
end
if ARGV[5] and hold_of(KEYS[1], KEYS[5], ARGV[5]) then return 1 end
local kind = holders(now)
if is_reader(token) then
  if kind ~= 'writer' and clear_ahead(token) then return 1 end
elseif kind == 'none' and head() == token then
  return 1
end
return 0
"
);

/// Delete the lock if it is ours, leave the queue if we are in it, and (unless told not
/// to) call the next waiter: the message on the channel is the token of the first live
/// waiter, sent when the key is free and we released it, were first in line, or an
/// expired first waiter was dropped.
///
/// `KEYS`: lock, fence (unused), queue, waiter expiries. `ARGV`: token, channel, `1` to
/// announce, and (optional) `1` for a leader's hold: a release then publishes
/// `!leader` (no token starts with `!`, so no waiter takes it for its call) on the channel whether or not anyone waits, for election observers.
/// Returns 1 when the key was deleted, 0 when it was not ours (expired, broken, or another
/// holder's). With nobody queued (and no leader) it costs what a compare-and-delete costs.
///
/// An entry of an owner's hold passes the hold hash as a fifth key and the owner id as a
/// fifth argument (after a `0` leader flag): the script drops the entry of the token (the
/// one its acquire sent) from the owner's current hold, and deletes the lock key and the
/// hash only when that was the last entry; only then is the key free and the next waiter
/// called. Returns 1 when the entry was dropped, 0 when it is not in the current hold.
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));
const RELEASE_LUA: &str = concat!(
    base_lua!(),
    queue_lua!(),
    hold_lua!(),
    r"
local token = ARGV[1]
local released = 0
local expired = 0
local answer
local now
if ARGV[5] then
  answer = drop_entry(KEYS[1], KEYS[5], ARGV[5], token)
  if answer == 2 then released, answer = 1, 1 end
elseif is_member(token) then
  if redis.pcall('ZREM', KEYS[1], token) == 1 then
    released = 1
    now = now_us()
    expired = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    reader_ttl(KEYS[1], now)
  end
elseif ours(redis.pcall('GET', KEYS[1]), token) then
  redis.call('DEL', KEYS[1])
  released = 1
end
answer = answer or released
if released == 1 and ARGV[4] == '1' then redis.call('PUBLISH', ARGV[2], '!leader') end
if redis.call('EXISTS', KEYS[3]) == 0 then return answer end
now = now or now_us()
local before, first = prune(now)
local moved = released == 1 or first == token or first ~= before
local left = redis.call('ZREM', KEYS[3], token)
redis.call('ZREM', KEYS[4], token)
if ARGV[3] ~= '1' then return answer end
if is_permit(token) then
  -- One permit freed or one waiter left: only the waiter whose turn that makes is new,
  -- unless expired entries went too.
  if released == 1 or left == 1 or first ~= before then
    local held, more = count_members(now)
    call_permits(held, token, ARGV[2], expired + more == 0 and first == before)
  end
elseif moved then
  call_turns(now, token, ARGV[2])
end
return answer
"
);

/// Reset the lock's ttl if it is ours.
///
/// `KEYS`: lock key. `ARGV`: token, ttl ms. Returns 1 when extended, 0 when not ours.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND_LUA));
const EXTEND_LUA: &str = concat!(
    base_lua!(),
    r"
if is_member(ARGV[1]) then return extend_reader(KEYS[1], ARGV[1], ARGV[2], now_us()) end
if ours(redis.pcall('GET', KEYS[1]), ARGV[1]) then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"
);

/// Reset the ttl of every key given that is still ours: [`EXTEND`] for many keys in one
/// call. A key that is not ours (or not a string any more) is left alone and answers 0;
/// it does not fail the others.
///
/// `KEYS`: lock keys, then the hold hashes of the entries of owners' holds among them, in
/// the same order. `ARGV`: for each lock key in order, its token and its ttl ms; an entry
/// of an owner's hold passes its token with a `+` in front (no token starts with one), and
/// is renewed as the hold script's `extend_entry` does: kept alive when its entry is in the
/// current hold, never shortened. Returns one status per lock key: 1 when extended, 0 when
/// not ours.
pub(crate) static EXTEND_MANY: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND_MANY_LUA));
const EXTEND_MANY_LUA: &str = concat!(
    base_lua!(),
    hold_lua!(),
    r"
local statuses = {}
local now
local side = #ARGV / 2
for i = 1, #ARGV / 2 do
  local key = KEYS[i]
  local token = ARGV[2 * i - 1]
  if string.byte(token, 1) == 43 then
    side = side + 1
    statuses[i] = extend_entry(key, KEYS[side], string.sub(token, 2), ARGV[2 * i])
  elseif is_member(token) then
    now = now or now_us()
    statuses[i] = extend_reader(key, token, ARGV[2 * i], now)
  elseif ours(redis.pcall('GET', key), token) then
    statuses[i] = redis.call('PEXPIRE', key, ARGV[2 * i])
  else
    statuses[i] = 0
  end
end
return statuses
"
);

/// The source of every script, for loading them when a connection opens.
pub(crate) const SOURCES: [&str; 11] = [
    ACQUIRE_LUA,
    shared::ACQUIRE_SHARED_LUA,
    permits::ACQUIRE_PERMIT_LUA,
    TOUCH_LUA,
    RELEASE_LUA,
    EXTEND_LUA,
    EXTEND_MANY_LUA,
    claim::CLAIM_LUA,
    inspect::INSPECT_LUA,
    election::PROCLAIM_LUA,
    election::EXTEND_LEADER_LUA,
];

#[cfg(test)]
mod tests;
