//! The owner scripts on one node, one script call per operation: take-or-re-enter,
//! owner-checked release (lower the count, free the key at zero), owner-checked renewal
//! that never shortens the hold, and the claim that writes the fence back or gives the
//! hold back to a node that lost it.
//!
//! Every owner check is the hold record's: its `owner` is the caller's, its `token` is the
//! lock key's value (the record is the current hold's, not a stale one), and the lease's
//! field is in it. A lease field is 128 random bits made for one grant, so a lease of an
//! earlier hold, whose field is in no later record, can never lower a later hold's count.

use std::sync::LazyLock;
use std::time::Duration;

use dlock_core::Owner;
use dlock_redis::server::{Attempt, Names, Node, NodeError, Queueing, WAITER_LEASE};
use redis::{FromRedisValue, Script, ScriptInvocation, Value};

/// Take the key or re-enter the caller's owner hold, in one atomic step.
///
/// `KEYS`: lock, fence, queue, waiters' expiries, hold record. `ARGV`: the attempt's token,
/// ttl ms, fence lifetime ms, `1` to queue, the queue ticket, the fence floor, the channel,
/// the waiter lease ms (as `dlock-redis`'s acquire script), the owner, the lease field.
///
/// When the record is the key's current hold and its owner is ours: add the lease field,
/// keep the hold alive for at least the ttl, leave the queue (a waiter whose owner took
/// the key meanwhile), and answer `{'re', hold token, fence}`, whoever waits. Otherwise it
/// is `dlock-redis`'s acquire: take the key when it is free and nobody waits before us
/// (then write a fresh record: owner, token, fence, the lease field, under the key's ttl,
/// and answer the fence), else `{PTTL, holder, first}`, joining the queue if asked to.
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_LUA));
const ACQUIRE_LUA: &str = concat!(
    queue_lua!(),
    record_lua!(),
    r"
local token = ARGV[1]
local now = now_us()
local rec = hold_of(KEYS[1], KEYS[5])
if rec and rec[1] == ARGV[9] then
  redis.call('HSET', KEYS[5], ARGV[10], '1')
  keep_alive(KEYS[1], KEYS[5], ARGV[2])
  redis.call('ZREM', KEYS[3], token)
  redis.call('ZREM', KEYS[4], token)
  return {'re', rec[2], rec[3]}
end
local before, first
if redis.call('EXISTS', KEYS[3]) == 1 then before, first = prune(now) end
if (not first or first == token) and redis.call('SET', KEYS[1], token, 'NX', 'PX', ARGV[2]) then
  if first then
    redis.call('ZREM', KEYS[3], token)
    redis.call('ZREM', KEYS[4], token)
  end
  local fence = grant_fence(now)
  redis.call('DEL', KEYS[5])
  redis.call('HSET', KEYS[5], 'owner', ARGV[9], 'token', token,
    'fence', string.format('%.0f', fence), ARGV[10], '1')
  redis.call('PEXPIRE', KEYS[5], ARGV[2])
  return fence
end
",
    dlock_redis::busy_answer_lua!()
);

/// Take one lease out of the owner's hold; with the last one, free the key. Leave the
/// queue as the caller (`ARGV[1]`, the token it queued with) and, when asked to, call the
/// next waiter as `dlock-redis`'s release does.
///
/// `KEYS`: lock, fence, queue, waiters' expiries, hold record. `ARGV`: the queue token,
/// the channel, `1` to announce, the owner, the lease field. Returns 2 when the key was
/// freed (the count reached zero), 1 when the count was lowered, 0 when the lease does not
/// count in the key's current hold of this owner.
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_LUA));
const RELEASE_LUA: &str = concat!(
    queue_lua!(),
    record_lua!(),
    r"
local token = ARGV[1]
local released = 0
local rec = hold_of(KEYS[1], KEYS[5])
if rec and rec[1] == ARGV[4] and redis.call('HDEL', KEYS[5], ARGV[5]) == 1 then
  released = 1
  if redis.call('HLEN', KEYS[5]) <= META_FIELDS then
    redis.call('DEL', KEYS[1], KEYS[5])
    released = 2
  end
end
if redis.call('EXISTS', KEYS[3]) == 0 then return released end
local now = now_us()
local before, first = prune(now)
local moved = released == 2 or first == token or first ~= before
redis.call('ZREM', KEYS[3], token)
redis.call('ZREM', KEYS[4], token)
if ARGV[3] == '1' and moved then call_turns(now, token, ARGV[2]) end
return released
"
);

/// Keep the owner's hold alive for at least the ttl, never shortening it, if the lease
/// counts in it.
///
/// `KEYS`: lock, hold record. `ARGV`: ttl ms, owner, lease field, hold token. Returns 1
/// when renewed, 0 when the lease does not count in that hold there (a node that holds
/// another hold of the owner, one this lease's round took afresh, does not renew it).
static RENEW: LazyLock<Script> = LazyLock::new(|| Script::new(RENEW_LUA));
const RENEW_LUA: &str = concat!(
    record_lua!(),
    r"
local rec = hold_of(KEYS[1], KEYS[2])
if rec and rec[1] == ARGV[2] and rec[2] == ARGV[4]
  and redis.call('HEXISTS', KEYS[2], ARGV[3]) == 1 then
  keep_alive(KEYS[1], KEYS[2], ARGV[1])
  return 1
end
return 0
"
);

