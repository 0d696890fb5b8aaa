//! A fenced check-and-set on a Redis hash: the value and the token that wrote it live in
//! one hash (fields [`VALUE_FIELD`] and [`FENCE_FIELD`]), so they move together, sit in one
//! cluster slot, and expire or are deleted together.

use std::sync::LazyLock;

use ::redis::aio::ConnectionLike;
use ::redis::{FromRedisValue, Script, ToRedisArgs};

use crate::FenceError;
use crate::error::check_token;

/// The hash field holding the value.
pub const VALUE_FIELD: &str = "value";
/// The hash field holding the token of the last accepted write.
pub const FENCE_FIELD: &str = "fence";

/// KEYS[1] the hash; ARGV[1] the value, ARGV[2] the token (decimal, no leading zeros).
/// Returns nil when written, the stored token when refused. Tokens are compared as decimal
/// strings (longer is larger, then bytewise): Lua numbers are doubles, exact only to 2^53.
const SET_SCRIPT: &str = r"
local stored = redis.call('HGET', KEYS[1], ARGV[4])
local token = ARGV[2]
if stored then
  if #stored > #token or (#stored == #token and stored >= token) then
    return stored
  end
end
redis.call('HSET', KEYS[1], ARGV[3], ARGV[1], ARGV[4], token)
return false
";

static SET: LazyLock<Script> = LazyLock::new(|| Script::new(SET_SCRIPT));

/// Write `value` to the hash `key` with `token`, only if the token stored there is smaller
/// (or there is none yet): one `EVALSHA`, atomic on the server.
///
/// `conn` is any async connection of the `redis` crate (a multiplexed connection, a
/// `ConnectionManager`, a cluster connection). The hash keeps no expiry of its own; set
/// one with `PEXPIRE` if the data should age out.
///
/// # Errors
/// - [`FenceError::StaleToken`]: the hash already holds a token `>= token`; nothing changed.
/// - [`FenceError::InvalidInput`]: `token` is 0, before any I/O.
/// - [`FenceError::Store`]: Redis failed, or `key` holds something other than a hash.
pub async fn set<C, V>(conn: &mut C, key: &str, value: V, token: u64) -> Result<(), FenceError>
where
    C: ConnectionLike + Send,
    V: ToRedisArgs + Send + Sync,
{
    check_token(token)?;
    let refused_by: Option<String> = SET
        .key(key)
        .arg(value)
        .arg(token)
        .arg(VALUE_FIELD)
        .arg(FENCE_FIELD)
        .invoke_async(conn)
        .await
        .map_err(|e| FenceError::store("redis", e))?;
    match refused_by {
        None => Ok(()),
        Some(stored) => Err(FenceError::StaleToken {
            token,
            stored: stored.parse().unwrap_or(0),
        }),
    }
}

/// Read the hash `key`: its value and the token that wrote it, or `None` when it was never
/// written.
///
/// # Errors
/// [`FenceError::Store`]: Redis failed, or the hash's fields are not a value and a token.
pub async fn get<C, V>(conn: &mut C, key: &str) -> Result<Option<(V, u64)>, FenceError>
where
    C: ConnectionLike + Send,
    V: FromRedisValue,
{
    let (value, fence): (Option<V>, Option<u64>) = ::redis::cmd("HMGET")
        .arg(key)
        .arg(VALUE_FIELD)
        .arg(FENCE_FIELD)
        .query_async(conn)
        .await
        .map_err(|e| FenceError::store("redis", e))?;
    Ok(value.zip(fence))
}
