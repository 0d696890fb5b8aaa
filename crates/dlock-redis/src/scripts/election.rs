//! The scripts only a leader's hold runs: proclaim, and the renewal that keeps its term.

use std::sync::LazyLock;

use redis::Script;

/// Replace a leader's token (its value) if the key still holds it (its owner part: the
/// same random bits with any value, so a retry after a lost answer finds it ours), keeping
/// the key's ttl, and tell the election's observers.
///
/// `KEYS`: lock key. `ARGV`: the token held, the token to hold instead (the same random
/// bits, another value), the channel. Returns 1 when replaced, 0 when the key is not ours.
/// `SET … KEEPTTL` needs Redis 6.0 or later.
pub(crate) static PROCLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(PROCLAIM_LUA));
pub(crate) const PROCLAIM_LUA: &str = concat!(
    base_lua!(),
    r"
if not ours(redis.pcall('GET', KEYS[1]), ARGV[1]) then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
redis.call('PUBLISH', ARGV[3], '!leader')
return 1
"
);

/// Reset a leader's ttl if the key is still ours, and the fence counter's lifetime with
/// it: `inspect` (and so `leader()`) reads the leader's term from the counter, which must
/// not expire under a leader that renews for longer than its hour.
///
/// `KEYS`: lock, fence. `ARGV`: token, ttl ms, fence lifetime ms. Returns 1 when extended,
/// 0 when not ours.
pub(crate) static EXTEND_LEADER: LazyLock<Script> =
    LazyLock::new(|| Script::new(EXTEND_LEADER_LUA));
pub(crate) const EXTEND_LEADER_LUA: &str = concat!(
    base_lua!(),
    r"
if not ours(redis.pcall('GET', KEYS[1]), ARGV[1]) then return 0 end
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return redis.call('PEXPIRE', KEYS[1], ARGV[2])
"
);
