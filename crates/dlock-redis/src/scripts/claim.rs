//! The claim: how Redlock makes a hold its own again on a node that lost it.

use std::sync::LazyLock;

use redis::Script;

/// Make sure the lock is ours (create it if it is missing, e.g. on a node that restarted
/// empty) and that the fence counter is at least a given token. Used by Redlock.
///
/// `KEYS`: lock key, fence key. `ARGV`: token, ttl ms, fencing token, fence lifetime ms.
/// Returns 1 when the key is ours afterwards, 0 when another holder has it (for a permit:
/// when the key is missing the permit and every permit of the token's limit is taken).
pub(crate) static CLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(CLAIM_LUA));
pub(crate) const CLAIM_LUA: &str = concat!(
    base_lua!(),
    r"
local token = ARGV[1]
if is_member(token) then
  local kind = redis.call('TYPE', KEYS[1])['ok']
  if kind ~= 'none' and kind ~= 'zset' then return 0 end
  if not redis.call('ZSCORE', KEYS[1], token) then
    local now = now_us()
    -- A permit comes back only to a node with a permit free: a node never counts more
    -- holders than the limit (the Redlock permit quorum rests on it).
    if is_permit(token) then
      redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
      if redis.call('ZCARD', KEYS[1]) >= permit_limit(token) then return 0 end
    end
    redis.call('ZADD', KEYS[1], string.format('%.0f', now + tonumber(ARGV[2]) * 1000), token)
    reader_ttl(KEYS[1], now)
  end
else
  local v = redis.pcall('GET', KEYS[1])
  if not v then
    redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
  elseif not ours(v, token) then
    return 0
  end
end
local last = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if tonumber(ARGV[3]) > last then
  redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
end
return 1
"
);
