//! Reading a key without touching it: one server's snapshot of the holders and waiters
//! of a lock ([`Node::inspect`](crate::server::Node::inspect)), as `inspect` shows it.

use std::time::{Duration, UNIX_EPOCH};

use dlock_core::{HolderStatus, KeyStatus, Mode, WaiterStatus};

use crate::error::Error;
use crate::node::{Node, queue_keys};
use crate::scripts::{self, token_holder, token_mode};
use crate::server::Names;

/// The inspect script's reply, as it comes: kind, now (µs), value, PTTL, fence counter,
/// the live members and their expiries flat, the live waiters and their tickets flat
/// (and, read apart by [`Node::inspect_hold`], an owner's hold: `[owner, count]` or `[]`).
pub(crate) type RawStatus = (
    String,
    String,
    String,
    i64,
    String,
    Vec<String>,
    Vec<String>,
);

/// An owner's reentrant hold of a key, as `inspect` reads it from the hold hash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HoldCount {
    /// The owner id.
    pub(crate) owner: String,
    /// How many entries (leases) of the hold are live.
    pub(crate) count: u64,
}

/// One server's view of a lock at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    /// The holds of the key on this server: one writer (or another library's lock), or
    /// the live readers or permits, soonest-expiring first.
    pub holders: Vec<NodeHolder>,
    /// The live waiters, first in line first.
    pub waiters: Vec<NodeWaiter>,
}

/// One hold of a key on one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeHolder {
    /// The holder's token (the lock key's value, or its member of the sorted set).
    pub token: String,
    /// The hold's mode, told by its token (another library's lock: exclusive).
    pub mode: Mode,
    /// How long the server keeps the hold without a renewal; `None` for a key without
    /// expiry (another library's lock taken without a timeout).
    pub ttl_left: Option<Duration>,
    /// The fence counter, for a writer of ours: the last token the key issued, which is
    /// the writer's (no grant comes between a writer's and its release). `None` for
    /// readers and permits (the counter holds only the last of their tokens), for another
    /// library's lock, and once the counter expired (an hour after the ttl of the grant
    /// that set it).
    pub fence: Option<u64>,
}

/// One waiter in a key's queue on one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeWaiter {
    /// The waiter's token.
    pub token: String,
    /// Its place in the queue: the server's clock (µs) when it joined, or the ticket its
    /// client proposed to every server (Redlock: the client's clock, µs).
    pub ticket: u64,
}

impl NodeStatus {
    /// The status from the script's reply; `None` when the reply is not of its form.
    pub(crate) fn parse(raw: RawStatus) -> Option<Self> {
        let (kind, now, value, pttl, fence, members, queue) = raw;
        let now: u64 = now.parse().ok()?;
        let mut holders = Vec::new();
        match kind.as_str() {
            "string" => {
                let mode = token_mode(&value);
                holders.push(NodeHolder {
                    mode: mode.unwrap_or(Mode::Exclusive),
                    ttl_left: u64::try_from(pttl).ok().map(Duration::from_millis),
                    fence: fence.parse().ok().filter(|_| mode == Some(Mode::Exclusive)),
                    token: value,
                });
            }
            "zset" => {
                for pair in members.chunks_exact(2) {
                    let expires = micros(&pair[1])?;
                    holders.push(NodeHolder {
                        // A member that is not ours counts as a reader: it sits where
                        // readers do.
                        mode: token_mode(&pair[0]).unwrap_or(Mode::Shared),
                        ttl_left: Some(Duration::from_micros(expires.saturating_sub(now))),
                        fence: None,
                        token: pair[0].clone(),
                    });
                }
            }
            _ => {}
        }
        let waiters = queue
            .chunks_exact(2)
            .map(|pair| {
                Some(NodeWaiter {
                    token: pair[0].clone(),
                    ticket: micros(&pair[1])?,
                })
            })
            .collect::<Option<_>>()?;
        Some(Self { holders, waiters })
    }

