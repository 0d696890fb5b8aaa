//! The server side of the protocol: key names and the Lua scripts.
//!
//! Every script runs atomically on the server and is sent as `EVALSHA`; a server that does
//! not know it (restarted, `SCRIPT FLUSH`) answers `NOSCRIPT`, and the call loads it and
//! runs it again (`redis::Script` does this). New connections load all scripts up front.

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
///
/// The user's key is used verbatim, so with an empty prefix the lock key is exactly the
/// name another library (redis-py, redsync, node-redlock) would use for the same lock: the
/// two exclude each other. The fence key carries the lock key as its hash tag, so both sit
/// in one cluster slot (unless the key itself contains `}`). With a non-empty prefix that
/// does not start with `{`, no lock key can be another lock's fence key; with any other
/// prefix (the empty one included), [`Names::check`] refuses the few keys that would be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    /// The lock key.
    pub key: String,
    /// The fence counter.
    pub fence: String,
    /// The pub/sub channel a release is announced on.
    pub channel: String,
}

impl Names {
    /// Refuse `key` if under `prefix` its lock key would be another lock's fence counter
    /// (`{<prefix><other key>}:fence`), so that one lock can never reset another's
    /// counter or be blocked by it. Only reachable with a prefix that is empty or starts
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
        let fence_shaped = lock.starts_with(&format!("{{{prefix}")) && lock.ends_with("}:fence");
        if fence_shaped {
            return Err(dlock_core::LockError::invalid_key(
                key,
                "under this key prefix the key names another lock's fence counter \
                 ({<prefix><key>}:fence); use another key, or a prefix such as dlock:",
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
            key: lock,
        }
    }
}

/// A fresh holder token: 128 random bits from a cryptographically secure generator, as 32
/// hex digits.
pub fn new_token() -> String {
    format!("{:032x}", rand::random::<u128>())
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

/// Take the lock if it is free, in one round trip.
///
/// `KEYS`: lock key, fence key. `ARGV`: token, ttl ms, fence lifetime ms.
/// Returns `{1, fencing token, ''}` when taken, `{0, PTTL, holder}` when held (PTTL `-1`: the
/// holder set no expiry, e.g. another library's lock without a timeout; `holder`: the key's
/// value, the holder's token, or empty when it is not a string).
///
/// The fencing token is `max(last token + 1, server time in µs)`: strictly increasing per
/// key, and still increasing after the counter expired or the server restarted empty, as
/// long as the server clock does not step back.
pub(crate) static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));
const ACQUIRE_LUA: &str = r"
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local holder = redis.pcall('GET', KEYS[1])
  if type(holder) ~= 'string' then holder = '' end
  return {0, redis.call('PTTL', KEYS[1]), holder}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local token = math.max(last + 1, now)
redis.call('SET', KEYS[2], string.format('%.0f', token), 'PX', ARGV[3])
return {1, token, ''}
";

/// Delete the lock if it is ours and (unless told not to) announce the release: the
/// message is the released token, so a waiter can tell which holder left.
///
/// `KEYS`: lock key. `ARGV`: token, channel, `1` to announce. Returns 1 when deleted, 0 when
/// the key was not ours (expired, broken, or another holder's).
pub(crate) static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));
const RELEASE_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if ARGV[3] == '1' then
    redis.call('PUBLISH', ARGV[2], ARGV[1])
  end
  return 1
end
return 0
";

/// Reset the lock's ttl if it is ours.
///
/// `KEYS`: lock key. `ARGV`: token, ttl ms. Returns 1 when extended, 0 when not ours.
pub(crate) static EXTEND: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND_LUA));
const EXTEND_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// Reset the ttl of every key given that is still ours: [`EXTEND`] for many keys in one
/// call. A key that is not ours (or not a string any more) is left alone and answers 0;
/// it does not fail the others.
///
/// `KEYS`: lock keys. `ARGV`: for each key in order, its token and its ttl ms. Returns one
/// status per key: 1 when extended, 0 when not ours.
pub(crate) static EXTEND_MANY: LazyLock<Script> = LazyLock::new(|| Script::new(EXTEND_MANY_LUA));
const EXTEND_MANY_LUA: &str = r"
local statuses = {}
for i, key in ipairs(KEYS) do
  if redis.pcall('GET', key) == ARGV[2 * i - 1] then
    statuses[i] = redis.call('PEXPIRE', key, ARGV[2 * i])
  else
    statuses[i] = 0
  end
end
return statuses
";

/// Make sure the lock is ours (create it if it is missing, e.g. on a node that restarted
/// empty) and that the fence counter is at least a given token. Used by Redlock.
///
/// `KEYS`: lock key, fence key. `ARGV`: token, ttl ms, fencing token, fence lifetime ms.
/// Returns 1 when the key is ours afterwards, 0 when another holder has it.
pub(crate) static CLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(CLAIM_LUA));
const CLAIM_LUA: &str = r"
local v = redis.call('GET', KEYS[1])
if not v then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
elseif v ~= ARGV[1] then
  return 0
end
local last = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if tonumber(ARGV[3]) > last then
  redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
end
return 1
";

/// The source of every script, for loading them when a connection opens.
pub(crate) const SOURCES: [&str; 5] = [
    ACQUIRE_LUA,
    RELEASE_LUA,
    EXTEND_LUA,
    EXTEND_MANY_LUA,
    CLAIM_LUA,
];

#[cfg(test)]
mod tests {
    #[test]
    fn no_key_names_another_locks_fence_counter() {
        use super::Names;
        for prefix in ["", "{", "{app}:", "dlock:"] {
            for key in ["x", "a}b", "{x}", "{x}:released", ":fence", "{}:fence"] {
                let names = Names::new(prefix, key);
                if Names::check(prefix, key).is_ok() {
                    for other in ["x", "a}b", "{x}", "", "{"] {
                        assert_ne!(
                            names.key,
                            Names::new(prefix, other).fence,
                            "{prefix:?} {key:?}"
                        );
                    }
                }
            }
            // The collision the check exists for.
            let victim = Names::new(prefix, "x");
            let attacker = victim.fence.strip_prefix(prefix).map(str::to_owned);
            if let Some(attacker) = attacker {
                assert_eq!(Names::new(prefix, &attacker).key, victim.fence);
                assert!(
                    Names::check(prefix, &attacker).is_err(),
                    "{prefix:?} {attacker:?}"
                );
            }
        }
        assert!(Names::check("", "{x}:fence").is_err());
        assert!(Names::check("dlock:", "{x}:fence").is_ok());
    }

    use super::*;

    #[test]
    fn names_are_distinct_and_share_the_hash_tag() {
        let n = Names::new("dlock:", "orders/42");
        assert_eq!(n.key, "dlock:orders/42");
        assert_eq!(n.fence, "{dlock:orders/42}:fence");
        assert_eq!(n.channel, "{dlock:orders/42}:released");
        assert_eq!(Names::new("", "x").key, "x");
    }

    #[test]
    fn tokens_are_128_bits_and_differ() {
        let (a, b) = (new_token(), new_token());
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn millis_is_never_zero() {
        assert_eq!(millis(Duration::ZERO), 1);
        assert_eq!(millis(Duration::from_millis(1500)), 1500);
    }
}
