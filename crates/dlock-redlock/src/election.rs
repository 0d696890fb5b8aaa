//! Elections over the nodes: a candidate's token carries its value, a proclaim swaps the
//! token on every node (owner-checked, ttl kept), and observers listen on a channel of
//! the key on every node, where grants to candidates, proclaims and a leader's release
//! are announced.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use dlock_core::Result;
use dlock_redis::server::{Names, Node, NodeError, token_mode};
use futures::stream::{self, BoxStream, StreamExt};
use redis::Script;
use tokio::sync::mpsc;

use crate::cluster::Cluster;

/// How long an observer goes without reading the leader. Grants to candidates, proclaims
/// and resignations wake it; a leader that crashed (its keys expire) and an announcement a
/// node could not deliver (a node down, a subscriber connection broken) change nothing
/// that wakes it, so this bounds how late it sees them. Reading costs one round trip to
/// every node, so once a second per observer; a crashed leader is replaced only after its
/// ttl anyway.
pub(crate) const RECHECK: Duration = Duration::from_secs(1);

/// Notices one observer keeps unread; more are dropped, which loses nothing: any one
/// notice makes it read the leader.
const BACKLOG: usize = 64;

/// A candidate's token: 128 random bits as 32 hex digits, a space, and the value, as
/// `dlock-redis` makes a writer's token with the holder's description in place of the
/// value. So every script treats it as a writer's (its first byte is a hex digit), owner
/// checks compare its random part (the owner: see the crate docs, *Elections*), and inspect shows the value as the holder's `who`
/// (all of it after the first space: the core refuses control characters, and Redis
/// strings are binary-safe, so any printable value round-trips).
pub(crate) fn candidate_token(value: &str) -> String {
    format!("{:032x} {value}", rand::random::<u128>())
}

/// `token` (a candidate's) with `value` in place of the one it carries: the same random
/// part, so the proclaimed token still names the same hold.
pub(crate) fn proclaimed_token(token: &str, value: &str) -> String {
    let random = token.split_once(' ').map_or(token, |(random, _)| random);
    format!("{random} {value}")
}

/// The owner part of a token: for a token of ours ([`token_mode`] knows it), what precedes
/// its first space (its mode letter and random hex digits); another library's value is its
/// own owner. Two tokens with one owner are one hold, whatever value each carries, as the
/// owner checks on the nodes see it.
pub(crate) fn owner(token: &str) -> &str {
    match token_mode(token) {
        Some(_) => token.split_once(' ').map_or(token, |(random, _)| random),
        None => token,
    }
}

/// The channel on which the leadership of a key is announced on each node,
/// `{<lock key>}:leader`. Channels are not keys, and the lock's only other channel ends
/// in `:released`, so it names nothing else.
pub(crate) fn channel(names: &Names) -> String {
    format!("{{{}}}:leader", names.key)
}

/// Replace our token by the proclaimed one if the node holds ours, keeping the key's ttl,
/// and announce it. Ours is any token with our random part (the owner), whatever value it
/// carries, as every owner check of dlock-redis compares it: so a node that took an
/// earlier swap whose answer was lost is swapped (or put back) as well. `1` also when the
/// node already holds the proclaimed one; `0` when the key is not ours there (gone,
/// another holder's, a reader set: `GET` fails on it, hence `pcall`).
static PROCLAIM: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
local function owner(token)
  local random = string.match(token, '^(%x+) ')
  if random and #random == 32 then return random end
  return nil
end
local held = redis.pcall('GET', KEYS[1])
if type(held) ~= 'string' then return 0 end
if held == ARGV[2] then return 1 end
local mine = owner(ARGV[1])
if held == ARGV[1] or (mine ~= nil and owner(held) == mine) then
  redis.call('SET', KEYS[1], ARGV[2], 'KEEPTTL')
  redis.call('PUBLISH', ARGV[3], 'proclaim')
  return 1
end
return 0
",
    )
});

fn failure(node: &Node, op: &'static str, source: redis::RedisError) -> NodeError {
    NodeError::Redis {
        op,
        addr: Arc::from(node.addr()),
        source,
    }
}

/// On one node: swap `from` for `to` where the key holds `from` (see [`PROCLAIM`]).
pub(crate) async fn proclaim_on(
    node: &Node,
    names: &Names,
    from: &str,
    to: &str,
    channel: &str,
) -> Result<bool, NodeError> {
    let mut conn = node.raw_connection().await?;
    let replaced: i64 = PROCLAIM
        .key(&names.key)
        .arg(from)
        .arg(to)
        .arg(channel)
        .invoke_async(&mut conn)
        .await
        .map_err(|e| failure(node, "proclaim", e))?;
    Ok(replaced == 1)
}