    /// The key's status as this one server shows it.
    pub fn key_status(&self, key: &str) -> KeyStatus {
        let mut status = KeyStatus::new(key, true);
        status.holders = self.holders.iter().map(NodeHolder::status).collect();
        status.waiters = Some(self.waiters.iter().map(NodeWaiter::status).collect());
        status
    }
}

impl NodeHolder {
    /// The hold as [`KeyStatus`] shows it: mode, fencing token, ttl left, and who (the
    /// description its token carries).
    pub fn status(&self) -> HolderStatus {
        let mut holder = HolderStatus::new(self.mode);
        holder.fencing_token = self.fence;
        holder.ttl_left = self.ttl_left;
        holder.who = token_holder(&self.token).map(str::to_owned);
        holder
    }
}

impl NodeWaiter {
    /// The waiter as [`KeyStatus`] shows it: the mode and who its token says, and when it
    /// joined (its ticket).
    pub fn status(&self) -> WaiterStatus {
        let mut waiter = WaiterStatus::new();
        waiter.mode = token_mode(&self.token);
        waiter.since = UNIX_EPOCH.checked_add(Duration::from_micros(self.ticket));
        waiter.who = token_holder(&self.token).map(str::to_owned);
        waiter
    }
}

/// A score or clock reading in µs, as the scripts write it (an integer, possibly in a
/// float's notation).
fn micros(score: &str) -> Option<u64> {
    score.parse::<u64>().ok().or_else(|| {
        let float: f64 = score.parse().ok()?;
        // Scores are µs since the epoch: well inside f64's exact integers.
        (float.is_finite() && float >= 0.0).then_some(float as u64)
    })
}

impl Node {
    /// Who holds the lock `names` and who waits for it, read in one script call that
    /// changes nothing on the server.
    ///
    /// # Errors
    /// The server could not be reached, timed out, refused the script, or answered
    /// something else than the script's reply.
    pub async fn inspect(&self, names: &Names) -> Result<NodeStatus, Error> {
        Ok(self.inspect_hold(names).await?.0)
    }

    /// [`inspect`](Self::inspect), and the owner and count of an owner's hold of the key.
    pub(crate) async fn inspect_hold(
        &self,
        names: &Names,
    ) -> Result<(NodeStatus, Option<HoldCount>), Error> {
        let mut call = scripts::INSPECT.prepare_invoke();
        queue_keys(&mut call, names).key(&names.hold);
        let reply: redis::Value = self.invoke("inspect", &call).await?;
        let bad = || self.reply("inspect", &reply);
        let redis::Value::Array(parts) = &reply else {
            return Err(bad());
        };
        let (status, hold) = match parts.split_last() {
            Some((hold, status)) if parts.len() == 8 => (status, hold),
            _ => return Err(bad()),
        };
        let raw: RawStatus =
            redis::from_redis_value(redis::Value::Array(status.to_vec())).map_err(|_| bad())?;
        let hold: Vec<String> = redis::from_redis_value(hold.clone()).map_err(|_| bad())?;
        let hold = match hold.as_slice() {
            [owner, count] => Some(HoldCount {
                owner: owner.clone(),
                count: count.parse().map_err(|_| bad())?,
            }),
            _ => None,
        };
        let status = NodeStatus::parse(raw).ok_or_else(bad)?;
        Ok((status, hold))
    }