/// Make the owner's hold `token` present here with the lease counted and its fence at
/// least `fence`: the fence write-back after a fresh grant, and the hold given back to a
/// node that lost it (restarted empty) or missed the lease's re-entry. A node where
/// another holder has the key is left alone.
///
/// `KEYS`: lock, fence, hold record. `ARGV`: hold token, ttl ms, fence, fence lifetime ms,
/// owner, lease field. Returns 1 when the hold is ours here afterwards, else 0.
static CLAIM: LazyLock<Script> = LazyLock::new(|| Script::new(CLAIM_LUA));
const CLAIM_LUA: &str = concat!(
    record_lua!(),
    r"
local v = redis.pcall('GET', KEYS[1])
if not v then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
elseif v ~= ARGV[1] then
  return 0
end
local rec = redis.call('HMGET', KEYS[3], 'owner', 'token', 'fence')
if rec[1] ~= ARGV[5] or rec[2] ~= ARGV[1] then
  redis.call('DEL', KEYS[3])
  redis.call('HSET', KEYS[3], 'owner', ARGV[5], 'token', ARGV[1], 'fence', ARGV[3])
elseif (tonumber(rec[3]) or 0) < tonumber(ARGV[3]) then
  redis.call('HSET', KEYS[3], 'fence', ARGV[3])
end
redis.call('HSET', KEYS[3], ARGV[6], '1')
keep_alive(KEYS[1], KEYS[3], ARGV[2])
local last = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if tonumber(ARGV[3]) > last then
  redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
end
return 1
"
);

/// How long a fence counter outlives the grant that last set it: as in `dlock-redis`.
fn fence_lifetime(ttl: Duration) -> Duration {
    ttl + Duration::from_secs(3600)
}

/// Milliseconds for a script argument (at least 1: `PX 0` is an error).
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// One node's answer to an owner's acquire attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// Taken fresh, or busy: as a plain acquire.
    Attempt(Attempt),
    /// The owner's hold `token` counts the lease now; `fence` is its fencing token here.
    Reentered { token: String, fence: u64 },
}

/// One lease of an owner on one key, as the nodes know it: the lock's names, the hold
/// record's, the owner and the lease's field in the record.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub(crate) names: Names,
    pub(crate) record: String,
    pub(crate) owner: Owner,
    pub(crate) lease: String,
}

impl Entry {
    fn queue_keys<'s, 'c>(
        &self,
        call: &'c mut ScriptInvocation<'s>,
    ) -> &'c mut ScriptInvocation<'s> {
        call.key(&self.names.key)
            .key(&self.names.fence)
            .key(&self.names.queue)
            .key(&self.names.waiters)
            .key(&self.record)
    }

    /// Take the key or re-enter the owner's hold on `node` (see [`ACQUIRE`]).
    pub(crate) async fn acquire(
        &self,
        node: &Node,
        token: &str,
        ttl: Duration,
        queueing: &Queueing,
    ) -> Result<Answer, NodeError> {
        let mut call = ACQUIRE.prepare_invoke();
        self.queue_keys(&mut call)
            .arg(token)
            .arg(millis(ttl))
            .arg(millis(fence_lifetime(ttl)))
            .arg(if queueing.wait { "1" } else { "0" })
            .arg(queueing.ticket.map(|t| t.to_string()).unwrap_or_default())
            .arg(queueing.fence_floor.unwrap_or(0))
            .arg(&self.names.channel)
            .arg(millis(WAITER_LEASE))
            .arg(self.owner.as_str())
            .arg(&self.lease);
        let reply: Value = invoke(node, "acquire", &call).await?;
        parse_acquire(reply).ok_or_else(|| bad_reply(node, "acquire", "an unexpected reply"))
    }

    /// Take the lease out of the owner's hold on `node`, freeing the key with the last one,
    /// and leave the queue as `queued` (see [`RELEASE`]). `Some(true)`: the key was freed.
    pub(crate) async fn release(
        &self,
        node: &Node,
        queued: &str,
        announce: bool,
    ) -> Result<Option<bool>, NodeError> {
        let mut call = RELEASE.prepare_invoke();
        self.queue_keys(&mut call)
            .arg(queued)
            .arg(&self.names.channel)
            .arg(if announce { "1" } else { "0" })
            .arg(self.owner.as_str())
            .arg(&self.lease);
        match invoke::<i64>(node, "release", &call).await? {
            2 => Ok(Some(true)),
            1 => Ok(Some(false)),
            0 => Ok(None),
            _ => Err(bad_reply(node, "release", "an unexpected count")),
        }
    }