/// On one node: tell the key's observers that the leadership changed.
async fn publish(node: &Node, channel: &str) -> Result<(), NodeError> {
    let mut conn = node.raw_connection().await?;
    redis::cmd("PUBLISH")
        .arg(channel)
        .arg("changed")
        .query_async::<i64>(&mut conn)
        .await
        .map(|_| ())
        .map_err(|e| failure(node, "announce", e))
}

/// Announce a change on the nodes `which`, in the background: the grant or release it
/// announces is complete on them, and the caller needs no answer (an observer that misses
/// it reads the leader within [`RECHECK`]), so it costs the caller no round trip and a
/// dropped caller leaves nothing half done.
pub(crate) fn announce(cluster: &Arc<Cluster>, which: Vec<usize>, channel: String) {
    if which.is_empty() {
        return;
    }
    let cluster = cluster.clone();
    tokio::spawn(async move {
        let c = &*cluster;
        for (i, result) in c
            .on(&which, c.read_timeout(), "announce", |n| {
                publish(n, &channel)
            })
            .await
        {
            if let Err(e) = result {
                tracing::debug!(node = i, error = %e, "cannot announce a leadership change");
            }
        }
    });
}

/// The leadership changes of the key whose channel is `channel`: subscribed (confirmed)
/// on every node that answers before this returns, a quorum at least, so every change
/// announced afterwards on a majority reaches a node it listens on. Each batch of notices
/// is one item; a subscriber connection that broke is re-subscribed at the next notice,
/// and when fewer than a quorum of subscriptions remain the stream yields an error (the
/// observer follows again).
pub(crate) async fn changes(
    cluster: Arc<Cluster>,
    channel: String,
) -> Result<BoxStream<'static, Result<()>>> {
    let (tx, rx) = mpsc::channel(BACKLOG);
    let c = &*cluster;
    let answers = c
        .on(&c.all(), c.read_timeout(), "observe", |n| {
            n.subscribe(&channel, 0, tx.clone())
        })
        .await;
    let mut subs = Vec::with_capacity(answers.len());
    let mut failures = Vec::new();
    for (_, answer) in answers {
        match answer {
            Ok(sub) => subs.push(Some(sub)),
            Err(e) => {
                failures.push(e);
                subs.push(None);
            }
        }
    }
    if c.nodes.len() - failures.len() < c.quorum {
        return Err(c.no_quorum("observe", failures));
    }
    let state = (cluster, channel, tx, rx, subs, false);
    Ok(stream::unfold(
        state,
        |(cluster, channel, tx, mut rx, mut subs, done)| async move {
            if done {
                return None;
            }
            // We keep a sender, so the queue never closes.
            rx.recv().await?;
            while rx.try_recv().is_ok() {}
            let c = &*cluster;
            for (i, sub) in subs.iter_mut().enumerate() {
                if sub.as_ref().is_some_and(|s| !s.is_alive()) {
                    let again = tokio::time::timeout(
                        c.read_timeout(),
                        c.nodes[i].subscribe(&channel, 0, tx.clone()),
                    )
                    .await;
                    *sub = match again {
                        Ok(Ok(s)) => Some(s),
                        _ => None,
                    };
                }
            }
            let live = subs.iter().flatten().filter(|s| s.is_alive()).count();
            let item = match live >= c.quorum {
                true => Ok(()),
                false => Err(dlock_core::LockError::unavailable(
                    crate::NAME,
                    "observe",
                    format!(
                        "listening for leadership changes on only {live} of {} nodes, {} needed",
                        c.nodes.len(),
                        c.quorum
                    ),
                )),
            };
            let done = item.is_err();
            Some((item, (cluster, channel, tx, rx, subs, done)))
        },
    )
    .boxed())
}

#[cfg(test)]
mod tests {
    use dlock_redis::server::token_holder;

    use super::*;

    #[test]
    fn a_candidate_token_carries_any_printable_value_as_a_writer() {
        for value in [
            "alpha@10.0.0.1",
            "first, again",
            "a b  c",
            "é✓ {x}:y",
            " lead",
        ] {
            let token = candidate_token(value);
            assert_eq!(token_mode(&token), Some(dlock_core::Mode::Exclusive));
            assert_eq!(token_holder(&token), Some(value));
            let next = proclaimed_token(&token, "next value");
            assert_eq!(next[..32], token[..32], "the same hold");
            assert_eq!(token_holder(&next), Some("next value"));
        }
    }

    #[test]
    fn the_leader_channel_names_no_other_channel() {
        let names = Names::new("dlock:", "k");
        assert_eq!(channel(&names), "{dlock:k}:leader");
        assert_ne!(channel(&names), names.channel);
    }
}