    /// The keys held on this server under the key prefix `namespace` whose key (the name
    /// without `namespace`) starts with `prefix`, sorted: a `SCAN` of the names matching
    /// `<namespace><prefix>*` (glob characters escaped), without the names no lock key can
    /// have (another lock's fence counter or queue, see [`Names::check`]), then one
    /// pipelined `TYPE` of what is left, keeping the strings (a writer's value, or
    /// another library's lock) and sorted sets (readers, permits).
    ///
    /// # Errors
    /// The server could not be reached or refused.
    pub async fn held_keys(&self, namespace: &str, prefix: &str) -> Result<Vec<String>, Error> {
        let found = self
            .keys_with_prefix(&format!("{namespace}{prefix}"))
            .await?;
        let mut candidates: Vec<String> = found
            .into_iter()
            .filter(|name| {
                name.strip_prefix(namespace)
                    .is_some_and(|key| !key.is_empty() && Names::check(namespace, key).is_ok())
            })
            .collect();
        candidates.sort_unstable();
        candidates.dedup();
        if candidates.is_empty() {
            return Ok(candidates);
        }
        let (id, mut conn) = self.connection().await?;
        let kinds: Vec<String> = if self.is_cluster() {
            // The names live on several masters: one `TYPE` each, routed by its key, all
            // in flight at once on the one connection.
            let conn = &conn;
            futures::future::try_join_all(candidates.iter().map(|name| async move {
                redis::cmd("TYPE")
                    .arg(name)
                    .query_async::<String>(&mut conn.clone())
                    .await
            }))
            .await
        } else {
            let mut types = redis::pipe();
            for name in &candidates {
                types.cmd("TYPE").arg(name);
            }
            types.query_async(&mut conn).await
        }
        .map_err(|e| self.failure("list", id, e))?;
        Ok(candidates
            .into_iter()
            .zip(kinds)
            .filter(|(_, kind)| kind == "string" || kind == "zset")
            .map(|(name, _)| name[namespace.len()..].to_owned())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scripts::{new_permit_token, new_reader_token, new_token};

    fn raw(kind: &str, value: &str, pttl: i64, fence: &str) -> RawStatus {
        (
            kind.into(),
            "1000000000".into(),
            value.into(),
            pttl,
            fence.into(),
            Vec::new(),
            Vec::new(),
        )
    }

    #[test]
    fn a_writer_shows_its_fence_ttl_and_holder() {
        let token = new_token();
        let status = NodeStatus::parse(raw("string", &token, 1500, "42")).unwrap();
        let holder = status.key_status("k").holders[0].clone();
        assert_eq!(holder.mode, Mode::Exclusive);
        assert_eq!(holder.fencing_token, Some(42));
        assert_eq!(holder.ttl_left, Some(Duration::from_millis(1500)));
        assert_eq!(
            holder.who.as_deref(),
            Some(dlock_core::holder_description())
        );
    }

    #[test]
    fn another_librarys_lock_shows_as_a_writer_without_token_or_name() {
        let status = NodeStatus::parse(raw("string", "their value", -1, "42")).unwrap();
        let holder = status.key_status("k").holders[0].clone();
        assert_eq!(holder.mode, Mode::Exclusive);
        assert_eq!(holder.fencing_token, None, "the counter is not theirs");
        assert_eq!(holder.ttl_left, None, "no expiry");
        assert_eq!(holder.who, None);
    }

    #[test]
    fn members_and_waiters_show_in_order() {
        let (reader, permit) = (new_reader_token(), new_permit_token(3));
        let mut raw = raw("zset", "", -2, "");
        raw.5 = vec![
            reader.clone(),
            "1000250000".into(),
            permit,
            "1.0005e9".into(),
        ];
        raw.6 = vec![new_token(), "999000000".into(), reader, "999500000".into()];
        let status = NodeStatus::parse(raw).unwrap().key_status("k");
        let modes: Vec<_> = status.holders.iter().map(|h| h.mode).collect();
        assert_eq!(modes, [Mode::Shared, Mode::Permits(3)]);
        assert_eq!(status.holders[0].ttl_left, Some(Duration::from_millis(250)));
        assert_eq!(status.holders[1].ttl_left, Some(Duration::from_millis(500)));
        let waiters = status.waiters.unwrap();
        let modes: Vec<_> = waiters.iter().map(|w| w.mode).collect();
        assert_eq!(modes, [Some(Mode::Exclusive), Some(Mode::Shared)]);
        assert_eq!(
            waiters[0].since,
            Some(UNIX_EPOCH + Duration::from_secs(999))
        );
    }

    #[test]
    fn a_free_key_shows_nobody() {
        let status = NodeStatus::parse(raw("none", "", -2, "")).unwrap();
        assert_eq!(status.key_status("k"), KeyStatus::new("k", true));
    }
}
