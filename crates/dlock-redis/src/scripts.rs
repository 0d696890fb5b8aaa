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

mod names;
pub use names::Names;

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

#[macro_use]
mod lua;
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
pub(crate) use permits::{ACQUIRE_PERMIT, GIVE_BACK_PERMIT};
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
    clock_lua!(),
    fence_lua!(),
    // The uncontended acquire, before the other helpers are defined (each definition costs
    // every call): nobody waits, and the key is free.
    r"
local token = ARGV[1]
local me = ARGV[10]
local queued
if not me then
  queued = redis.call('EXISTS', KEYS[3]) == 1
  if not queued and redis.call('SET', KEYS[1], token, 'NX', 'PX', ARGV[2]) then
    local fence = grant_fence(now_us())
    if ARGV[9] == '1' then redis.call('PUBLISH', ARGV[7], '!leader') end
    return fence
  end
end
",
    modes_lua!(),
    waiters_lua!(),
    hold_lua!(),
    r"
if me then
  local entered = reenter(KEYS[1], KEYS[5], me, token, ARGV[2])
  if entered then
    redis.call('ZREM', KEYS[3], token)
    redis.call('ZREM', KEYS[4], token)
    return entered
  end
  queued = redis.call('EXISTS', KEYS[3]) == 1
end
local now = now_us()
local before, first
if queued then before, first = prune(now) end
-- Without an owner and a queue, the fast path found the key busy.
if (me or queued) and (not first or first == token)
  and redis.call('SET', KEYS[1], token, 'NX', 'PX', ARGV[2]) then
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
/// expired waiter was dropped (anywhere in the queue: one behind the first can hold up
/// readers or permit waiters behind it).
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
    // A writer's release of its own token with nobody waiting, before the helpers are
    // defined; anything else (an owner's entry, a member, a proclaimed value, a queue) goes
    // on below.
    r"
local token = ARGV[1]
local released = 0
local expired = 0
local answer
local now
-- The lock key's value (not a string for a reader set), read once for both paths.
local held = not ARGV[5] and redis.pcall('GET', KEYS[1])
local fast = held == token
if fast then
  redis.call('DEL', KEYS[1])
  released, answer = 1, 1
  if ARGV[4] == '1' then redis.call('PUBLISH', ARGV[2], '!leader') end
  if redis.call('EXISTS', KEYS[3]) == 0 then return 1 end
end
",
    base_lua!(),
    queue_lua!(),
    hold_lua!(),
    r"
if fast then
  -- Released above; the queue is not empty.
elseif ARGV[5] then
  answer = drop_entry(KEYS[1], KEYS[5], ARGV[5], token)
  if answer == 2 then released, answer = 1, 1 end
elseif is_member(token) then
  if redis.pcall('ZREM', KEYS[1], token) == 1 then
    released = 1
    now = now_us()
    expired = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    reader_ttl(KEYS[1], now)
  end
elseif ours(held, token) then
  redis.call('DEL', KEYS[1])
  released = 1
end
if not fast then
  answer = answer or released
  if released == 1 and ARGV[4] == '1' then redis.call('PUBLISH', ARGV[2], '!leader') end
  if redis.call('EXISTS', KEYS[3]) == 0 then return answer end
end
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
pub(crate) const SOURCES: [&str; 12] = [
    ACQUIRE_LUA,
    shared::ACQUIRE_SHARED_LUA,
    permits::ACQUIRE_PERMIT_LUA,
    permits::GIVE_BACK_PERMIT_LUA,
    TOUCH_LUA,
    RELEASE_LUA,
    EXTEND_LUA,
    EXTEND_MANY_LUA,
    claim::CLAIM_LUA,
    inspect::INSPECT_LUA,
    election::PROCLAIM_LUA,
    election::EXTEND_LEADER_LUA,
];

/// The source of the script of this crate whose SHA1 is `sha` (hex, as `EVALSHA` takes
/// it), for sending it as `EVAL` to a cluster node that lacks it.
pub(crate) fn source_of(sha: &str) -> Option<&'static str> {
    static HASHES: LazyLock<Vec<(String, &'static str)>> = LazyLock::new(|| {
        SOURCES
            .iter()
            .map(|source| (Script::new(source).get_hash().to_owned(), *source))
            .collect()
    });
    HASHES
        .iter()
        .find(|(hash, _)| hash.eq_ignore_ascii_case(sha))
        .map(|(_, source)| *source)
}

#[cfg(test)]
mod tests;