    /// Keep the hold `hold` (its token) alive on `node` for at least `ttl` (see
    /// [`RENEW`]). `false`: the lease does not count in it there.
    pub(crate) async fn renew(
        &self,
        node: &Node,
        hold: &str,
        ttl: Duration,
    ) -> Result<bool, NodeError> {
        let mut call = RENEW.prepare_invoke();
        call.key(&self.names.key)
            .key(&self.record)
            .arg(millis(ttl))
            .arg(self.owner.as_str())
            .arg(&self.lease)
            .arg(hold);
        Ok(invoke::<i64>(node, "extend", &call).await? == 1)
    }

    /// Make the hold `token` ours on `node` with the lease counted and its fence at least
    /// `fence` (see [`CLAIM`]). `false`: another holder has the key there.
    pub(crate) async fn claim(
        &self,
        node: &Node,
        token: &str,
        ttl: Duration,
        fence: u64,
    ) -> Result<bool, NodeError> {
        let mut call = CLAIM.prepare_invoke();
        call.key(&self.names.key)
            .key(&self.names.fence)
            .key(&self.record)
            .arg(token)
            .arg(millis(ttl))
            .arg(fence)
            .arg(millis(fence_lifetime(ttl)))
            .arg(self.owner.as_str())
            .arg(&self.lease);
        Ok(invoke::<i64>(node, "claim", &call).await? == 1)
    }
}

/// The acquire script's reply: a fence (taken), `{'re', token, fence}` (re-entered) or
/// `{PTTL, holder, first}` (busy).
fn parse_acquire(reply: Value) -> Option<Answer> {
    if let Value::Int(fence) = reply {
        let fence = u64::try_from(fence).ok()?;
        return Some(Answer::Attempt(Attempt::Taken { fence }));
    }
    let Value::Array(items) = reply else {
        return None;
    };
    if let Some(Value::BulkString(tag)) = items.first()
        && tag.as_slice() == b"re"
    {
        let (_, token, fence): (String, String, String) =
            FromRedisValue::from_redis_value(Value::Array(items)).ok()?;
        return Some(Answer::Reentered {
            token,
            fence: fence.parse().ok()?,
        });
    }
    let (pttl, holder, first): (i64, Option<String>, i64) =
        FromRedisValue::from_redis_value(Value::Array(items)).ok()?;
    Some(Answer::Attempt(Attempt::Busy {
        pttl: u64::try_from(pttl).ok().map(Duration::from_millis),
        holder: holder.unwrap_or_default(),
        first: first == 1,
    }))
}

/// Run `call` on `node`'s command connection. A connection that broke under it is handed
/// back to the node through one of its own requests (which fails the same way, so the node
/// drops it and the next request reconnects): the node's connection handling is private.
async fn invoke<T: FromRedisValue>(
    node: &Node,
    op: &'static str,
    call: &ScriptInvocation<'_>,
) -> Result<T, NodeError> {
    let mut conn = node.raw_connection().await?;
    match call.invoke_async(&mut conn).await {
        Ok(value) => Ok(value),
        Err(e) => {
            if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() {
                let probe = Names::new("", "dlock-redlock:connection-probe");
                let _ = node
                    .extend_leader(&probe, "-", Duration::from_millis(1))
                    .await;
            }
            Err(NodeError::Redis {
                op,
                addr: node.addr().into(),
                source: e,
            })
        }
    }
}

fn bad_reply(node: &Node, op: &'static str, what: &str) -> NodeError {
    NodeError::Reply {
        op,
        addr: node.addr().into(),
        reply: what.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_told_apart() {
        assert_eq!(
            parse_acquire(Value::Int(7)),
            Some(Answer::Attempt(Attempt::Taken { fence: 7 }))
        );
        let re = Value::Array(vec![
            Value::BulkString(b"re".to_vec()),
            Value::BulkString(b"abc holder".to_vec()),
            Value::BulkString(b"1700000000000000".to_vec()),
        ]);
        assert_eq!(
            parse_acquire(re),
            Some(Answer::Reentered {
                token: "abc holder".into(),
                fence: 1_700_000_000_000_000
            })
        );
        // A busy key with 1 ms left is not a re-entry.
        let busy = Value::Array(vec![
            Value::Int(1),
            Value::BulkString(b"t".to_vec()),
            Value::Int(0),
        ]);
        assert_eq!(
            parse_acquire(busy),
            Some(Answer::Attempt(Attempt::Busy {
                pttl: Some(Duration::from_millis(1)),
                holder: "t".into(),
                first: false
            }))
        );
        let free_other_turn = Value::Array(vec![
            Value::Int(-2),
            Value::BulkString(b"w".to_vec()),
            Value::Int(0),
        ]);
        assert!(matches!(
            parse_acquire(free_other_turn),
            Some(Answer::Attempt(Attempt::Busy { pttl: None, .. }))
        ));
    }
}
